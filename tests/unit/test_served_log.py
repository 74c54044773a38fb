"""The served_log step against a real redis-server: the feed marked served, the request log
complete and bounded, a store that is down never failing the feed; the log as training rows
that phoenix.training's reader loads."""

import dataclasses
import time

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.schema.contracts import SERVED_LOG
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings
from phoenix.stub.services.served_log import ServedLogService
from phoenix.user_state import Engagement, UserStateLimits, UserStateStore, connect
from phoenix.user_state.keys import REQUEST_LOG_STREAM
from phoenix.user_state.request_log import RequestRecord, read_request_log

NOW = time.time()


def service(tiny_artifacts, url: str) -> ServedLogService:
    texts = SERVED_LOG.parameter_texts({"user_state_url": url})  # the rest: defaults
    return build_service(ServiceSettings.parsed("served_log", tiny_artifacts, 8, texts))


def step_inputs(users, num_actions: int, own_history: bool = False, shown=(31, 32, 0)) -> dict:
    """What the ensemble hands served_log for ``users``: a 2-item history (the second user's
    padded), 4 candidates, a feed of ``shown`` (0: padding)."""
    rows = len(users)
    actions = np.zeros((rows, 2, num_actions), np.float32)
    actions[:, 0, 0] = actions[:, 1, 2] = 1  # bits 0b001, 0b100
    arrays = {
        "user_id": np.array(users, np.int64)[:, None],
        "history_post_ids": np.array([[11, 12]] + [[13, 0]] * (rows - 1), np.int64),
        "history_author_ids": np.array([[5, 6]] + [[7, 0]] * (rows - 1), np.int64),
        "history_actions": actions,
        "history_product_surface": np.array([[0, 1]] * rows, np.int32),
        "history_dwell_seconds": np.array([[2.5, 0.0]] * rows, np.float32),
        "candidate_post_ids": np.array([[31, 32, 33, 34]] * rows, np.int64),
        "candidate_author_ids": np.array([[41, 42, 43, 44]] * rows, np.int64),
        "candidate_retrieval_scores": np.array([[0.9, 0.8, 0.7, 0.6]] * rows, np.float32),
        "ranked_post_ids": np.array([shown] * rows, np.int64),
        "ranked_author_ids": np.array([[41, 42, 0][: len(shown)]] * rows, np.int64),
        "scores": np.array([[3.0, 2.0, 0.0][: len(shown)]] * rows, np.float32),
        "retrieval_scores": np.array([[0.9, 0.8, 0.0][: len(shown)]] * rows, np.float32),
        "action_probs": np.full((rows, len(shown), num_actions), 0.25, np.float32),
        "in_network": np.array([[1, 0, 0][: len(shown)]] * rows, np.int8),
        "filtered_counts": np.array([[0, 1, 0, 2, 0]] * rows, np.int32),
    }
    if own_history:
        arrays["sent_history_post_ids"] = arrays["history_post_ids"]
    return arrays


def test_a_by_id_feed_is_marked_served_and_logged_completely(tiny_artifacts, redis_server):
    svc = service(tiny_artifacts, redis_server.url)
    num_actions = svc.config.num_actions
    (out,) = svc.handle([step_inputs([7, 8], num_actions)])

    ids = out["request_id"][:, 0].tolist()
    assert out["request_id"].shape == (2, 1) and len(set(ids)) == 2 and min(ids) > 0
    assert list(out) == ["request_id"]  # the feed is recommend's chain's to answer, not copied
    store = UserStateStore(connect(redis_server.url))
    assert [s.tolist() for s in store.served([7, 8], time.time())] == [[32, 31], [32, 31]]
    assert store.recent_requests([7], time.time()) == [[str(ids[0])]]

    entries = list(read_request_log(connect(redis_server.url)))
    assert [r.request_id for _, r in entries] == ids
    first, second = entries[0][1], entries[1][1]
    assert (first.user_id, first.own_history, first.num_actions) == (7, False, num_actions)
    assert abs(first.ts - time.time()) < 60
    assert first.history_post_ids.tolist() == [11, 12]
    assert first.history_author_ids.tolist() == [5, 6]
    assert first.history_actions.tolist() == [0b001, 0b100]
    assert first.history_product_surface.tolist() == [0, 1]
    assert first.history_dwell_seconds.tolist() == [2.5, 0.0]
    assert second.history_post_ids.tolist() == [13]  # padding left out
    assert first.candidate_post_ids.tolist() == [31, 32, 33, 34]
    assert first.candidate_author_ids.tolist() == [41, 42, 43, 44]
    assert first.candidate_retrieval_scores.tolist() == pytest.approx([0.9, 0.8, 0.7, 0.6])
    assert first.ranked_post_ids.tolist() == [31, 32]  # the feed, in order, no padding
    assert first.ranked_author_ids.tolist() == [41, 42]
    assert first.scores.tolist() == [3.0, 2.0]
    assert first.retrieval_scores.tolist() == pytest.approx([0.9, 0.8])
    assert first.action_probs.shape == (2, num_actions)
    assert first.in_network.tolist() == [1, 0]  # which source each shown post came from
    assert (
        RequestRecord.from_fields({k.encode(): _bytes(v) for k, v in first.fields().items()})
        == first
    )


def _bytes(value) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def test_an_own_history_feed_is_logged_but_marks_nothing_served(tiny_artifacts, redis_server):
    svc = service(tiny_artifacts, redis_server.url)
    (out,) = svc.handle([step_inputs([9], svc.config.num_actions, own_history=True)])
    store = UserStateStore(connect(redis_server.url))
    assert store.served([9], time.time())[0].tolist() == []
    assert store.recent_requests([9], time.time()) == [[]]
    ((_, record),) = read_request_log(connect(redis_server.url))
    assert record.own_history and record.request_id == int(out["request_id"][0, 0])


def test_a_store_down_or_unset_loses_the_write_never_the_feed(tiny_artifacts, redis_server):
    url = redis_server.url
    down = service(tiny_artifacts, url)
    redis_server.stop()
    started = time.monotonic()
    (out,) = down.handle([step_inputs([7], down.config.num_actions)])
    assert time.monotonic() - started < 3.0  # the client's bounded timeouts
    assert out["request_id"][0, 0] > 0 and down.unlogged_rows == 1

    unset = service(tiny_artifacts, "")
    (out,) = unset.handle([step_inputs([7], unset.config.num_actions)])
    assert out["request_id"][0, 0] > 0 and unset.unlogged_rows == 1


def test_the_log_keeps_the_newest_cap_entries_within_the_window(tiny_artifacts, redis_server):
    limits = dataclasses.replace(UserStateLimits(), request_stream_cap=50)
    store = UserStateStore(connect(redis_server.url), limits)
    svc = ServedLogService(service(tiny_artifacts, "").config, store, max_batch_size=8)
    inputs = step_inputs([1, 2, 3, 4], svc.config.num_actions)
    answered = [svc.handle([inputs])[0]["request_id"][:, 0] for _ in range(20)]  # 80 rows
    client = connect(redis_server.url)
    kept = [r.request_id for _, r in read_request_log(client)]
    assert client.xlen(REQUEST_LOG_STREAM) == 50
    assert kept == np.concatenate(answered)[-50:].tolist()  # the newest, oldest first
    # paging resumes after the last id read
    first_page = list(read_request_log(client, count=20))
    rest = list(read_request_log(client, after=first_page[-1][0]))
    assert [r.request_id for _, r in first_page + rest] == kept

    # a write a window later drops everything older, itself included (its id is Redis's time,
    # the window is measured from the step's clock)
    svc.clock = lambda: time.time() + limits.request_log_ttl_s + 60
    svc.handle([inputs])
    assert client.xlen(REQUEST_LOG_STREAM) == 0


def test_logged_feeds_become_impressions_that_the_training_reader_loads(tmp_path):
    from phoenix.training.presets import PRESETS
    from phoenix.training.served_logs import FEED_SURFACE, impression_rows
    from phoenix.world import logs, synthetic

    spec = dataclasses.replace(PRESETS["tiny"].world, num_users=20, num_posts=200)
    world, impressions = synthetic.generate_logs(spec, seed=1)
    logs.save_logs(tmp_path, world, impressions, seed=1)
    user = int(world.user_ids[3])
    posts = world.post_ids[:3]
    authors = world.author_ids[world.post_author[:3]]
    record = RequestRecord(
        request_id=123, user_id=user, ts=NOW, own_history=False, num_actions=19,
        history_post_ids=np.zeros(0, np.int64), history_author_ids=np.zeros(0, np.int64),
        history_actions=np.zeros(0, np.uint32), history_product_surface=np.zeros(0, np.int32),
        history_dwell_seconds=np.zeros(0, np.float32), candidate_post_ids=posts,
        candidate_author_ids=authors, candidate_retrieval_scores=np.ones(3, np.float32),
        ranked_post_ids=posts, ranked_author_ids=authors, scores=np.ones(3, np.float32),
        retrieval_scores=np.ones(3, np.float32), action_probs=np.zeros((3, 19), np.float32),
        in_network=np.array([1, 0, 0], np.int8),
    )  # fmt: skip
    engaged = [
        Engagement.of(
            user, int(posts[0]), int(authors[0]), NOW + 5, ["favorite"], dwell_seconds=9.0
        ),
        Engagement.of(user, int(posts[0]), int(authors[0]), NOW + 7, ["reply"]),
        Engagement.of(user, int(posts[1]), int(authors[1]), NOW + 4000, ["favorite"]),  # too late
        Engagement.of(
            user + 1, int(posts[2]), int(authors[2]), NOW + 5, ["favorite"]
        ),  # another user
    ]
    rows = impression_rows([record], engaged, window_s=3600)

    assert rows["post_id"].tolist() == posts.tolist()
    assert rows["request_id"].tolist() == [123] * 3
    assert rows["impression_ts"].tolist() == [int(NOW)] * 3
    assert rows["product_surface"].tolist() == [FEED_SURFACE] * 3
    names = list(ACTION_NAMES)
    assert [names[i] for i in np.flatnonzero(rows["actions"][0])] == ["favorite", "reply"]
    assert rows["dwell_seconds"].tolist() == [9.0, 0.0, 0.0]
    assert rows["actions"][1:].sum() == 0  # shown, not engaged within the window: all 0

    np.savez(tmp_path / "impressions.npz", **rows)
    _, read, _ = logs.load_logs(tmp_path)
    assert len(read) == 3 and read.request.tolist() == [123] * 3
    assert world.post_ids[read.post].tolist() == posts.tolist()
    assert read.actions[:, names.index("favorite")].tolist() == [1, 0, 0]
