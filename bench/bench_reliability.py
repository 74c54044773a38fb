"""Clean exit under load, N times in a row: what `make bench-reliability` runs.

    python -m bench.bench_reliability --runs 20 --artifacts artifacts/demo

Each run starts the serve command (`python -m phoenix.ops.serve`, free loopback ports,
`--drain-seconds 1`), waits for /ready, puts it under load with the project's Locust traffic
mix (loadtest/locustfile.py, HTTP and gRPC users), sends SIGTERM and measures: seconds until
/ready answers 503, seconds until the serve command exits, its exit code, whether it said
"stopped cleanly", and the failures Locust saw, by kind (refused before any work, which is safe
to retry elsewhere, a connection cut mid-request, anything else; Locust's gRPC user records
errors without their message, counted as 'unclassified'). Figures go to
bench/results/reliability-exit.json and a table on stdout; the exit status is 1 when a run did
not exit 0 or a request failed with anything but a refusal.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from harness.locust_runs import failure_kinds, finish_locust, start_locust
from harness.polling import wait_until
from harness.results import shown_path, write_results
from harness.serve_process import ServeError, ServeProcess
from phoenix.util.command_line import command_parser
from phoenix.util.processes import http_get_status

DRAIN_S = 1.0
LOCUST_FINISH_S = 60.0


def one_run(args, index: int) -> dict:
    serve = ServeProcess(args.artifacts, args.work_dir / f"run-{index}", DRAIN_S).start()
    locust = None
    try:
        try:
            serve.wait_ready(args.ready_timeout, 0.5)
        except ServeError:
            code = serve.running().returncode
            return {"run": index, "error": "serve did not get ready", "exit_code": code}
        urls = {"http": serve.http_url, "grpc": serve.grpc_url}
        locust = start_locust(urls, serve.work / "locust", users=args.users,
                              artifacts=args.artifacts)  # fmt: skip
        time.sleep(args.load_seconds)
        termed = time.monotonic()
        serve.terminate()
        unready = wait_until(lambda: http_get_status(serve.ready_url) != 200, 30, 0.02)
        code = serve.wait_exit(args.exit_limit)
        exited = time.monotonic()
    finally:
        serve.kill()
        if locust is not None:
            finish_locust(locust, LOCUST_FINISH_S)
    said = serve.log.read_text(errors="replace")
    kinds = failure_kinds(serve.work / "locust_failures.csv")
    return {
        "run": index,
        "exit_code": code,
        "stopped_cleanly": "stopped cleanly" in said,
        "segfault": code in (139, -11),
        "ready_503_after_s": round(unready - termed, 3) if unready else None,
        "exit_after_s": round(exited - termed, 2),
        "refused": kinds.get("refused", 0),
        "cut": kinds.get("cut", 0),
        "other": kinds.get("other", 0),
        "unclassified": kinds.get("unclassified", 0),
        "other_errors": {k[7:]: v for k, v in kinds.items() if k.startswith("other: ")},
    }


def summary(rows: list[dict]) -> dict:
    exits = [r["exit_after_s"] for r in rows if r.get("exit_code") is not None]
    unready = [r["ready_503_after_s"] for r in rows if r.get("ready_503_after_s") is not None]
    return {
        "runs": len(rows),
        "exit_codes": dict(Counter(str(r.get("exit_code")) for r in rows)),
        "exited_0": sum(r.get("exit_code") == 0 for r in rows),
        "segfaults": sum(bool(r.get("segfault")) for r in rows),
        "exit_after_s": {
            "min": min(exits, default=None),
            "median": statistics.median(exits) if exits else None,
            "max": max(exits, default=None),
        },  # fmt: skip
        "ready_503_after_s_max": max(unready, default=None),
        "failures": {
            k: sum(r.get(k, 0) for r in rows) for k in ("refused", "cut", "other", "unclassified")
        },
    }


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m bench.bench_reliability",
        "SIGTERM the serve command under Locust load, N runs in a row; report exit codes, exit "
        "times and failures by kind.",
        show_defaults=True,
    )
    parser.add_argument("--runs", type=int, default=20, help="runs in a row")
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts/demo"))
    parser.add_argument("--users", type=int, default=8, help="Locust users (HTTP and gRPC)")
    parser.add_argument("--load-seconds", type=float, default=8.0, help="load before SIGTERM")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--exit-limit", type=float, default=120.0, help="then SIGKILL")
    parser.add_argument("--work-dir", type=Path, default=Path("build/bench-reliability"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/reliability-exit.json"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    rows = []
    for index in range(args.runs):
        row = one_run(args, index)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"artifacts": shown_path(args.artifacts), "users": args.users,
              "load_seconds": args.load_seconds, "drain_seconds": DRAIN_S,
              "summary": summary(rows), "runs": rows}  # fmt: skip
    write_results(args.out, result)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.out}")
    bad = [r for r in rows if r.get("exit_code") != 0 or r.get("other") or r.get("cut")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
