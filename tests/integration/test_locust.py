"""Short, real Locust runs (both user classes): `make loadtest` as typed, against the shared
tritonserver and with a server of its own, the runner's verdict on failed requests, and one of
the paged users (loadtest/paged.py) (plain Locust on the locustfile:
tests/integration/test_make_serve.py, a server with a store).

Locust monkey-patches the process with gevent, so it always runs in a subprocess here.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from phoenix.stub.request_metrics import CACHE_HITS
from phoenix.util.processes import pick_free_ports
from tests.deploy_checks import sample

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO_ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO_ROOT / "loadtest" / "locustfile.py"
RESULTS = REPO_ROOT / "loadtest" / "results"  # make loadtest's reports


def run_load(server, artifacts, results: Path, grpc_port: int, run_time: str = "6s"):
    command = [
        sys.executable, str(LOCUSTFILE), "--artifacts", str(artifacts),
        "--host", "127.0.0.1", "--http-port", str(server.http_port), "--grpc-port", str(grpc_port),
        "--users", "4", "--spawn-rate", "4", "--run-time", run_time, "--results", str(results),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)


def stats_rows(results: Path) -> list[dict]:
    with (results / "locust_stats.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


def make_loadtest(*variables: str) -> subprocess.CompletedProcess:
    """`make loadtest VARIABLES` as typed (reports in loadtest/results/, its default)."""
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "--no-print-directory", "loadtest", *variables], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=280, env=env)  # fmt: skip


def test_make_loadtest_against_a_running_server(triton, tiny_artifacts):
    """loadtest/README.md's `make loadtest HOST=.. HTTP_PORT=.. GRPC_PORT=.. ARTIFACTS=..`
    (this machine's server, 4 users for 6 s): both user classes, no failure, the closing line
    counting what Locust's table counts."""
    done = make_loadtest(
        "HOST=127.0.0.1", f"HTTP_PORT={triton.http_port}", f"GRPC_PORT={triton.grpc_port}",
        f"ARTIFACTS={tiny_artifacts}", "LOADTEST_USERS=4", "LOADTEST_TIME=6s",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    rows = stats_rows(RESULTS)
    total = next(row for row in rows if row["Name"] == "Aggregated")
    assert int(total["Request Count"]) > 0
    assert int(total["Failure Count"]) == 0
    by_type = {(row["Type"], row["Name"]) for row in rows if row["Name"] != "Aggregated"}
    assert {kind for kind, _ in by_type} == {"POST", "grpc"}  # both user classes ran
    assert {name for _, name in by_type} <= {"ranker", "recommend", "user_encoder", "retriever"}
    assert (RESULTS / "locust.html").is_file()
    assert closing_count(done.stdout) == table_count(done.stdout + done.stderr)


def test_make_loadtest_starts_its_own_server(tiny_artifacts):
    """`make loadtest` with no server named: `make artifacts` first (the tiny artifacts'
    programs are there: it only loads them), then a server of its own on free ports, Locust,
    the server stopped; 2 users for 6 s."""
    done = make_loadtest(f"ARTIFACTS={tiny_artifacts}", "LOADTEST_USERS=2", "LOADTEST_TIME=6s")
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, output
    assert f"-m phoenix.ops.compile --artifacts {tiny_artifacts}" in done.stdout, output
    assert closing_count(done.stdout) > 0 and ", 0 failed" in done.stdout, output


def closing_count(runner_out: str) -> int:
    """Requests of the runner's closing line."""
    line = next(line for line in runner_out.splitlines() if "Locust's Aggregated row" in line)
    return int(line.split()[0])


def table_count(locust_out: str) -> int:
    """Requests of the Aggregated row of the table Locust prints when it quits."""
    rows = [line.split() for line in locust_out.splitlines()]
    return int(next(row for row in rows if row[:1] == ["Aggregated"])[1])


def test_failed_requests_fail_the_run(triton, tiny_artifacts, tmp_path):
    """gRPC users pointed at a closed port: their failures are counted and the run fails."""
    (closed_port,) = pick_free_ports(1)
    # 6 s as the run above: in a loaded make test (2026-11-26) a 3 s run failed with no
    # failure counted, most likely before a gRPC user had sent anything (not reproduced alone)
    done = run_load(triton, tiny_artifacts, tmp_path, closed_port, run_time="6s")
    output = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode != 0, output
    assert "load test FAILED" in done.stderr, output
    total = next(row for row in stats_rows(tmp_path) if row["Name"] == "Aggregated")
    assert int(total["Failure Count"]) > 0, output


PAGED = REPO_ROOT / "loadtest" / "paged.py"


def test_paged_users_page_through_feeds_and_the_ranker_finds_their_prefixes(
    triton, tiny_artifacts, tmp_path
):
    """loadtest/paged.py as the docs run it, short: three pages per user 0.2-0.4 s apart, no
    failed request, every page in the tables, and the ranker's prefix cache found prefixes."""
    hits = sample(triton.metrics_url, CACHE_HITS, model="ranker")
    command = [
        sys.executable, "-m", "locust", "-f", str(PAGED), "--headless", "--only-summary",
        "--users", "3", "--spawn-rate", "3", "--run-time", "5s",
        "--host", f"http://{triton.http_url}", "--artifacts", str(tiny_artifacts),
        "--page-interval", "0.2,0.4", "--csv", str(tmp_path / "paged"),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with (tmp_path / "paged_stats.csv").open(newline="") as handle:
        rows = {row["Name"]: row for row in csv.DictReader(handle)}
    assert int(rows["Aggregated"]["Failure Count"]) == 0
    assert {"page 1", "page 2", "page 3"} <= set(rows)
    assert int(rows["page 3"]["Request Count"]) > 0
    assert sample(triton.metrics_url, CACHE_HITS, model="ranker") > hits
