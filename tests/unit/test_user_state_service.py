"""The user_state service against a real redis-server: histories by user id, the request's own
history passed on, cold start, served posts, in-network posts (one read of a batch's state, a
second of its followed authors' posts), a store that is down and comes back."""

import time

import numpy as np
import pytest

from phoenix.schema.contracts import LIMITS, USER_STATE
from phoenix.schema.requests import InputError
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings
from phoenix.stub.services.user_state import USER_STATE_URL_ENV, UserStateService
from phoenix.user_state import (
    Engagement,
    Follow,
    Post,
    UserStateLimits,
    UserStateStore,
    UserStateUnavailable,
    connect,
)
from phoenix.user_state.server import RedisServer

NOW = time.time()


def service(tiny_artifacts, url: str, max_batch: int = 8) -> UserStateService:
    texts = USER_STATE.parameter_texts({"user_state_url": url})  # the rest: defaults
    return build_service(ServiceSettings.parsed("user_state", tiny_artifacts, max_batch, texts))


def engagements(user: int, count: int, negative_every: int = 3) -> list[Engagement]:
    """``count`` engagements of ``user``, one a minute up to a minute ago; every
    ``negative_every``-th one negative (ranking history only)."""
    events = []
    for i in range(count):
        negative = i % negative_every == negative_every - 1
        actions = ["not_interested"] if negative else ["favorite", "dwell"]
        ts = NOW - 60 * (count - i)
        events.append(Engagement.of(user, 1000 + i, 50 + i % 7, ts, actions, surface=i % 2,
                                    dwell_seconds=float(i)))  # fmt: skip
    return events


def by_id(*users: int) -> dict:
    return {"user_id": np.array(users, np.int64)[:, None]}


def test_by_id_reads_both_histories_capped_newest_last_and_served(tiny_artifacts, redis_server):
    svc = service(tiny_artifacts, redis_server.url)
    seq_len = svc.seq_len
    store = UserStateStore(connect(redis_server.url))
    events = engagements(7, seq_len + 5)
    store.apply(events)
    store.mark_served(7, [5, 6], NOW - 10)
    store.mark_served(7, [9], NOW - 5)

    (out,) = svc.handle([by_id(7)])

    newest = events[-seq_len:]  # the newest seq_len, oldest first
    assert out["history_post_ids"].tolist() == [[e.post_id for e in newest]]
    assert out["history_author_ids"].tolist() == [[e.author_id for e in newest]]
    assert out["history_dwell_seconds"][0].tolist() == [e.dwell_seconds for e in newest]
    assert out["history_actions"].shape == (1, seq_len, svc.config.num_actions)
    positive = [e.post_id for i, e in enumerate(events) if i % 3 != 2][-seq_len:]
    assert out["retrieval_history_post_ids"].tolist() == [positive]
    assert out["served_post_ids"].tolist() == [[9, 6, 5]]  # newest first (ties: written last)


def test_a_hot_users_served_posts_and_history_fit_the_retrievers_exclusion_list(
    tiny_artifacts, redis_server
):
    """Found under Locust's Zipf traffic: a user served served_cap posts plus a history
    overflowed the retriever's 4,096 excluded posts a row and failed its batch."""
    svc = service(tiny_artifacts, redis_server.url)
    store = UserStateStore(connect(redis_server.url))
    store.apply(engagements(21, svc.seq_len))
    cap = UserStateLimits().served_cap
    store.mark_served(21, range(10**6, 10**6 + cap), NOW - 20)  # the oldest served
    store.mark_served(21, [77, 78], NOW - 5)

    (out,) = svc.handle([by_id(21)])

    history, served = out["history_post_ids"][0], out["served_post_ids"][0]
    assert len(history) == svc.seq_len
    assert len(history) + len(served) == LIMITS.max_filter_ids
    assert served[:2].tolist() == [78, 77]  # the newest kept, the oldest cut


def test_unknown_user_gets_empty_histories(tiny_artifacts, redis_server):
    svc = service(tiny_artifacts, redis_server.url)
    (out,) = svc.handle([by_id(424242)])
    assert out["history_post_ids"].shape == (1, 0)
    assert out["history_actions"].shape == (1, 0, svc.config.num_actions)
    assert out["retrieval_history_actions"].shape == (1, 0, svc.config.num_actions)
    assert out["served_post_ids"].shape == (1, 0)
    assert out["in_network_post_ids"].shape == (1, 0)


class CountedPipelines:
    """Counts the pipelines a store client executes (each one round trip to a server)."""

    def __init__(self, client):
        self.client, self.executed = client, []

    def pipeline(self, transaction=False):
        pipe = self.client.pipeline(transaction=transaction)
        execute = pipe.execute

        def counted(*args, **kwargs):
            self.executed.append(len(pipe.command_stack))
            return execute(*args, **kwargs)

        pipe.execute = counted
        return pipe


def counted_service(tiny_artifacts, url: str) -> tuple[UserStateService, CountedPipelines]:
    svc = service(tiny_artifacts, url)
    counted = CountedPipelines(connect(url))
    svc.store = UserStateStore(counted, svc.store.limits, name=url)
    return svc, counted


def test_rows_of_one_request_are_right_padded_and_a_batch_is_one_read(tiny_artifacts, redis_server):
    svc, counted = counted_service(tiny_artifacts, redis_server.url)
    store = UserStateStore(connect(redis_server.url))
    store.apply(engagements(1, 4) + engagements(2, 2))

    two_rows, one_row = svc.handle([by_id(1, 2), by_id(2)])

    # every by-id row of the batch in one pipeline: 2 histories, served, follows, profile per
    # row; nobody follows anyone, so no author is read
    assert counted.executed == [5 * 3]
    assert two_rows["history_post_ids"].tolist() == [[1000, 1001, 1002, 1003], [1000, 1001, 0, 0]]
    assert one_row["history_post_ids"].tolist() == [[1000, 1001]]
    assert two_rows["in_network_post_ids"].shape == (2, 0)


def test_in_network_posts_of_followed_authors_newest_first_capped(tiny_artifacts, redis_server):
    svc, counted = counted_service(tiny_artifacts, redis_server.url)
    limits = svc.store.limits
    store = UserStateStore(connect(redis_server.url))
    store.apply([Follow(1, 70, NOW - 500), Follow(1, 80, NOW - 400), Follow(2, 80, NOW - 300)])
    many = limits.in_network_per_author + 2
    store.apply(Post(7000 + i, 70, NOW - 100 - i) for i in range(many))  # 7000 newest
    store.apply([Post(8000, 80, NOW - 50), Post(9000, 90, NOW - 10)])  # 90: not followed
    store.apply([Post(8001, 80, NOW - limits.author_posts_retention_s - 1)])  # too old
    store.apply(engagements(1, 2))

    (two_rows,) = svc.handle([by_id(1, 2)])

    assert counted.executed == [5 * 2, 2]  # then the two followed authors' posts, each once
    per_author = [7000 + i for i in range(limits.in_network_per_author)]
    assert two_rows["in_network_post_ids"].tolist() == [
        [8000, *per_author],
        [8000] + [0] * limits.in_network_per_author,
    ]
    assert two_rows["in_network_author_ids"][0].tolist() == [80] + [70] * len(per_author)
    assert two_rows["history_post_ids"].tolist() == [[1000, 1001], [0, 0]]


def test_in_network_posts_are_capped_in_all(tiny_artifacts, redis_server):
    svc = service(tiny_artifacts, redis_server.url)
    total = svc.store.limits.in_network_total
    store = UserStateStore(connect(redis_server.url))
    authors = range(100, 100 + total + 5)  # one post each: more authors than the cap
    store.apply(Follow(3, a, NOW - 1000) for a in authors)
    store.apply(Post(10 * a, a, NOW - a) for a in authors)  # the smaller author, the newer
    (out,) = svc.handle([by_id(3)])
    assert out["in_network_post_ids"][0].tolist() == [10 * a for a in authors][:total]


def own_history(user: int = 3, length: int = 2, actions: int = 19) -> dict:
    return {
        **by_id(user),
        "history_post_ids": np.arange(11, 11 + length, dtype=np.int64)[None],
        "history_author_ids": np.full((1, length), 4, np.int64),
        "history_actions": np.ones((1, length, actions), np.float32),
        "history_product_surface": np.zeros((1, length), np.int32),
    }


def test_own_history_wins_and_needs_no_store(tiny_artifacts):
    svc = service(tiny_artifacts, "redis://127.0.0.1:1/0")  # nothing listens there
    sent = own_history(actions=svc.config.num_actions)
    (out,) = svc.handle([sent])
    for name, array in sent.items():
        if name != "user_id":
            np.testing.assert_array_equal(out[name], array)
            np.testing.assert_array_equal(out["retrieval_" + name], array)
    assert out["history_dwell_seconds"].tolist() == [[0.0, 0.0]]
    assert out["served_post_ids"].shape == (1, 0)
    assert out["in_network_post_ids"].shape == out["in_network_author_ids"].shape == (1, 0)


def test_a_partial_history_is_refused(tiny_artifacts):
    svc = service(tiny_artifacts, "")
    sent = own_history(actions=svc.config.num_actions)
    del sent["history_actions"]
    (result,) = svc.handle([sent])
    assert isinstance(result, InputError) and "history_actions" in str(result)


def test_no_store_configured_fails_by_id_requests_only(tiny_artifacts, monkeypatch):
    monkeypatch.delenv(USER_STATE_URL_ENV, raising=False)
    svc = service(tiny_artifacts, "")
    refused, served = svc.handle([by_id(3), own_history(actions=svc.config.num_actions)])
    assert isinstance(refused, UserStateUnavailable) and USER_STATE_URL_ENV in str(refused)
    assert served["history_post_ids"].shape == (1, 2)


def test_the_url_comes_from_the_environment_when_the_parameter_is_empty(
    tiny_artifacts, redis_server, monkeypatch
):
    monkeypatch.setenv(USER_STATE_URL_ENV, redis_server.url)
    UserStateStore(connect(redis_server.url)).apply(engagements(5, 1))
    (out,) = service(tiny_artifacts, "").handle([by_id(5)])
    assert out["history_post_ids"].tolist() == [[1000]]


def test_store_down_fails_fast_naming_it_then_recovers_without_restart(tiny_artifacts):
    server = RedisServer().start()
    try:
        port, url = server.port, server.url
        svc = service(tiny_artifacts, url)
        UserStateStore(connect(url)).apply(engagements(8, 2))
        assert svc.handle([by_id(8)])[0]["history_post_ids"].shape == (1, 2)
        server.stop()

        started = time.monotonic()
        refused, served = svc.handle([by_id(8), own_history(actions=svc.config.num_actions)])
        took = time.monotonic() - started
        assert isinstance(refused, UserStateUnavailable), refused
        assert f"127.0.0.1:{port}" in str(refused)
        assert took < 3.0, f"a down store took {took:.1f} s to fail"
        assert served["history_post_ids"].shape == (1, 2)

        server = RedisServer(port=port).start()  # empty again: no persistence
        UserStateStore(connect(url)).apply(engagements(8, 3))
        (out,) = svc.handle([by_id(8)])
        assert out["history_post_ids"].shape == (1, 3)
    finally:
        server.stop()


def test_serve_starts_a_store_unless_given_one_and_checks_it_bounded(tmp_path):
    from phoenix.user_state.embedded import serve_store
    from phoenix.user_state.store import reachability_check

    with serve_store("redis://elsewhere:6379/0", tmp_path / "store") as named:
        assert named.url == "redis://elsewhere:6379/0" and named.named  # nothing started
    with serve_store(None, tmp_path / "store") as started_store:
        url = started_store.url
        unreachable = reachability_check(url)
        assert unreachable() is None
        connect(url).set("k", "v")
    started = time.monotonic()
    reason = unreachable()  # the child stopped with the context
    assert reason is not None and url.split("/")[2] in reason
    assert time.monotonic() - started < 3.0


def test_serve_takes_a_server_or_cluster_url_from_redis_or_the_environment(monkeypatch, capsys):
    from phoenix.ops.serve import build_parser

    for url in ("redis://h:1/0", "rediss://:pw@h:1/2", "redis+cluster://h:7000"):
        assert build_parser().parse_args(["--redis", url]).redis == url
    monkeypatch.delenv(USER_STATE_URL_ENV, raising=False)
    assert build_parser().parse_args([]).redis is None  # serve starts a local one
    monkeypatch.setenv(USER_STATE_URL_ENV, "redis+cluster://redis-cluster:6379")
    assert build_parser().parse_args([]).redis == "redis+cluster://redis-cluster:6379"
    for bad, why in (
        ("http://h:1", "is not a Redis URL: expected redis://"),
        ("redis+cluster://h:1/3", "database 0 only"),
        ("redis+cluster://h:1,g:2", "names one node"),
    ):
        with pytest.raises(SystemExit) as refused:
            build_parser().parse_args(["--redis", bad])
        assert refused.value.code == 2
        assert why in capsys.readouterr().err


def test_ready_stays_ready_and_names_the_store_while_it_is_down(redis_server):
    """A real redis-server stopped and restarted under serve's check on the real /ready
    endpoint: 200 throughout (own-history requests are still served), `degraded` naming the
    store while it is down and empty again once it is back."""
    from phoenix.ops.supervisor.endpoints import ReadinessServer
    from phoenix.user_state.store import reachability_check
    from tests.unit.test_supervisor import FakeAdmin, FakeProcesses, http_get, make_supervisor

    processes = FakeProcesses()
    supervisor = make_supervisor(
        FakeAdmin(processes), processes, degraded_by=[reachability_check(redis_server.url)]
    )
    endpoint = ReadinessServer(supervisor, "127.0.0.1", 0).start()
    back = RedisServer(port=redis_server.port)  # the same store, started again

    def ready() -> tuple[int, dict]:
        return http_get(f"http://127.0.0.1:{endpoint.port}/ready")

    try:
        supervisor.start()
        assert ready() == (200, {"ready": True, "reasons": [], "degraded": []})
        port = redis_server.port
        redis_server.stop()
        code, answer = ready()
        assert code == 200 and answer["ready"] is True, answer
        [why] = answer["degraded"]
        assert f"127.0.0.1:{port}" in why and "unavailable" in why, why
        back.start()
        assert ready() == (200, {"ready": True, "reasons": [], "degraded": []})
    finally:
        supervisor.stop()
        endpoint.stop()
        back.stop()


def test_stored_items_the_model_would_refuse_are_left_out_the_others_kept(
    tiny_artifacts, redis_server
):
    """An item stored before the event path checked it, or for artifacts of more product
    surfaces, never reaches the model: recommend's chain checks what this stage hands on no
    more. The user's other items stay."""
    svc = service(tiny_artifacts, redis_server.url)
    store = UserStateStore(connect(redis_server.url))
    good = engagements(31, 4)
    too_wide = svc.config.product_surface_vocab_size  # one past the largest surface
    odd = Engagement.of(31, 2000, 9, NOW - 30, ["favorite"], surface=too_wide)
    store.apply([*good, odd])
    (out,) = svc.handle([by_id(31)])
    assert out["history_post_ids"][0].tolist() == [e.post_id for e in good]
    assert out["history_product_surface"].max() < too_wide
