"""The user-state store against a real redis-server and a real 3-node Redis Cluster.

No server is mocked: `redis-server` and `redis-cli` must be installed (`make setup` installs
them); without them every test here fails saying so (RedisServerMissing), none is skipped.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from redis.cluster import RedisCluster

from phoenix.corpus_store import CorpusStore, Posts
from phoenix.feed_features import local_hour
from phoenix.user_state import keys
from phoenix.user_state.client import UserStateUnavailable, connect
from phoenix.user_state.events import Engagement, EventLimits, Follow, Post, Profile, Unfollow
from phoenix.user_state.history import encode
from phoenix.user_state.limits import DAY_S, UserStateLimits
from phoenix.user_state.profile import record_arrays, unpack
from phoenix.user_state.served import RECORD
from phoenix.user_state.server import RedisClusterNodes, RedisServer, RedisServerError
from phoenix.user_state.store import UserStateStore
from phoenix.user_state.stream import STREAM, StreamConsumer, StreamConsumerError, publish
from phoenix.util.processes import LOOPBACK, pick_free_ports

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(120)]

NOW = 1_700_000_000.0
SEQ_LEN = 16
SERVED = EventLimits(max_surface=15, max_dwell_seconds=float(np.finfo(np.float32).max))


@pytest.fixture(scope="module")
def single():
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def cluster():
    with RedisClusterNodes(3) as nodes:
        yield nodes


@pytest.fixture(params=["single", "cluster"])
def client(request):
    """A client of an empty single server or cluster."""
    server = request.getfixturevalue(request.param)
    client = connect(server.url, cluster=request.param == "cluster")
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()
    yield client
    client.close()


def store_of(client, **limits) -> UserStateStore:
    return UserStateStore(client, UserStateLimits(**limits))


def world(seed: int = 0, users: int = 40, authors: int = 12, events: int = 600) -> list:
    """Follows, posts and engagements (some negative) of a small random world."""
    rng = np.random.default_rng(seed)
    out: list = []
    for user in range(users):
        for author in rng.choice(authors, 4, replace=False) + 1:
            out.append(Follow(user, int(author), NOW - 5 * DAY_S + user))
    for i in range(events // 3):
        out.append(
            Post(10_000 + i, int(rng.integers(1, authors + 1)), NOW - rng.uniform(0, 3 * DAY_S))
        )
    names = [["favorite"], ["click", "dwell"], ["reply", "favorite"], ["not_interested"]]
    names.append(["report", "click"])
    for _ in range(events):
        out.append(
            Engagement.of(
                int(rng.integers(0, users)),
                int(rng.integers(1, 10**12)),
                int(rng.integers(1, authors + 1)),
                NOW - rng.uniform(0, 40 * DAY_S),
                names[int(rng.integers(0, len(names)))],
                surface=int(rng.integers(0, 5)),
                dwell_seconds=float(rng.uniform(0, 30)),
            )
        )
    return out


def state(client) -> dict:
    """Every user-state key -> its members and scores, or its value (the stream and TTLs left
    out)."""
    found = {k.decode() for k in client.scan_iter(match="*")}
    strings = (keys.SERVED, keys.PROFILE)
    return {
        k: client.get(k) if k.endswith(strings) else client.zrange(k, 0, -1, withscores=True)
        for k in sorted(found)
        if k.startswith(("u:", "a:"))
    }


def reads(store: UserStateStore, users) -> dict:
    """Every read of ``users``, as plain lists (comparable)."""
    histories = store.histories(users, NOW, SEQ_LEN)
    return {
        "ranking": [{k: v.tolist() for k, v in h.ranking.inputs().items()} for h in histories],
        "retrieval": [{k: v.tolist() for k, v in h.retrieval.inputs().items()} for h in histories],
        "follows": [f.tolist() for f in store.follows(users)],
        "served": [s.tolist() for s in store.served(users, NOW)],
        "in_network": [
            (p.post_ids.tolist(), p.author_ids.tolist(), p.created_at.tolist())
            for p in store.in_network(users, 3, 10, NOW)
        ],
    }


# -- writes ---------------------------------------------------------------------------------


def test_applying_the_same_events_twice_changes_nothing(client):
    store, events = store_of(client, history_cap=32), world()
    store.apply(events)
    store.mark_served(3, [5, 6], NOW)
    once = state(client)
    store.apply(events)
    store.apply(events[::-1][:50])  # a re-read of part of a batch, even out of order
    store.mark_served(3, [5, 6], NOW)
    assert state(client) == once
    assert any(k.endswith(":seq") for k in once) and any(k.endswith(":posts") for k in once)


def test_ranking_history_keeps_every_action_retrieval_only_positive(client):
    store = store_of(client)
    kinds = [["favorite"], ["report"], ["click", "dwell"], ["favorite", "mute_author"], ["reply"]]
    store.apply([Engagement.of(1, 100 + i, 7, NOW - 60 + i, a) for i, a in enumerate(kinds)])
    (histories,) = store.histories([1], NOW, SEQ_LEN)
    assert histories.ranking.post_ids.tolist() == [100, 101, 102, 103, 104]  # oldest first
    assert histories.retrieval.post_ids.tolist() == [100, 102, 104]
    assert histories.ranking.actions.shape == (5, 19)
    assert histories.ranking.actions[1, 17] == 1.0  # "report" is column 17
    assert histories.ranking.author_ids.tolist() == [7] * 5


def test_history_keeps_the_newest_cap_and_reads_the_newest_seq_len(client):
    store = store_of(client, history_cap=8)
    order = np.random.default_rng(1).permutation(20)  # arrival order is not time order
    store.apply([Engagement.of(1, 1000 + int(i), 7, NOW - 100 + int(i), ["click"]) for i in order])
    assert client.zcard(keys.user_key(1, keys.SEQUENCE)) == 8
    (histories,) = store.histories([1], NOW, 5)
    assert histories.ranking.post_ids.tolist() == [1015, 1016, 1017, 1018, 1019]
    assert np.all(np.diff(histories.ranking.times) > 0)
    with pytest.raises(ValueError, match="history_cap=8"):
        store.histories([1], NOW, 9)


def test_history_window_at_write_and_at_read(client):
    store = store_of(client, history_window_s=10 * DAY_S)
    old, recent = NOW - 9 * DAY_S, NOW - 1 * DAY_S
    store.apply(
        [Engagement.of(1, 1, 7, old, ["favorite"]), Engagement.of(1, 2, 7, recent, ["favorite"])]
    )
    (h,) = store.histories([1], NOW, SEQ_LEN)
    assert h.ranking.post_ids.tolist() == [1, 2]
    (h,) = store.histories([1], NOW + 2 * DAY_S, SEQ_LEN)  # post 1 is now 11 days old
    assert h.ranking.post_ids.tolist() == [2] and h.retrieval.post_ids.tolist() == [2]
    (h,) = store.histories([1], recent - 1, SEQ_LEN)  # nothing after the read time
    assert h.ranking.post_ids.tolist() == [1]
    store.apply([Engagement.of(1, 3, 7, NOW + 2 * DAY_S, ["click"])])  # trims post 1 on write
    assert client.zcard(keys.user_key(1, keys.SEQUENCE)) == 2
    assert 0 < client.ttl(keys.user_key(1, keys.SEQUENCE)) <= 10 * DAY_S
    assert 0 < client.ttl(keys.user_key(1, keys.POSITIVE)) <= 10 * DAY_S


def test_follows_cap_drops_the_oldest_and_unfollow_removes(client):
    store = store_of(client, follows_cap=3)
    store.apply([Follow(1, author, NOW + author) for author in range(1, 6)])
    assert store.follows([1])[0].tolist() == [5, 4, 3]
    store.apply([Unfollow(1, 4, NOW + 10)])
    assert store.follows([1, 2])[0].tolist() == [5, 3] and store.follows([2])[0].size == 0


def test_author_posts_cap_and_retention(client):
    store = store_of(client, author_posts_cap=4, author_posts_retention_s=2 * DAY_S)
    store.apply([Post(100 + i, 9, NOW - i * 3600) for i in range(6)])  # newest: 100
    assert client.zcard(keys.author_posts_key(9)) == 4
    assert 0 < client.ttl(keys.author_posts_key(9)) <= 2 * DAY_S
    (posts,) = store.author_posts([9], NOW, per_author_cap=10)
    assert [p for p, _ in posts] == [100, 101, 102, 103]
    (posts,) = store.author_posts([9], NOW + 2 * DAY_S - 3600 * 1.5, per_author_cap=10)
    assert [p for p, _ in posts] == [100, 101]  # 102 is past the retention then
    store.apply([Post(200, 9, NOW + 3 * DAY_S)])  # a write trims everything 2 days older
    assert client.zrange(keys.author_posts_key(9), 0, -1) == [b"200"]


def test_served_posts_expire_and_are_capped(client):
    store = store_of(client, served_ttl_s=3600, served_cap=5)
    store.mark_served(1, [1, 2, 3], NOW - 4000)
    store.mark_served(1, [4, 5], NOW - 100)
    assert store.served([1], NOW)[0].tolist() == [5, 4]  # 1..3 are over an hour old
    store.mark_served(1, [6, 7, 8, 9], NOW)
    assert sorted(store.served([1], NOW)[0].tolist()) == [5, 6, 7, 8, 9]
    assert client.strlen(keys.user_key(1, keys.SERVED)) == 9 * RECORD.itemsize  # < 2 x cap
    assert 0 < client.ttl(keys.user_key(1, keys.SERVED)) <= 3600
    store.mark_served(1, [10, 11], NOW)  # 11 records: past twice the cap, cut to the newest 5
    assert client.strlen(keys.user_key(1, keys.SERVED)) == 5 * RECORD.itemsize
    assert store.served([1], NOW)[0].tolist() == [11, 10, 9, 8, 7]


def test_served_posts_read_are_the_last_cap_records_written(client):
    # A read asks for the last served_cap records written (GETRANGE), the ones a cut-back
    # keeps: a post written before them is not read even when timed later (writers' clocks).
    store = store_of(client, served_ttl_s=3600, served_cap=5)
    store.mark_served(1, [20], NOW - 1)
    store.mark_served(1, [1, 2, 3, 4, 5], NOW - 10)
    assert client.strlen(keys.user_key(1, keys.SERVED)) == 6 * RECORD.itemsize  # all kept
    assert store.served([1], NOW)[0].tolist() == [5, 4, 3, 2, 1]
    store.mark_served(1, [6], NOW - 5)
    assert store.served([1], NOW)[0].tolist() == [6, 5, 4, 3, 2]
    assert store.served([2], NOW)[0].size == 0  # no key


def test_served_sorted_sets_of_before_are_migrated_with_their_ttl(client):
    from phoenix.user_state.served import migrate_sorted_sets

    store = store_of(client)
    old = "u:{1}:served"  # the sorted set of before 2026-11-26: decimal ids, seconds
    client.zadd(old, {b"41": NOW - 100, b"42": NOW - 50})
    client.expire(old, 3600)
    client.zadd("u:{2}:served", {b"7": NOW - 10})
    store.mark_served(2, [8], NOW)  # a user served since the upgrade keeps that too
    assert migrate_sorted_sets(client, DAY_S) == 2
    assert store.served([1, 2], NOW)[0].tolist() == [42, 41]
    assert store.served([1, 2], NOW)[1].tolist() == [8, 7]
    assert 3500 < client.ttl(keys.user_key(1, keys.SERVED)) <= 3600
    assert not client.exists(old) and not client.exists("u:{2}:served")
    assert migrate_sorted_sets(client, DAY_S) == 0  # again: nothing left to move


def test_one_write_of_more_members_than_one_zadd_takes_keeps_them_all(client):
    # ADD_CAPPED adds 500 members per ZADD (Lua's unpack limit): 1,201 follows go in three
    store = store_of(client)
    store.apply([Follow(1, author, NOW + author) for author in range(1, 1202)])
    assert store.follows([1])[0].tolist() == list(range(1201, 0, -1))  # newest first
    store.apply([Follow(1, author, NOW) for author in range(1, 1202)])  # older: ZADD GT
    assert client.zscore(keys.user_key(1, keys.FOLLOWS), "1201") == pytest.approx(NOW + 1201)


def test_served_posts_are_read_as_written_newest_first_and_a_repeated_write_adds_nothing(client):
    store = store_of(client, served_cap=10_000)
    store.mark_served(1, range(1, 4097), NOW - 60)
    store.mark_served(1, [9, 8], NOW)
    store.mark_served(1, [9, 8], NOW)  # a retried write
    assert store.served([1], NOW)[0].tolist() == [8, 9, *range(4096, 0, -1)]  # last written first
    assert client.strlen(keys.user_key(1, keys.SERVED)) == 4098 * RECORD.itemsize
    assert store.served([1], NOW - 61)[0].tolist() == []  # none served after the time asked


def test_request_log_is_capped_and_expires(client):
    store = store_of(client, request_log_cap=3, request_log_ttl_s=600)
    for i in range(5):
        store.log_request(1, f"r{i}", NOW - 900 + i * 100)
    assert client.zrange(keys.user_key(1, keys.REQUESTS), 0, -1) == [b"r2", b"r3", b"r4"]
    assert store.recent_requests([1], NOW) == [["r4", "r3"]]  # r2 is 700 s old by then
    assert 0 < client.ttl(keys.user_key(1, keys.REQUESTS)) <= 600


# -- in-network -----------------------------------------------------------------------------


def test_in_network_is_newest_first_within_both_caps(client):
    store = store_of(client, author_posts_retention_s=DAY_S)
    store.apply([Follow(1, a, NOW - DAY_S) for a in (10, 20, 30)] + [Follow(2, 20, NOW)])
    store.apply([Post(1000 + i, 10, NOW - i * 60) for i in range(5)])  # 1000 newest
    store.apply([Post(2000 + i, 20, NOW - 30 - i * 60) for i in range(5)])
    store.apply([Post(3000, 40, NOW - 1)])  # not followed
    store.apply([Post(3001, 30, NOW - 2 * DAY_S), Post(3002, 30, NOW + 60)])  # too old, future
    one, two = store.in_network([1, 2], per_author_cap=2, total_cap=3, now=NOW)
    assert one.post_ids.tolist() == [1000, 2000, 1001]
    assert one.author_ids.tolist() == [10, 20, 10]
    assert np.all(np.diff(one.created_at) <= 0)
    assert two.post_ids.tolist() == [2000, 2001]
    store.apply([Unfollow(1, 10, NOW)])
    (one,) = store.in_network([1], per_author_cap=2, total_cap=3, now=NOW)
    assert one.post_ids.tolist() == [2000, 2001]


# -- batches, slots ---------------------------------------------------------------------------


class PipelineCounter:
    """A client that counts pipeline executions and refuses any command outside a pipeline."""

    def __init__(self, client):
        self.client, self.executes = client, 0

    def pipeline(self, transaction=False):
        pipe = self.client.pipeline(transaction=transaction)
        execute = pipe.execute

        def counted(*args, **kwargs):
            self.executes += 1
            return execute(*args, **kwargs)

        pipe.execute = counted
        return pipe

    def __getattr__(self, name):
        raise AssertionError(f"the store sent {name} outside a pipeline")


def test_a_batch_read_answers_as_per_user_reads_in_one_round_trip(client):
    users = list(range(40)) + [999]  # 999 has no state at all
    store = store_of(client, history_cap=64)
    events = world(seed=2)
    store.apply(events)
    for user in users[::3]:
        store.mark_served(user, [user * 10 + 1, user * 10 + 2], NOW - 50)
    batch = reads(store, users)
    per_user = [reads(store, [u]) for u in users]
    for field, values in batch.items():
        assert values == [one[field][0] for one in per_user], field
    assert any(batch["ranking"][u]["history_post_ids"] for u in range(40))
    assert any(batch["in_network"][u][0] for u in range(40))

    counted = PipelineCounter(client)
    counting = UserStateStore(counted, store.limits, name="counted")
    counting.histories(users, NOW, SEQ_LEN)
    counting.follows(users)
    counting.served(users, NOW)
    assert counted.executes == 3
    counting.in_network(users, 3, 10, NOW)
    assert counted.executes == 5  # follows, then every followed author's posts
    counting.apply(events)
    assert counted.executes == 6


def test_state_answers_as_the_separate_reads_in_two_round_trips(client):
    users = list(range(40)) + [999]
    limits = UserStateLimits(history_cap=64, in_network_per_author=2, in_network_total=5)
    store = UserStateStore(client, limits)
    store.apply(world(seed=4))
    for user in users[::4]:
        store.mark_served(user, [user * 10 + 1], NOW - 50)
    counted = PipelineCounter(client)
    states = UserStateStore(counted, limits, name="counted").state(users, NOW, SEQ_LEN)
    assert counted.executes == 2  # histories, served and follows; then the authors' posts
    histories = store.histories(users, NOW, SEQ_LEN)
    served = store.served(users, NOW)
    in_network = store.in_network(users, 2, 5, NOW)
    for state, history, posts, network in zip(states, histories, served, in_network, strict=True):
        for kind in ("ranking", "retrieval"):
            mine, theirs = getattr(state.histories, kind), getattr(history, kind)
            for name, array in mine.inputs().items():
                np.testing.assert_array_equal(array, theirs.inputs()[name])
        np.testing.assert_array_equal(state.served, posts)
        np.testing.assert_array_equal(state.in_network.post_ids, network.post_ids)
        np.testing.assert_array_equal(state.in_network.author_ids, network.author_ids)
    assert any(len(s.in_network) == 5 for s in states)

    counted = PipelineCounter(client)
    UserStateStore(counted, limits, name="counted").state([999], NOW, SEQ_LEN)
    assert counted.executes == 1  # follows no one: no second round trip


def test_the_newest_profile_is_kept_whatever_the_order_and_read_with_the_state(client):
    older = Profile(5, NOW - 100, country=3, installed_apps=(1, 63), timezone=6)
    newer = Profile(5, NOW - 10, country=4, latitude=48.75, age_bracket=3, timezone=7)
    tie = Profile(5, NOW - 10, country=9)  # one time, other values: one of the two, always
    store = store_of(client)
    values = []
    for order in ([older, newer, tie], [tie, newer, older], [newer, older, tie, tie]):
        client_flush(client)
        counts = store.apply(order)
        assert counts.profiles == len(order) and counts.total == len(order)
        values.append(client.get(keys.user_key(5, keys.PROFILE)))
    assert values[0] == values[1] == values[2]
    (kept,) = store.profiles([5])
    assert kept in (newer, tie) and kept.ts == NOW - 10
    assert store.profiles([5, 6]) == [kept, None]
    assert client.ttl(keys.user_key(5, keys.PROFILE)) == -1  # kept for good, as follows
    states = store.state([5, 6], NOW, SEQ_LEN)  # the values, decoded where they are read
    assert [unpack(u, s.profile_record) for u, s in zip((5, 6), states)] == [kept, None]
    arrays = record_arrays([s.profile_record for s in states])
    assert arrays["country"].tolist() == [kept.country, 0]


def client_flush(client) -> None:
    if isinstance(client, RedisCluster):
        client.flushall(target_nodes=RedisCluster.PRIMARIES)
    else:
        client.flushall()


def test_history_items_keep_their_context_and_take_the_corpus_stores_semantic_ids(client, tmp_path):
    corpus = CorpusStore.create(tmp_path / "corpus", 4)
    codes = np.arange(1, 3 * 6 + 1, dtype=np.int32).reshape(3, 6)
    vectors = np.eye(4, dtype=np.float32)[:3]
    corpus.add(Posts(np.array([11, 12, 13]), np.array([7, 7, 7]), np.array([5, 5, 5]), vectors,
                     codes))  # fmt: skip
    lookup = corpus.open(searchable=False).semantic_ids
    store = UserStateStore(client, UserStateLimits(), semantic_ids=lookup)
    plain = Engagement.of(1, 11, 7, NOW - 30, ["favorite"])  # as events were before the context
    context = Engagement.of(1, 12, 7, NOW - 20, ["click"], timezone=14, post_created_at=NOW - 99)
    given = Engagement.of(1, 99, 7, NOW - 10, ["reply"], timezone=3, hour_of_day=2)
    store.apply([plain, context, given])
    members = client.zrange(keys.user_key(1, keys.SEQUENCE), 0, -1)
    assert sorted(len(m) for m in members) == [36, 46, 46] and encode(plain) in members
    (read,) = store.histories([1], NOW, SEQ_LEN)
    (state,) = store.state([1], NOW, SEQ_LEN)
    for history in (read.ranking, read.retrieval, state.histories.ranking):
        assert history.post_ids.tolist() == [11, 12, 99]
        assert history.timezone.tolist() == [0, 14, 3]
        assert history.creation_time.tolist() == [0, int(NOW - 99), 0]
        hours = [int(local_hour(NOW - 30, 0)), int(local_hour(NOW - 20, 14)), 2]
        assert history.hour_of_day.tolist() == hours
        assert history.semantic_ids.tolist() == [codes[0].tolist(), codes[1].tolist(), [0] * 6]
    bare = UserStateStore(client, UserStateLimits())  # no look-up: none known
    assert not bare.histories([1], NOW, SEQ_LEN)[0].ranking.semantic_ids.any()


def test_one_users_keys_share_a_slot_and_users_spread_over_the_nodes(cluster):
    client = connect(cluster.url, cluster=True)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    store = store_of(client)
    store.apply(world(seed=3))
    for user in range(40):
        slots = {client.keyslot(keys.user_key(user, kind)) for kind in keys.USER_KEY_KINDS}
        assert len(slots) == 1
        server_slot = client.execute_command("CLUSTER KEYSLOT", keys.user_key(user, keys.SEQUENCE))
        assert slots == {server_slot}
    per_node = [connect(node.url).dbsize() for node in cluster.nodes]  # each node alone
    assert sum(per_node) == len(state(client)) and min(per_node) > 0, per_node
    client.close()


# -- the stream -----------------------------------------------------------------------------


class ApplyThenCrash:
    """A store whose first ``apply`` writes everything and then fails (a crash before XACK)."""

    def __init__(self, store):
        self.store, self.name, self.crashed = store, store.name, False

    def apply(self, events):
        self.store.apply(events)
        if not self.crashed:
            self.crashed = True
            raise RuntimeError("crashed after applying")


def expected_state(client, events) -> dict:
    """The state of applying ``events`` once to an empty store (the store is emptied after)."""
    for key in state(client):
        client.delete(key)
    store_of(client).apply(events)
    applied = state(client)
    for key in applied:
        client.delete(key)
    return applied


def test_stream_consumer_applies_each_event_and_skips_bad_entries(client):
    events = world(seed=4, events=120)
    want = expected_state(client, events)
    publish(client, events[:100])
    client.xadd(STREAM, {"event": "{not json"})
    client.xadd(STREAM, {"other": "x"})
    publish(client, [Engagement.of(1, 2, 3, NOW, ["click"], surface=16)])  # past the models'
    publish(client, events[100:])
    consumer = StreamConsumer(client, store_of(client), consumer="c1", limits=SERVED,
                              batch_size=64)  # fmt: skip
    counts = consumer.drain()
    assert (counts.applied, counts.skipped) == (len(events), 3)
    assert state(client) == want
    assert client.xpending(STREAM, consumer.group)["pending"] == 0


@pytest.mark.parametrize("restarted_as", ["c1", "c2"])
def test_stream_restart_after_a_crash_loses_and_doubles_nothing(client, restarted_as):
    events = world(seed=5, events=90)
    want = expected_state(client, events)
    ids = publish(client, events)
    crashing = StreamConsumer(
        client, ApplyThenCrash(store_of(client)), consumer="c1", limits=SERVED, batch_size=25
    )
    with pytest.raises(StreamConsumerError) as error:
        crashing.drain()
    message = str(error.value)
    assert f"batch {ids[0]}..{ids[24]} (25 entries) not applied" in message
    assert f"stream {STREAM!r}" in message and "crashed after applying" in message
    assert client.xpending(STREAM, crashing.group)["pending"] == 25

    # the same consumer re-reads its pending batch; another one takes it over once idle
    restarted = StreamConsumer(client, store_of(client), consumer=restarted_as, limits=SERVED,
                               batch_size=25, claim_idle_ms=0)  # fmt: skip
    counts = restarted.drain()
    assert counts.applied == len(events)
    assert state(client) == want
    assert client.xpending(STREAM, restarted.group)["pending"] == 0


def test_stream_consumer_run_stops_when_asked(client):
    consumer = StreamConsumer(client, store_of(client), consumer="c1", limits=SERVED)
    stop = threading.Event()
    runner = threading.Thread(target=consumer.run, args=(stop, 50))
    runner.start()
    publish(client, [Follow(1, 2, NOW)])
    deadline = time.monotonic() + 5
    while not store_of(client).follows([1])[0].size and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    runner.join(5)
    assert not runner.is_alive()
    assert store_of(client).follows([1])[0].tolist() == [2]


# -- failures ---------------------------------------------------------------------------------


def assert_fails_fast(call, url: str, within_s: float) -> None:
    started = time.monotonic()
    with pytest.raises(UserStateUnavailable) as error:
        call()
    assert time.monotonic() - started < within_s
    assert url.split("//")[1].split("/")[0] in str(error.value)


def test_a_down_redis_raises_a_clear_error_quickly():
    (port,) = pick_free_ports(1)
    url = f"redis://{LOOPBACK}:{port}/0"
    store = UserStateStore(connect(url))
    assert_fails_fast(lambda: store.histories([1], NOW, SEQ_LEN), url, within_s=2)
    assert_fails_fast(lambda: store.apply([Follow(1, 2, NOW)]), url, within_s=2)
    assert_fails_fast(lambda: connect(url, cluster=True), url, within_s=2)


def test_a_redis_that_stops_answering_raises_within_the_socket_timeouts():
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind((LOOPBACK, 0))
        silent.listen(8)
        url = f"redis://{LOOPBACK}:{silent.getsockname()[1]}/0"
        store = UserStateStore(connect(url))
        assert_fails_fast(store.ping, url, within_s=4)


def test_a_server_keeps_its_folder_in_the_work_dir_given_and_removes_it_when_stopped(tmp_path):
    server = RedisServer(work_dir=tmp_path).start()
    try:
        assert server.dir.parent == tmp_path and server.log_path.is_file()
    finally:
        server.stop()
    assert list(tmp_path.iterdir()) == []


def test_a_server_starts_in_a_relative_work_dir(tmp_path, monkeypatch):
    # serve passes its --build-dir as given; redis-server enters --dir before it opens --logfile,
    # so a relative folder once made it exit ("Can't open the log file")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build").mkdir()
    with RedisServer(work_dir=Path("build")) as server:
        assert server.dir.is_absolute() and server.dir.parent == tmp_path / "build"
        assert server.log_path.is_file()


def test_a_server_that_cannot_start_says_why_with_its_command(tmp_path):
    with pytest.raises(RedisServerError) as error:
        RedisServer(work_dir=tmp_path, extra_args=("--no-such-option", "1")).start()
    message = str(error.value)
    assert "redis-server exited with code" in message
    assert "--no-such-option" in message  # the command it ran
    assert "no-such-option" in message.split("command:", 1)[1].split("\n", 1)[1]  # its output
    assert list(tmp_path.iterdir()) == []  # its folder removed


def test_a_redis_stopped_under_a_store_fails_its_next_call():
    server = RedisServer().start()
    store = UserStateStore(connect(server.url))
    store.apply([Follow(1, 2, NOW)])
    server.stop()
    assert_fails_fast(lambda: store.follows([1]), server.url if server.port else "", within_s=2)


def test_the_migration_command_moves_the_old_served_posts(capsys):
    from phoenix.user_state.served import main

    with RedisServer().start() as server:
        client = connect(server.url)
        client.zadd("u:{5}:served", {b"77": NOW})
        assert main(["migrate", server.url]) == 0
        assert "of 1 users moved" in capsys.readouterr().out
        assert UserStateStore(client).served([5], NOW)[0].tolist() == [77]
