"""The next version from served traffic, whole: served feeds and engagements written through
phoenix.user_state into a real redis-server -> the served-logs export -> pipeline --init ->
gate.json (the pure parts of each step: tests/unit/test_served_retrain.py)."""

import dataclasses
import json
import time

import numpy as np
import pytest

from phoenix import checkpoint
from phoenix.checkpoint.tower import candidate_tower_digest
from phoenix.training.cli import main
from phoenix.training.gate import GateRule
from phoenix.training.presets import PRESETS
from phoenix.training.retrain import RetrainError, retrain
from phoenix.user_state import UserStateStore, connect
from phoenix.user_state.request_log import RequestRecord
from phoenix.user_state.server import RedisServer
from phoenix.world.logs import load_logs
from phoenix.world.simulate import SimulatedUser, WorldClock, draw_user_ids


@pytest.fixture
def redis_server():
    """An empty redis-server of this test's own, stopped after it."""
    with RedisServer() as server:
        yield server


# -- served traffic in a real redis-server -> export -> next version -> gate --------------

FEED = 8  # posts per served feed
REQUESTS_PER_USER = 6
SPAN_S = 120.0  # the served requests' time range


@pytest.fixture(scope="module")
def served_tiny(tmp_path_factory):
    """The served version 1: the tiny preset's towers at their initial weights, written as
    the pipeline writes trained ones (a training.json naming the world; no training steps,
    whose compiling would double the test's time)."""
    from phoenix.training import pipeline
    from phoenix.training.data import LogIndex
    from phoenix.training.train import init_params
    from phoenix.world import synthetic

    preset = PRESETS["tiny"]
    world, impressions = synthetic.generate_logs(preset.world, 0)
    config = preset.config(0)
    index = LogIndex(world, impressions, config)
    eval_set = index.eval_set(50, 16, 0)
    params = init_params(config, 0)
    corpus = pipeline.build_corpus(index, config, params)
    out = tmp_path_factory.mktemp("served") / "v1"
    partial, _ = pipeline.write_artifact_files(out, config, params, corpus, index, eval_set)
    summary = {"preset": "tiny", "seed": 0, "world": dataclasses.asdict(preset.world)}
    pipeline.finish_artifact_dir(partial, summary)
    return out


def serve_and_react(store: UserStateStore, artifacts, start: float) -> int:
    """Feeds of corpus posts to 40 world users over SPAN_S, logged as the served_log step
    logs them, and the users' reactions (the world's model) applied as the event path does."""
    from phoenix.world.trained import trained_world

    world = trained_world(artifacts)
    corpus = checkpoint.load_corpus(artifacts)
    authors = dict(zip(corpus.post_ids.tolist(), corpus.author_ids.tolist()))
    users = draw_user_ids(world, 40, seed=3)
    rng = np.random.default_rng(3)
    clock = WorldClock.after_logs(world, start)
    shown = 0
    for i in range(REQUESTS_PER_USER):
        for k, user_id in enumerate(users.tolist()):
            now = start + SPAN_S * (i * len(users) + k) / (REQUESTS_PER_USER * len(users))
            posts = rng.choice(corpus.post_ids, FEED, replace=False)
            record = feed_record(int(user_id), posts, authors, now, request_id=1 + shown)
            store.record_served([(int(user_id), posts, str(record.request_id))], now, [record])
            reaction = SimulatedUser(world, int(user_id), 3, clock).react(posts, top_n=FEED,
                                                                         now=now + 1.0)  # fmt: skip
            store.apply(reaction.events)
            shown += 1
    return shown


def feed_record(user_id: int, posts, authors: dict, now: float, request_id: int):
    empty = np.zeros(0)
    return RequestRecord(
        request_id=request_id, user_id=user_id, ts=now, own_history=False, num_actions=19,
        history_post_ids=empty.astype(np.int64), history_author_ids=empty.astype(np.int64),
        history_actions=empty.astype(np.uint32), history_product_surface=empty.astype(np.int32),
        history_dwell_seconds=empty.astype(np.float32), candidate_post_ids=posts,
        candidate_author_ids=np.array([authors[p] for p in posts.tolist()]),
        candidate_retrieval_scores=np.ones(len(posts), np.float32), ranked_post_ids=posts,
        ranked_author_ids=np.array([authors[p] for p in posts.tolist()]),
        scores=np.ones(len(posts), np.float32), retrieval_scores=np.ones(len(posts), np.float32),
        action_probs=np.zeros((len(posts), 19), np.float32),
        in_network=np.zeros(len(posts), np.int8),
    )  # fmt: skip


def test_served_logs_train_the_next_version_and_gate_it(served_tiny, redis_server, tmp_path):
    store = UserStateStore(connect(redis_server.url))
    start = time.time() - SPAN_S - 10
    requests = serve_and_react(store, served_tiny, start)
    logs, new = tmp_path / "served-logs", tmp_path / "v2"

    assert main(["served-logs", "--redis", redis_server.url, "--artifacts", str(served_tiny),
                 "--out", str(logs), "--held-out-fraction", "0.3"]) == 0  # fmt: skip
    world, imp, meta = load_logs(logs)
    served = imp.ts >= meta["train_from_ts"]
    assert served.sum() == requests * FEED  # every shown post one row, none dropped
    assert len(np.unique(imp.request[served])) == requests
    assert meta["train_from_ts"] == world.spec.split_ts < meta["split_ts"]
    held = imp.ts >= meta["split_ts"]
    assert 0.2 < held.sum() / served.sum() < 0.4  # the last 30% of the time range
    assert imp.actions[served].any(axis=1).sum() > 50  # the reactions joined their rows
    assert (~served).any() and imp.actions[~served].any(axis=1).all()  # histories: engaged
    assert meta["served"]["requests"] == requests

    assert main(["pipeline", "--logs", str(logs), "--init", str(served_tiny), "--out", str(new),
                 "--retrieval-steps", "5", "--ranker-steps", "5", "--quiet"]) == 0  # fmt: skip
    gate = json.loads((new / "gate.json").read_text())
    assert isinstance(gate["passed"], bool) and "ndcg@20" in gate["rule"]
    assert gate["held_out"]["rows"] == int(held.sum())
    assert gate["held_out"]["from"] == meta["split_ts"]
    for side in ("candidate", "baseline"):
        assert 0 <= gate[side]["ndcg@20"] <= 1 and "favorite" in gate[side]["auc"]
        assert "favorite" in gate[side]["log_loss"] and "recall@100" in gate[side]
    assert gate["candidate"] != gate["baseline"]  # trained: another version's scores
    assert gate["passed"] == GateRule().passes(gate["candidate"], gate["baseline"])
    assert checkpoint.load_config(new).version == 2  # unversioned v1 -> 2
    np.testing.assert_array_equal(
        checkpoint.load_corpus(new).post_ids, checkpoint.load_corpus(served_tiny).post_ids
    )
    assert candidate_tower_digest(new) != candidate_tower_digest(served_tiny)

    with pytest.raises(RetrainError, match="differs from the served artifacts'"):
        retrain(logs, served_tiny, tmp_path / "bad", preset_name="demo", log=lambda *_: None)
