"""A short, real Locust run of the by-id traffic (loadtest/locustfile.py's runner, as `make
loadtest` runs it) against a real tritonserver reading a real redis-server: the world's users
are loaded into the store first, requests carry only the user id (and top_k, sometimes the
filters), every answer passes its checks, and the server read the loaded histories.

Locust monkey-patches the process with gevent, so it runs in a subprocess."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from phoenix.user_state import connect as connect_store
from phoenix.user_state.request_log import read_request_log
from phoenix.world.users import WorldUsers
from tests.integration.conftest import launch_with_store

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
REPO_ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO_ROOT / "loadtest" / "locustfile.py"
WORLD = {"num_users": 120, "num_authors": 12, "num_posts": 300, "num_days": 4}
POPULATION = 40


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory) -> Path:
    """A small trained world's spec (only training.json is read for the users)."""
    path = tmp_path_factory.mktemp("world")
    (path / "training.json").write_text(json.dumps({"seed": 3, "world": WORLD}))
    return path


@pytest.fixture(scope="module")
def served(tiny_artifacts, redis_server, tmp_path_factory):
    triton = launch_with_store(tiny_artifacts, redis_server.url, tmp_path_factory.mktemp("t"))
    yield triton
    triton.kill()  # not a stop under test: conftest, "killed"


def run_by_id_load(server, artifacts, world_dir, redis_url: str, results: Path):
    command = [
        sys.executable, str(LOCUSTFILE), "--artifacts", str(artifacts),
        "--host", "127.0.0.1", "--http-port", str(server.http_port),
        "--grpc-port", str(server.grpc_port), "--redis-url", redis_url,
        "--by-id-world", str(world_dir), "--by-id-users", str(POPULATION),
        "--users", "4", "--spawn-rate", "4", "--run-time", "8s", "--results", str(results),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(command, capture_output=True, text=True, timeout=200, env=env)


def test_by_id_traffic_reads_the_loaded_world_users_and_passes_every_check(
    served, tiny_artifacts, world_dir, redis_server, tmp_path
):
    done = run_by_id_load(served, tiny_artifacts, world_dir, redis_server.url, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert f"{POPULATION} users loaded into {redis_server.url}" in done.stdout + done.stderr

    with (tmp_path / "locust_stats.csv").open(newline="") as handle:
        rows = {(row["Type"], row["Name"]): row for row in csv.DictReader(handle)}
    by_id = {kind: rows[(kind, "recommend_by_id")] for kind in ("POST", "grpc")}
    assert all(int(row["Request Count"]) > 0 for row in by_id.values())  # both protocols
    assert int(rows[("", "Aggregated")]["Failure Count"]) == 0

    # what the server logged for the by-id requests: the population's users, repeated (Zipf),
    # with the histories the store holds for them
    population = WorldUsers.from_artifacts(world_dir).user_ids[:POPULATION].tolist()
    records = [r for _, r in read_request_log(connect_store(redis_server.url)) if not r.own_history]
    assert len(records) >= sum(int(row["Request Count"]) for row in by_id.values())
    users = Counter(r.user_id for r in records)
    assert set(users) <= set(population)
    assert len(users) < len(records)  # hot users come back
    assert any(len(r.history_post_ids) > 0 for r in records)  # loaded histories were read


def test_without_a_store_url_the_runner_leaves_by_id_traffic_out(
    served, tiny_artifacts, world_dir, tmp_path
):
    command = [
        sys.executable, str(LOCUSTFILE), "--artifacts", str(tiny_artifacts),
        "--host", "127.0.0.1", "--http-port", str(served.http_port),
        "--grpc-port", str(served.grpc_port), "--by-id-world", str(world_dir),
        "--users", "2", "--spawn-rate", "2", "--run-time", "3s", "--results", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, env=env)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "the recommend_by_id traffic is left out" in done.stdout
    with (tmp_path / "locust_stats.csv").open(newline="") as handle:
        names = {row["Name"] for row in csv.DictReader(handle)}
    assert "recommend_by_id" not in names and "Aggregated" in names
