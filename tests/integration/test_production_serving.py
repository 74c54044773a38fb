"""A production-family artifact (X's production ranker, the tiny preset) served by a real
tritonserver: the `ranker` against X's forward computed here, `phoenix-rank --check` as users
run it, bad production inputs refused by name, a short Locust run.

One server for the module, started as docs/production.md starts it (`make serve
ARTIFACTS=...`: every model of model_repository/, a redis-server, the supervisor); the
artifacts (made by `phoenix-artifacts --ranker production`) and their compiled programs are
built once per checkout (tests/built_once.py).
"""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from harness.polling import wait_until
from phoenix.checkpoint import load_config, load_example_sequence
from phoenix.checkpoint.production import load_production_ranker
from phoenix.client.client import connect, infer, ranker_inputs
from phoenix.feed_features import ACTION_SLOTS
from phoenix.production import forward
from phoenix.production.hashing import gather_rows, hash_author_ids, hash_item_ids, hash_user_ids
from phoenix.production.inputs import PostSequence, RankingInputs, UserFeatures
from phoenix.production.params import device_table, device_weights
from phoenix.schema.contracts import RANKER
from tests import fixture_builds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO_ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4
DAY = 86_400


@pytest.fixture(scope="module")
def production_artifacts() -> Path:
    """The tiny production preset made by the command of docs/production.md and its CPU
    programs (tests/fixture_builds.py)."""
    return fixture_builds.production_tiny_artifacts()


@dataclass
class MadeServer:
    """`make serve ARTIFACTS=...` on free ports, its store and state in a folder of its own."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    supervisor_port: int
    log: Path

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)  # as Ctrl-C: make, serve and the rest
        try:
            self.process.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def supervisor_ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def server(production_artifacts, tmp_path_factory):
    """docs/production.md's `make serve ARTIFACTS=build/production-nano`, over the tiny
    preset: every model of model_repository/, a redis-server, the supervisor."""
    from phoenix.util.processes import pick_free_ports

    root = tmp_path_factory.mktemp("production-serve")
    http, grpc, metrics, supervisor, store = pick_free_ports(5)
    variables = [
        f"ARTIFACTS={production_artifacts}", f"HTTP_PORT={http}", f"GRPC_PORT={grpc}",
        f"METRICS_PORT={metrics}", f"SUPERVISOR_PORT={supervisor}", f"STORE_PORT={store}",
        f"STORE_DIR={root / 'user-state'}", f"SERVE_ARGS=--build-dir {root / 'serve'}",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PHOENIX_ADMIN_KEY")}  # fmt: skip
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    log = root / "make-serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            ["make", "--no-print-directory", "serve", *variables], cwd=REPO_ROOT, env=env,
            stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
    started = MadeServer(process, http, grpc, supervisor, log)
    try:
        up = wait_until(lambda: process.poll() is not None or supervisor_ready(supervisor),
                        600, 0.5)  # fmt: skip
        assert up is not None and process.poll() is None, log.read_text()[-5000:]
        assert f"-m phoenix.ops.serve --artifacts {production_artifacts} " in log.read_text()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def example(production_artifacts) -> dict:
    return load_example_sequence(production_artifacts).to_dict()


def wide_request(example: dict, candidates: int, seed: int = 3) -> dict:
    """The example user with ``candidates`` candidates of its own (two chunks past 16), some
    of them older than X's 14 days, one of unknown age, and no candidate timezones (the
    profile's home timezone stands for them)."""
    rng = np.random.default_rng(seed)
    user = {k: v for k, v in example.items() if not k.startswith("candidate_")}
    user["candidate_post_ids"] = rng.integers(1, 2**62, candidates).tolist()
    user["candidate_author_ids"] = rng.integers(1, 2**40, candidates).tolist()
    user["candidate_product_surface"] = rng.integers(0, 16, candidates).tolist()
    ages = rng.integers(0, 30 * DAY, candidates).astype(float)
    ages[0] = -1.0  # unknown
    user["candidate_post_age_seconds"] = ages.tolist()
    user["candidate_hour_of_day"] = rng.integers(0, 25, candidates).tolist()
    user["candidate_semantic_ids"] = rng.integers(0, 257, (candidates, 6)).tolist()
    return user


def reference_inputs(user: dict, config) -> RankingInputs:
    """The request as X's batch, built here from its JSON values alone: hashes by X's
    functions, ages as times from one reference instant, stale past 14 days."""
    h, c = len(user["history_post_ids"]), len(user["candidate_post_ids"])
    pad = config.history_seq_len - h

    def history(values, dtype, inner=()):
        array = np.asarray(values, dtype).reshape((h, *inner))
        return np.pad(array, [(0, pad), *[(0, 0)] * len(inner)])[None]

    now = 1_700_000_000
    ages = np.asarray(user["candidate_post_age_seconds"])
    known = ages >= 0
    zone = user["timezone"]
    apps = np.asarray(user["installed_apps"], bool)[None]
    one = lambda key, dtype: np.asarray([user[key]], dtype)  # noqa: E731
    return RankingInputs(
        user=UserFeatures(
            hashes=hash_user_ids(np.asarray([user["user_id"]]), config.hashes),
            ip_hashes=np.zeros((1, config.hashes.num_ip_hashes), np.int32),
            country=one("country", np.int32),
            language=one("language", np.int32),
            latitude=one("latitude", np.float32),
            longitude=one("longitude", np.float32),
            installed_apps=apps,
            profile_gender=one("profile_gender", np.int32),
            inferred_gender=one("inferred_gender", np.int32),
            inferred_gender_score=one("inferred_gender_score", np.float32),
            age_bracket=one("age_bracket", np.int32),
            age_years=one("age_years", np.float32),
        ),  # fmt: skip
        history=PostSequence(
            post_hashes=hash_item_ids(history(user["history_post_ids"], np.int64), config.hashes),
            author_hashes=hash_author_ids(
                history(user["history_author_ids"], np.int64), config.hashes
            ),
            product_surface=history(user["history_product_surface"], np.int32),
            impression_time=history(user["history_impression_time"], np.int32),
            creation_time=history(user["history_creation_time"], np.int32),
            timezone=history(user["history_timezone"], np.int32),
            hour_of_day=history(user["history_hour_of_day"], np.int32),
            author_followed_by_viewer=np.zeros((1, config.history_seq_len), bool),
            author_following_viewer=np.zeros((1, config.history_seq_len), bool),
            engagement_counts=np.zeros((1, config.history_seq_len, 5), np.float32),
            semantic_ids=history(user["history_semantic_ids"], np.int32, (6,)),
            stale=np.zeros((1, config.history_seq_len), bool),
            actions=history(user["history_actions"], np.float32, (64,)) != 0,
            dwell_time=history(user["history_dwell_seconds"], np.float32),
        ),
        candidates=PostSequence(
            post_hashes=hash_item_ids(np.asarray([user["candidate_post_ids"]]), config.hashes),
            author_hashes=hash_author_ids(
                np.asarray([user["candidate_author_ids"]]), config.hashes
            ),
            product_surface=np.asarray([user["candidate_product_surface"]], np.int32),
            impression_time=np.where(known, now, 0)[None].astype(np.int32),
            creation_time=np.where(known, now - np.maximum(ages, 0), 0)[None].astype(np.int32),
            timezone=np.full((1, c), zone, np.int32),
            hour_of_day=np.asarray([user["candidate_hour_of_day"]], np.int32),
            author_followed_by_viewer=np.zeros((1, c), bool),
            author_following_viewer=np.zeros((1, c), bool),
            engagement_counts=np.zeros((1, c, 5), np.float32),
            semantic_ids=np.asarray([user["candidate_semantic_ids"]], np.int32),
            stale=(known & (ages >= 14 * DAY))[None],
            actions=np.zeros((1, c, 64), bool),
            dwell_time=np.zeros((1, c), np.float32),
        ),
    )


def test_the_served_ranker_equals_xs_forward_in_one_pass(server, production_artifacts, example):
    """Served (prefix program, two candidate chunks, blend, sort) against the plain one-pass
    forward of phoenix.production over the same request, in float32 as the CPU serves it."""
    import dataclasses

    user = wide_request(example, candidates=20)
    out = infer(connect(server.http_url, "http"), "http", "ranker", ranker_inputs(user))
    loaded = load_production_ranker(production_artifacts)
    config = dataclasses.replace(loaded.config, compute_dtype="float32")
    inputs = reference_inputs(user, config)
    rows = gather_rows(device_table(loaded.params, config), inputs)
    outputs = jax.jit(forward, static_argnames="config")(
        device_weights(loaded.params, config), inputs, rows, config=config
    )
    probs = np.asarray(jax.nn.sigmoid(outputs.logits))[0]  # [C, 64]
    served = connect(server.http_url, "http").get_model_config("ranker")["parameters"]
    weights = dict(__import__("json").loads(served["score_weights"]["string_value"]))
    blend = np.array([weights.get(name, 0.0) for name in ACTION_SLOTS], np.float32)
    scores = probs @ blend
    order = out["ranked_post_ids"][0]
    position = {post: i for i, post in enumerate(user["candidate_post_ids"])}
    expected = scores[[position[post] for post in order]]
    np.testing.assert_allclose(out["scores"][0], expected, atol=TOL)
    assert np.all(np.diff(out["scores"][0]) <= 0)
    index = [position[post] for post in order]
    np.testing.assert_allclose(out["action_probs"][0], probs[index], atol=TOL)
    # the ages come back as sent, in ranked order
    ages = np.asarray(user["candidate_post_age_seconds"], np.float32)[index]
    np.testing.assert_array_equal(out["ranked_post_age_seconds"][0], ages)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_phoenix_rank_check_passes(server, production_artifacts, protocol):
    url = server.http_url if protocol == "http" else server.grpc_url
    command = [
        sys.executable, "-m", "clients.rank", "--url", url, "--protocol", protocol,
        "--artifacts", str(production_artifacts), "--check",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "check passed" in done.stdout


def test_phoenix_rank_generated_users_with_every_input(server, production_artifacts):
    command = [
        sys.executable, "-m", "clients.rank", "--url", server.http_url,
        "--artifacts", str(production_artifacts), "--generate", "--seed", "5",
        "--candidates", "40", "--check",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "40 candidates of user" in done.stdout


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"history_semantic_ids": 257},
            "input 'history_semantic_ids': semantic ids values must lie in [0, 256]",
        ),
        (
            {"candidate_semantic_ids": -1},
            "input 'candidate_semantic_ids': semantic ids values must lie in [0, 256]",
        ),
        ({"history_hour_of_day": 25}, "input 'history_hour_of_day': hour of day values must"),
        ({"candidate_timezone": 32}, "input 'candidate_timezone': timezone values must lie in"),
        ({"history_timezone": 40}, "input 'history_timezone': timezone values must lie in [0, 31]"),
        ({"country": 250}, "input 'country': country values must lie in [0, 249]"),
        ({"latitude": 91.0}, "input 'latitude': latitude values must lie in [-90.0, 90.0]"),
        ({"age_years": float("nan")}, "input 'age_years': contains NaN"),
        ({"installed_apps": 2}, "input 'installed_apps': flags must lie in [0, 1]"),
        ({"history_impression_time": -5}, "input 'history_impression_time': Unix seconds"),
    ],
)
def test_bad_production_inputs_are_refused_by_name(server, example, change, message):
    arrays = ranker_inputs(example)
    for name, value in change.items():
        array = arrays[name].copy()
        array.flat[0] = value
        arrays[name] = array
    client = connect(server.http_url, "http")
    with pytest.raises(InferenceServerException) as refused:
        infer(client, "http", "ranker", arrays)
    assert message in str(refused.value)
    assert client.is_server_ready()
    assert infer(client, "http", "ranker", ranker_inputs(example))["scores"].shape[0] == 1


def test_a_history_longer_than_the_rankers_is_refused(server, example, production_artifacts):
    longest = load_config(production_artifacts).history_seq_len
    arrays = ranker_inputs(example)
    for spec in RANKER.inputs:
        if spec.length == "L" and spec.name in arrays:
            array = arrays[spec.name]
            reps = -(-(longest + 1) // array.shape[1])
            arrays[spec.name] = np.concatenate([array] * reps, axis=1)[:, : longest + 1]
    with pytest.raises(InferenceServerException) as refused:
        infer(connect(server.http_url, "http"), "http", "ranker", arrays)
    assert f"{longest + 1} history items" in str(refused.value)
    assert f"reads at most {longest}" in str(refused.value)


def test_a_short_locust_run_at_the_rankers_geometry_has_no_failures(
    server, production_artifacts, tmp_path
):
    command = [
        sys.executable, str(REPO_ROOT / "loadtest" / "locustfile.py"),
        "--artifacts", str(production_artifacts), "--host", "127.0.0.1",
        "--http-port", str(server.http_port), "--grpc-port", str(server.grpc_port),
        "--users", "4", "--spawn-rate", "4", "--run-time", "6s", "--results", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with (tmp_path / "locust_stats.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    total = next(row for row in rows if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0
    assert {row["Name"] for row in rows if row["Name"] != "Aggregated"} == {"ranker"}


def test_a_batch_split_into_calls_of_one_user_ranks_as_the_server(
    server, production_artifacts, example
):
    """The engine's CPU split (``max_rows_per_call``: here one user's prefix a call, the
    padding row left out) against the server's whole-batch calls, request by request."""
    from phoenix.engine.production_serving import ProductionBatchRanker
    from phoenix.engine.programs import ProgramStore
    from phoenix.schema.batches import pad_batch
    from phoenix.schema.request_types import RankerRequest
    from phoenix.schema.requests import parse
    from phoenix.stub.services.ranker import batch_widths

    config = load_config(production_artifacts)
    loaded = load_production_ranker(production_artifacts)
    blend = np.array([{"favorite": 1.0, "reply": 13.5, "repost": 1.0, "quote": 2.0,
                       "dwell": 0.5, "vqv": 0.3}.get(n, 0.0) for n in ACTION_SLOTS])  # fmt: skip
    engine = ProductionBatchRanker(
        loaded.config, loaded.params, blend, batch_buckets=(1, 2, 4, 8),
        candidate_buckets=(16,), store=ProgramStore.beside(production_artifacts),
        max_rows_per_call=loaded.config.prefix_len,
    )  # fmt: skip
    assert engine.call_buckets == (1,)
    users = [wide_request(example, candidates=n, seed=n) for n in (5, 12, 16)]
    arrays = [ranker_inputs(user) for user in users]
    requests = [parse(RankerRequest, a, config) for a in arrays]
    batch = pad_batch(requests, 4, batch_widths(config, 16))
    ranked = engine.rank(batch, rows=3)
    client = connect(server.http_url, "http")
    for row, (user, request) in enumerate(zip(users, arrays)):
        served = infer(client, "http", "ranker", request)
        count = len(user["candidate_post_ids"])
        order = ranked.order[row, :count]
        ids = np.asarray(user["candidate_post_ids"])[order]
        np.testing.assert_array_equal(ids, served["ranked_post_ids"][0])
        np.testing.assert_allclose(ranked.scores[row, :count], served["scores"][0], atol=TOL)
    assert np.isinf(ranked.scores[3]).all()  # the padding row: not computed
