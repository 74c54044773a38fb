"""``recommend`` over artifacts of the production family (X's production ranker beside the
two-tower retrieval) against a real tritonserver and a real redis-server: a user of the
synthetic world loaded with their impression context and profile, the world's posts with their
semantic IDs in a corpus store. By id and with a history, the feed is answered, and the ranker
of the chain read every feature the stages gave it: the chain's scores are the served ranker's
on the inputs the served stages answer one at a time, which hold the store's features (the
history's context and semantic IDs, the profile, the candidates' semantic IDs and the
request's timezone and hour), and the same ranker without them scores otherwise. Bad new
inputs are refused naming them; the served log keeps the history's actions as the store's."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from phoenix.client.client import connect, infer, served_models
from phoenix.feed_features import local_hour
from phoenix.ops.configs import write_repository
from phoenix.ops.profiles import profile
from phoenix.schema.contracts import RANKER
from phoenix.schema.production_inputs import PRODUCTION_INPUT_NAMES
from phoenix.schema.recommend import RECOMMEND
from phoenix.schema.wiring import next_step_inputs
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import Engagement, Profile, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.actions import ACTION_BIT
from phoenix.user_state.history import encode, time_ms
from phoenix.user_state.profile import profile_arrays
from phoenix.user_state.request_log import read_request_log
from phoenix.world.users import WorldUsers, load_users
from tests import fixture_builds

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]
WORLD = {"num_users": 40, "num_authors": 12, "num_posts": 300, "num_days": 4}
STORE = "world-store"  # the corpus the served models read, inside the artifacts
TOP_K = 12
TOL = 1e-4
DWELL_TIME = ACTION_BIT["dwell_time"]
BUCKET_S = 3600  # the tiny production ranker's post-age buckets (post_age_granularity_mins)


def mid_bucket_times(count: int, now: int) -> np.ndarray:
    """Creation times over the last two days, each in the middle of a post-age bucket at
    ``now``: a served request and its in-process twin seconds apart date every post alike."""
    ages = (np.arange(count) % 48) * BUCKET_S + BUCKET_S // 2
    return (now - ages).astype(np.int64)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """The tiny production preset and its CPU programs (tests/fixture_builds.py: built once for
    every test process of this code), copied, with a small synthetic world
    (training.json) and the world's posts in a corpus store with their semantic IDs,
    embedded by the artifacts' candidate tower and dated in the middle of post-age buckets
    from now."""
    from phoenix.client.served_tower import IN_PROCESS, candidate_tower, tower_identity
    from phoenix.corpus_store.building import build_store
    from phoenix.world.trained import world_posts

    out = tmp_path_factory.mktemp("production-feed") / "artifacts"
    built = fixture_builds.production_tiny_artifacts()
    shutil.copytree(built, out)
    (out / "training.json").write_text(json.dumps({"seed": 3, "world": WORLD}))
    now = int(time.time())
    posts = world_posts(out, WORLD["num_posts"], None, now)
    posts = dataclasses.replace(posts, created_at=mid_bucket_times(len(posts), now))
    embed = candidate_tower(IN_PROCESS, artifacts=out, batch_size=256)
    tower = tower_identity(IN_PROCESS, artifacts=out)
    build_store(out / STORE, posts, embed, embedded_by=tower, report=lambda line: None)
    return out


@pytest.fixture(scope="module")
def world(artifacts):
    return WorldUsers.from_artifacts(artifacts)


@pytest.fixture(scope="module")
def server(artifacts, redis_server, world, tmp_path_factory):
    """A server over the artifacts reading the world's store, the two most active users
    loaded into the user-state store (their engagements with context, follows, profile)."""
    from tests.integration.conftest import launch_server

    root = tmp_path_factory.mktemp("production-server")
    load_users(UserStateStore(connect_store(redis_server.url)), world, world.most_active(2))
    repository = write_repository(root / "repository", profile("cpu").with_corpus(STORE))
    env = {USER_STATE_URL_ENV: redis_server.url}
    triton = launch_server(repository, artifacts, log_path=root / "tritonserver.log", env=env)
    yield triton
    triton.kill()  # not a stop under test: conftest, "killed"


@pytest.fixture(scope="module")
def client(server):
    return connect(server.http_url)


@pytest.fixture(scope="module")
def user(world) -> tuple[int, int]:
    """(index, id) of the world's most active user."""
    index = int(world.most_active(1)[0])
    return index, int(world.user_ids[index])


def by_id(user_id: int, **more) -> dict:
    return {"user_id": np.array([[user_id]], np.int64),
            "top_k": np.array([[TOP_K]], np.int32), **more}  # fmt: skip


def unrecorded(request: dict) -> dict:
    """The chain's request without its side effect (no post marked served)."""
    return {**request, "record": np.zeros((1, 1), np.int8)}


def utc_hour() -> int:
    return int(time.time() // 3600)


def ranker_read(client, request: dict) -> dict:
    """The ranker's inputs as the served stages answer them one model at a time, checked to
    be what the chain's ranker read: the chain's scores (record 0) are the served ranker's on
    them, and otherwise without the production features. Done again if the hour turned
    meanwhile (the request's hour is the clock's)."""
    for _ in range(2):
        hour = utc_hour()
        run = served_models(client, "http")
        done: dict[str, dict] = {}
        for model in ("user_state", "user_encoder", "retriever"):
            (done[model],) = run(model, [next_step_inputs(request, done, model)])
        inputs = next_step_inputs(request, done, "ranker")
        chain = infer(client, "http", "recommend_chain", unrecorded(request))
        ranked = infer(client, "http", RANKER.name, inputs)
        bare = {k: v for k, v in inputs.items() if k not in PRODUCTION_INPUT_NAMES}
        without = infer(client, "http", RANKER.name, bare)
        if utc_hour() == hour:
            break
    posts = chain["ranked_post_ids"][0]
    assert len(posts) > 0
    probs = dict(zip(ranked["ranked_post_ids"][0].tolist(), ranked["action_probs"][0]))
    np.testing.assert_allclose(chain["action_probs"][0], [probs[p] for p in posts.tolist()],
                               rtol=TOL, atol=TOL)  # fmt: skip
    others = dict(zip(without["ranked_post_ids"][0].tolist(), without["action_probs"][0]))
    moved = np.abs(chain["action_probs"][0] - [others[p] for p in posts.tolist()]).max(axis=1)
    assert (moved > 10 * TOL).mean() > 0.9, moved  # the features move nearly every post
    return inputs


def stored_order(events) -> list[Engagement]:
    """The engagements among ``events`` in the order the store reads them back: by time in
    milliseconds, engagements of one time by their packed bytes (a sorted set's order)."""
    engagements = [e for e in events if isinstance(e, Engagement)]
    return sorted(engagements, key=lambda e: (time_ms(e.ts), encode(e)))


def world_codes(world, post_ids: np.ndarray) -> np.ndarray:
    """The world's semantic IDs of ``post_ids`` (zeros for 0, padding)."""
    index = {p: i for i, p in enumerate(world.world.post_ids.tolist())}
    rows = [world.world.post_semantic_ids[index[p]] if p else np.zeros(6, np.int32)
            for p in np.ravel(post_ids).tolist()]  # fmt: skip
    return np.array(rows).reshape(np.shape(post_ids) + (6,))


def test_by_id_the_ranker_reads_the_stored_context_profile_and_semantic_ids(client, world, user):
    index, user_id = user
    inputs = ranker_read(client, by_id(user_id))

    events = world.user_events(index)
    (stored_profile,) = [e for e in events if isinstance(e, Profile)]
    newest = stored_order(events)[-len(inputs["history_post_ids"][0]) :]  # the newest seq_len
    assert inputs["history_post_ids"][0].tolist() == [e.post_id for e in newest]
    assert inputs["history_timezone"][0].tolist() == [e.timezone for e in newest]
    assert inputs["history_hour_of_day"][0].tolist() == [e.hour_of_day for e in newest]
    assert inputs["history_creation_time"][0].tolist() == [int(e.post_created_at) for e in newest]
    stamps = [time_ms(e.ts) // 1000 for e in newest]  # the store keeps milliseconds
    assert inputs["history_impression_time"][0].tolist() == stamps
    codes = inputs["history_semantic_ids"]
    assert codes.any() and codes.tolist() == world_codes(world, inputs["history_post_ids"]).tolist()
    for name, array in profile_arrays([stored_profile]).items():
        assert inputs[name][0].tolist() == np.asarray(array[0]).reshape(-1).tolist(), name
    candidates = inputs["candidate_post_ids"]
    assert inputs["candidate_semantic_ids"].tolist() == world_codes(world, candidates).tolist()
    home = stored_profile.timezone
    assert set(inputs["candidate_timezone"][0].tolist()) == {home}
    hours = set(inputs["candidate_hour_of_day"][0].tolist())
    assert hours <= {int(local_hour(time.time() - s, home)) for s in (0, 60)}  # the clock's


def test_with_a_history_the_ranker_reads_what_the_request_carries(client, user):
    _, user_id = user
    state = infer(client, "http", "user_state", {"user_id": np.array([[user_id]], np.int64)})
    carried = {  # the history and profile by-id requests read, as the request's own
        name: state[name]
        for name in RECOMMEND.input_names
        if name in state and name != "user_id" and not name.startswith("request_")
    }
    del carried["history_semantic_ids"]  # looked up by post
    context = {"request_timezone": np.array([[3]], np.int32),
               "request_hour_of_day": np.array([[9]], np.int32)}  # fmt: skip
    inputs = ranker_read(client, by_id(user_id, **carried, **context))
    assert inputs["history_semantic_ids"].tolist() == state["history_semantic_ids"].tolist()
    assert inputs["history_timezone"].tolist() == state["history_timezone"].tolist()
    assert inputs["country"].tolist() == state["country"].tolist()
    assert set(inputs["candidate_timezone"][0].tolist()) == {3}
    assert set(inputs["candidate_hour_of_day"][0].tolist()) == {9}


def test_recommend_by_id_serves_logs_the_stores_actions_and_skips_served_posts(
    client, redis_server, world, user
):
    index, user_id = user
    first = infer(client, "http", "recommend", by_id(user_id))
    second = infer(client, "http", "recommend", by_id(user_id))
    posts = [set(out["ranked_post_ids"][0].tolist()) - {0} for out in (first, second)]
    assert posts[0] and posts[1] and not posts[0] & posts[1]
    assert first["action_probs"].shape[-1] == 64  # X's action slots
    request_id = int(first["request_id"][0, 0])
    logged = [r for _, r in read_request_log(connect_store(redis_server.url))]
    [entry] = [r for r in logged if r.request_id == request_id]
    newest = stored_order(world.user_events(index))[-len(entry.history_post_ids) :]
    assert entry.history_post_ids.tolist() == [e.post_id for e in newest]
    # the store's bits, dwell_time aside (the slots have none)
    assert entry.history_actions.tolist() == [e.actions & ~DWELL_TIME for e in newest]


def test_phoenix_recommend_check_agrees_with_the_server(server, artifacts):
    """`phoenix-recommend --check` as users run it: the artifacts' example user (a history with
    its context and semantic IDs, a profile) through the served recommend and the same chain
    in this process. The request's hour is the clock's: run again if the hour turned."""
    command = [sys.executable, "-m", "clients.recommend", "--url", server.http_url,
               "--artifacts", str(artifacts), "--check"]  # fmt: skip
    for _ in range(2):
        hour = utc_hour()
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
        if utc_hour() == hour:
            break
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check passed" in done.stdout


@pytest.mark.parametrize(
    "more, fragment",
    [
        ({"history_timezone": np.array([[3]], np.int32)}, "without a history"),
        ({"country": np.array([[3]], np.int32)}, "without a history"),
        ({"request_timezone": np.array([[32]], np.int32)}, "request_timezone"),
        ({"request_hour_of_day": np.array([[25]], np.int32)}, "request_hour_of_day"),
    ],
)
def test_bad_production_inputs_are_refused_naming_them(client, user, more, fragment):
    with pytest.raises(InferenceServerException, match=fragment):
        infer(client, "http", "recommend", by_id(user[1], **more))
