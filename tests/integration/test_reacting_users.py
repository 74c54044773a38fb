"""A short run of loadtest/reacting.py: world users request their feeds by id from a real
tritonserver serving trained artifacts, react, and their engagements fill a real redis-server.

Locust monkey-patches the process with gevent, so it runs in a subprocess."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.world.simulate import draw_user_ids
from phoenix.world.trained import trained_world
from tests.integration.conftest import launch_with_store
from tests.training_helpers import trained_tiny

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO_ROOT = Path(__file__).resolve().parents[2]
REACTING = REPO_ROOT / "loadtest" / "reacting.py"
USERS, SEED, SEQ_LEN = 3, 5, 16
# Long enough for a few feeds on a busy machine: in CI (an AVX2-only 2-core machine, the other
# test worker busy beside it) an 8 s run ended before any recommend came back.
RUN_TIME = "20s"


@pytest.fixture(scope="module")
def served(redis_server, tmp_path_factory):
    artifacts, _, _ = trained_tiny()
    log_dir = tmp_path_factory.mktemp("triton-reacting")
    # recommend alone (its ensemble loads the chain): the users call nothing else
    triton = launch_with_store(
        artifacts,
        redis_server.url,
        log_dir,
        model_control_mode="explicit",
        load_model=["recommend"],
    )
    yield triton, artifacts
    triton.kill()  # not a stop under test: conftest, "killed"


def history_lengths(url: str, user_ids) -> list[int]:
    store = UserStateStore(connect_store(url))
    return [len(h.ranking) for h in store.histories(list(user_ids), time.time(), SEQ_LEN)]


def test_world_users_react_and_fill_their_state(served, redis_server, tmp_path):
    triton, artifacts = served
    users = draw_user_ids(trained_world(artifacts), USERS, SEED)
    assert history_lengths(redis_server.url, users) == [0] * USERS
    out = tmp_path / "online.json"
    command = [
        sys.executable, "-m", "locust", "-f", str(REACTING), "--headless",
        "-u", str(USERS), "-r", str(USERS), "-t", RUN_TIME, "--stop-timeout", "5",
        "--csv", str(tmp_path / "locust"), "--grpc-url", triton.grpc_url,
        "--redis-url", redis_server.url, "--artifacts", str(artifacts),
        "--world-seed", str(SEED), "--simulated-users", str(USERS),
        "--version-label", "tiny", "--metrics-out", str(out), "--top-n", "10",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    with (tmp_path / "locust_stats.csv").open(newline="") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["recommend"]["Request Count"]) > 0
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert int(rows["engagements"]["Request Count"]) > 0  # events went back to the store

    grown = history_lengths(redis_server.url, users)
    assert sum(grown) > 0, grown

    metrics = json.loads(out.read_text())
    total = metrics["versions"]["tiny"]["total"]
    assert total["impressions"] > 0 and total["unknown_posts"] == 0  # the world's own posts
    assert total["failures"] == 0 and total["latency_ms"]["p50"] > 0
    assert metrics["engagements_sent"] >= sum(grown)
    assert out.with_suffix(".png").is_file()
