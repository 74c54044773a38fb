"""The project's Locust traffic (loadtest/locustfile.py) run in the background against a
server, and what it wrote back: the Aggregated totals and the failures by kind."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from phoenix.testing.loadgen import error_kind
from phoenix.testing.processes import REPO_ROOT

LOCUSTFILE = REPO_ROOT / "loadtest" / "locustfile.py"
FINISH_TIMEOUT_S = 90.0


def start_locust(
    urls: Mapping[str, str],
    prefix: Path,
    *,
    users: int,
    artifacts: Path,
    run_time: str = "30m",
    extra: Sequence[str] = (),
) -> subprocess.Popen:
    """Locust in the background, headless, against ``urls`` ('http' and 'grpc' host:port):
    ``users`` users drawing ids from ``artifacts``, CSV files at ``prefix``; ``extra``: more
    options and user classes."""
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--users", str(users), "--spawn-rate", str(users), "--run-time", run_time,
        "--only-summary", "--host", f"http://{urls['http']}", "--grpc-url", urls["grpc"],
        "--artifacts", str(Path(artifacts).resolve()), "--csv", str(prefix), *extra,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        command, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )


def finish_locust(process: subprocess.Popen, timeout_s: float = FINISH_TIMEOUT_S) -> None:
    """SIGTERM (Locust writes its CSV files on the way out), then kill after ``timeout_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def locust_totals(stats_csv: Path) -> tuple[int, int]:
    """(requests, failures) of the Aggregated row of Locust's _stats.csv; (0, 0) without one."""
    if not stats_csv.exists():
        return 0, 0
    with stats_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["Name"] == "Aggregated":
                return int(row["Request Count"]), int(row["Failure Count"])
    return 0, 0


def failure_kinds(failures_csv: Path) -> Counter:
    """Locust's failures, by kind: refused, cut, other (also counted per message, as
    'other: <message>'), and 'unclassified' where Locust recorded an exception without its
    message (the locustfile's gRPC user does)."""
    kinds: Counter = Counter()
    if not failures_csv.exists():
        return kinds
    with failures_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            error = row["Error"]
            unclassified = error.rstrip("()'\"") in ("InferenceServerException", "")
            kind = "unclassified" if unclassified else error_kind(error)
            kinds[kind] += int(row["Occurrences"])
            if kind == "other":
                kinds[f"other: {error[:120]}"] += int(row["Occurrences"])
    return kinds
