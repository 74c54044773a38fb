"""`python loadtest/locustfile.py` (what `make loadtest` runs): Locust headless over the
locustfile with both user classes, against a running server or one of its own (with a
redis-server as its user-state store), its reports written and a verdict with a true exit
code."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from locust.util.timespan import parse_timespan

from harness.locust_runs import TOTALS_SUFFIX, Totals, read_totals
from loadtest.workload import (
    BY_ID_TAG,
    DEFAULT_ARTIFACTS,
    DEFAULT_BY_ID_USERS,
    DEFAULT_WORLD,
    THINK_TIME_S,
    think_time_arg,
    think_time_text,
)
from phoenix.checkpoint import load_config
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.util.command_line import command_parser

REPO_ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = Path(__file__).resolve().with_name("locustfile.py")


def parse_runner_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser(
        "python loadtest/locustfile.py",
        "Run this Locust file headless with both user classes (HTTP and gRPC) "
        "against a Triton server, write Locust's CSV and HTML reports and fail when any "
        "request failed. Without --http-port it starts a server of its own on free loopback "
        "ports over --model-repository, with a redis-server as its user-state store (the "
        "by-id users loaded into it), and stops both afterwards. With --http-port, the by-id "
        "traffic is sent only when --redis-url names that server's store.",
        "Examples:\n"
        "  python loadtest/locustfile.py --users 8 --run-time 30s\n"
        "  python loadtest/locustfile.py --host 127.0.0.1 --http-port 8000 --grpc-port 8001\n"
        "  python loadtest/locustfile.py --http-port 8000 --redis-url redis://127.0.0.1:6379/0\n",
    )

    def add_defaulted(flag: str, text: str, **kwargs) -> None:
        """An option whose help ends with its default."""
        parser.add_argument(flag, help=f"{text} (default: %(default)s)", **kwargs)

    add_defaulted("--artifacts", "artifact directory", type=Path, default=Path(DEFAULT_ARTIFACTS))
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=REPO_ROOT / "model_repository",
        help="repository of the server this starts (default: model_repository)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="host of a running server (with --http-port; default: %(default)s)",
    )
    parser.add_argument(
        "--http-port", type=int, help="test the running server at --host with this HTTP port"
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=8001,
        help="its gRPC port (with --http-port; default: %(default)s)",
    )
    parser.add_argument(
        "--redis-url",
        default="",
        help="the running server's user-state store (with --http-port): by-id users are loaded "
        "into it and by-id traffic is sent; without it, none is sent",
    )
    add_defaulted(
        "--by-id-world",
        "trained artifacts whose world's users are the by-id users",
        type=Path,
        default=Path(DEFAULT_WORLD),
    )
    add_defaulted(
        "--by-id-users",
        "how many of the world's users by-id requests draw from, by Zipf's law",
        type=int,
        default=DEFAULT_BY_ID_USERS,
    )
    add_defaulted("--users", "simulated users, half HTTP, half gRPC", type=int, default=8)
    add_defaulted("--spawn-rate", "users started per second", type=float, default=4.0)
    add_defaulted("--run-time", "how long the load runs, Locust syntax", default="30s")
    add_defaulted(
        "--think-time",
        "seconds each user waits after an answer, LOW,HIGH drawn uniformly",
        type=think_time_arg,
        default=think_time_text(THINK_TIME_S),
    )
    add_defaulted(
        "--max-requests", "stop earlier after this many requests", type=int, default=20000
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=REPO_ROOT / "loadtest" / "results",
        help="folder for the reports (default: loadtest/results)",
    )
    return parser.parse_args(argv)


def locust_command(args, http_url: str, grpc_url: str) -> list[str]:
    prefix = args.results / "locust"
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
        "--run-time", args.run_time, "--stop-timeout", "10", "--only-summary",
        "--think-time", think_time_text(args.think_time),
        "--host", f"http://{http_url}", "--grpc-url", grpc_url,
        "--artifacts", str(args.artifacts.resolve()), "--max-requests", str(args.max_requests),
        "--csv", str(prefix), "--html", f"{prefix}.html", "--exit-code-on-error", "1",
        *by_id_options(args),
    ]  # fmt: skip


def by_id_options(args) -> list[str]:
    """Locust's by-id options: the store to load the users into, or the by-id task left out.
    A production-family artifact's run sends the ranker alone (its `rank` tag)."""
    if production_family(args.artifacts):
        return ["--tags", "rank"]
    if not args.redis_url:
        return ["--exclude-tags", BY_ID_TAG]
    return [
        "--redis-url", args.redis_url, "--by-id-world", str(args.by_id_world.resolve()),
        "--by-id-users", str(args.by_id_users),
    ]  # fmt: skip


def production_family(artifacts: Path) -> bool:
    """Whether ``artifacts`` (when there: Locust says so if not) has a production ranker."""
    config = Path(artifacts) / "config.json"
    return config.is_file() and load_config(artifacts).ranker_family == "production"


def totals_file(results: Path) -> Path:
    return results / f"locust{TOTALS_SUFFIX}"


def closing_line(totals: Optional[Totals], exit_code: int) -> str:
    """The verdict's counts: those of the table Locust printed above (its Aggregated row)."""
    if totals is None:
        return f"Locust saved no totals (it did not finish); Locust exit code {exit_code}"
    return (
        f"{totals.requests} requests, {totals.failures} failed (Locust's Aggregated row above); "
        f"Locust exit code {exit_code}"
    )


def run_locust(args, http_url: str, grpc_url: str) -> int:
    args.results.mkdir(parents=True, exist_ok=True)
    limit = parse_timespan(args.run_time) + 120  # start-up, pools and stop-timeout on top
    command = locust_command(args, http_url, grpc_url)
    totals_file(args.results).unlink(missing_ok=True)  # a previous run's must not count
    try:
        code = subprocess.run(command, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        print(f"error: locust did not finish within {limit:.0f} s", file=sys.stderr)
        return 1
    totals = read_totals(totals_file(args.results))
    print("\n" + closing_line(totals, code))
    print(f"reports in {args.results}/")
    if totals is None or totals.requests == 0 or totals.failures or code:
        print("load test FAILED", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_runner_args(argv)
    if args.http_port:
        if not args.redis_url:
            print(f"no --redis-url: the {BY_ID_TAG} traffic is left out", flush=True)
        return run_locust(args, f"{args.host}:{args.http_port}", f"{args.host}:{args.grpc_port}")
    from harness.triton import triton_server
    from phoenix.user_state.server import RedisServer

    log = args.results / "tritonserver.log"
    with RedisServer() as store:
        args.redis_url = store.url
        env = {USER_STATE_URL_ENV: store.url}
        server = triton_server(
            args.model_repository, args.artifacts, log_path=log, env=env, exit_timeout_secs=5
        )
        print(f"starting tritonserver over {args.model_repository} (log: {log}), "
              f"user-state store {store.url}", flush=True)  # fmt: skip
        with server:
            print(f"ready after {server.ready_after_s:.0f} s at {server.http_url}", flush=True)
            return run_locust(args, server.http_url, server.grpc_url)
