"""The load test's closing line counts what Locust's closing table counts (stats.total).

Importing Locust monkey-patches the process with gevent, so the locustfile runs in a
subprocess, with real Locust statistics.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO_ROOT / "loadtest" / "locustfile.py"

SCRIPT = """
import importlib.util, sys
from pathlib import Path
from locust.stats import RequestStats

spec = importlib.util.spec_from_file_location("locustfile", sys.argv[1])
locustfile = sys.modules["locustfile"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(locustfile)
from harness.locust_runs import read_totals
from loadtest.runner import closing_line
stats = RequestStats()
for _ in range(5):
    stats.log_request("POST", "ranker", 12, 100)
stats.log_request("grpc", "recommend", 30, 0)  # a failure is a request with an error too
stats.log_error("grpc", "recommend", "refused")
saved = Path(sys.argv[2])
locustfile.save_totals(stats, saved)
print(closing_line(read_totals(saved), 1))
print(stats.total.to_string(current=False))
print(closing_line(read_totals(saved.with_name("absent.json")), 2))
"""


def test_the_closing_line_counts_the_tables_aggregated_row(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(LOCUSTFILE), str(tmp_path / "locust_totals.json")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    closing, aggregated, unfinished = done.stdout.splitlines()[-3:]
    assert closing == "6 requests, 1 failed (Locust's Aggregated row above); Locust exit code 1"
    assert aggregated.split()[1:3] == ["6", "1(16.67%)"]  # the table's own row, same counts
    assert unfinished == "Locust saved no totals (it did not finish); Locust exit code 2"
