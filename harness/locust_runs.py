"""The project's Locust traffic (loadtest/locustfile.py) run in the background against a
server, and what it wrote back: the Aggregated totals and the failures by kind.

The totals are read from ``{prefix}_totals.json``, which the locustfile writes from
``stats.total`` when Locust quits (this module is its one reader); Locust's own _stats.csv can
miss the last requests, so it is only the fallback for runs older than that file."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple, Optional

from harness import REPO_ROOT
from harness.loadgen import error_kind
from phoenix.util.processes import stop_process

LOCUSTFILE = REPO_ROOT / "loadtest" / "locustfile.py"
FINISH_TIMEOUT_S = 90.0
TOTALS_SUFFIX = "_totals.json"  # beside Locust's CSV files
DEFAULT_GRPC_URL = "127.0.0.1:8001"  # serve's default gRPC port, on loopback


class Totals(NamedTuple):
    requests: int
    failures: int


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
    stop_process(process, timeout_s)


def read_totals(path: Path) -> Optional[Totals]:
    """The totals Locust saved at its exit, or None when it saved none (it did not finish)."""
    try:
        saved = json.loads(path.read_text())
        return Totals(int(saved["requests"]), int(saved["failures"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def locust_totals(prefix: Path) -> Totals:
    """(requests, failures) of the run whose files are at ``prefix``: its saved totals, else
    the Aggregated row of its _stats.csv (runs from before the totals file); (0, 0) without
    either."""
    saved = read_totals(Path(f"{prefix}{TOTALS_SUFFIX}"))
    if saved is not None:
        return saved
    row = stats_rows(prefix).get("Aggregated")
    if row is None:
        return Totals(0, 0)
    return Totals(int(row["Request Count"]), int(row["Failure Count"]))


def stats_rows(prefix: Path) -> dict[str, dict[str, str]]:
    """The rows of the run's _stats.csv by name ("Aggregated" for the totals); none without
    the file."""
    stats_csv = Path(f"{prefix}_stats.csv")
    if not stats_csv.exists():
        return {}
    with stats_csv.open(newline="") as handle:
        return {row["Name"]: row for row in csv.DictReader(handle)}


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


def add_server_options(parser, default_artifacts: str, artifacts_help: str, **artifacts) -> None:
    """The options each of the project's locustfiles takes: the artifact directory the server
    serves (``artifacts``: more keywords for that option) and the server's gRPC endpoint."""
    parser.add_argument("--artifacts", default=default_artifacts, help=artifacts_help, **artifacts)
    parser.add_argument(
        "--grpc-url", default=DEFAULT_GRPC_URL, help="host:port of the server's gRPC endpoint"
    )
