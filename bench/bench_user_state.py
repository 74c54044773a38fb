"""recommend by user id, measured against a real tritonserver reading a real redis-server
(docs/user-state.md, "Measured under load"):

1. throughput: perf_analyzer sends `recommend` by `user_id` and then `recommend` carrying the
   same users' histories (read from the store), back to back, twice, on the same server; the
   per-model compute time of each run from Triton's statistics (the user_state step's is the
   Redis read), and the CPU each step's stubs and redis-server spent per request;
2. freshness under Locust's by-id traffic: a user's engagement, written through the event path
   (`UserStateStore.apply`), until a feed's logged history holds it; a followed author's new
   post until it is in the follower's feed;
3. Redis killed under load: requests carrying their history, by-id requests (how fast and how
   they fail), and how soon by-id requests succeed after Redis restarts on the same port.

The by-id users are the first --population users of the trained world of --world (Zipf's law
draws which of them send), loaded into the store once. The store's users and parts 2 and 3 are
in bench/user_state_probes.py; this module runs part 1 and the whole.

    python -m bench.bench_user_state --artifacts artifacts/trained-demo,artifacts/demo
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving_measure import Measurement, measure_served, write_input_data
from bench.user_state_probes import (
    by_id,
    drawn_users,
    freshness,
    kill_under_load,
    load_world,
    model_stats,
    with_history,
)
from harness import REPO_ROOT
from harness.process_cpu import cpu_ms_per_request, served_cpu_seconds
from harness.results import add_work_and_out, shown_path, write_results
from harness.triton import start_triton
from phoenix.checkpoint import load_config
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.server import RedisServer
from phoenix.util.command_line import command_parser

RESULTS = REPO_ROOT / "bench" / "results"
WORK = REPO_ROOT / "build" / "bench-user-state"


# ----------------------------------------------------------------------------------------
# 1. Throughput by id vs with history
# ----------------------------------------------------------------------------------------


def stats_between(before: dict, after: dict) -> dict[str, dict]:
    """Per model: batches, requests and the compute / queue time per batch of the interval."""
    out = {}
    for name, end in after.items():
        start = before.get(name, {k: 0 for k in end})
        batches = end["executions"] - start["executions"]
        if batches <= 0:
            continue
        out[name] = {
            "batches": batches,
            "requests": end["inferences"] - start["inferences"],
            "compute_ms_per_batch": round(
                (end["compute_ns"] - start["compute_ns"]) / batches / 1e6, 2
            ),
            "queue_ms_per_request": round(
                (end["queue_ns"] - start["queue_ns"])
                / max(1, end["inferences"] - start["inferences"])
                / 1e6,
                2,
            ),
        }
    return out


def runs_by_kind(runs: list[dict]) -> dict[str, list[dict]]:
    return {kind: [r for r in runs if r["kind"] == kind] for kind in ("by_id", "with_history")}


def mean_in_network(store: UserStateStore, users: list[int], seq_len: int) -> float:
    """In-network posts not yet served to the user, per request of ``users`` now (the mean
    over the list): the candidates a by-id request adds before ranking, at a run's start
    (they fall as the run serves them)."""
    states = store.state(users, time.time(), seq_len)
    return float(
        np.mean([np.isin(s.in_network.post_ids, s.served, invert=True).sum() for s in states])
    )


def throughput(args, server, redis_pid: int, store, world, artifacts: Path, work: Path) -> dict:
    seq_len = load_config(artifacts).history_seq_len
    users = drawn_users(store, world, args.population, args.requests, seq_len, args.seed)
    data = {
        "by_id": write_input_data(work / "by_id.json", [by_id(u) for u in users]),
        "with_history": write_input_data(
            work / "history.json", with_history(store, users, seq_len)
        ),
    }
    runs: list[dict[str, Any]] = []
    for round_number in range(args.rounds):
        for kind in ("by_id", "with_history"):
            m = Measurement(kind, "recommend", "grpc", "dynamic", args.concurrency)
            # the ranker's extra candidates in the by-id requests of this run
            in_network = mean_in_network(store, users, seq_len) if kind == "by_id" else 0.0
            before = model_stats(server.http_url)
            cpu_before = served_cpu_seconds(server.process.pid, redis=redis_pid)
            measure_served(m, server.grpc_url, data[kind], args.window, quick=True)
            cpu_after = served_cpu_seconds(server.process.pid, redis=redis_pid)
            steps = stats_between(before, model_stats(server.http_url))
            served = steps.get("recommend", {}).get("requests", 0)
            runs.append(
                {
                    "round": round_number + 1,
                    "kind": kind,
                    "throughput": round(m.throughput, 2),
                    "p50_ms": round(m.p50_ms, 1),
                    "p99_ms": round(m.p99_ms, 1),
                    "unstable": m.unstable,
                    "error": m.error,
                    "steps": steps,
                    "cpu_ms_per_request": cpu_ms_per_request(cpu_before, cpu_after, served),
                    "in_network_candidates_mean": round(in_network, 1),
                }
            )
            cpu = runs[-1]["cpu_ms_per_request"]
            print(
                f"  {kind}: {m.throughput:.1f} req/s, p50 {m.p50_ms:.0f} ms, "
                f"{cpu['total']:.1f} CPU-ms per request (ranker {cpu.get('ranker', 0):.1f}), "
                f"in-network {in_network:.1f}"
                f"{' (unstable)' if m.unstable else ''}{' ' + m.error if m.error else ''}",
                flush=True,
            )
    mean = {
        kind: float(np.mean([r["throughput"] for r in of_kind]))
        for kind, of_kind in runs_by_kind(runs).items()
    }
    return {
        "users": len(users),
        "distinct_users": len(set(users)),
        "concurrency": args.concurrency,
        "runs": runs,
        "mean_req_per_s": {k: round(v, 2) for k, v in mean.items()},
        "by_id_over_with_history": round(mean["by_id"] / max(mean["with_history"], 1e-9), 3),
        "cpu_ms_per_request_mean": {
            kind: round(float(np.mean([r["cpu_ms_per_request"]["total"] for r in of_kind])), 2)
            for kind, of_kind in runs_by_kind(runs).items()
        },
    }


# ----------------------------------------------------------------------------------------
# One server per artifact directory
# ----------------------------------------------------------------------------------------


def measure_artifacts(args, artifacts: Path, full: bool) -> dict:
    work = args.work / artifacts.name
    work.mkdir(parents=True, exist_ok=True)
    redis = RedisServer().start()
    try:
        store = UserStateStore(connect_store(redis.url))
        world, loaded = load_world(store, args.world, args.population)
        env = {USER_STATE_URL_ENV: redis.url}
        server = start_triton(
            REPO_ROOT / "model_repository",
            artifacts,
            env=env,
            log_path=work / "tritonserver.log",
            exit_timeout_secs=5,
        )
        try:
            row: dict[str, Any] = {"artifacts": shown_path(artifacts), "loaded": loaded}
            print(f"{shown_path(artifacts)}: throughput by id vs with history", flush=True)
            assert redis.process is not None  # started above
            row["throughput"] = throughput(
                args, server, redis.process.pid, store, world, artifacts, work
            )
            if full:
                print("freshness under Locust", flush=True)
                row["freshness"] = freshness(args, server, store, redis.url, artifacts, work)
                print("Redis killed under load", flush=True)
                seq_len = load_config(artifacts).history_seq_len
                users = drawn_users(store, world, args.population, 1, seq_len, args.seed)
                row["redis_killed"], redis = kill_under_load(
                    args, server, redis, store, users, seq_len
                )
            return row
        finally:
            server.stop()
    finally:
        redis.stop()


def parse_args(argv=None) -> argparse.Namespace:
    examples = (
        "Example:\n  python -m bench.bench_user_state --artifacts artifacts/trained-demo --probes 3"
    )
    parser = command_parser("python -m bench.bench_user_state", __doc__, examples)
    parser.add_argument(
        "--artifacts",
        default="artifacts/trained-demo,artifacts/demo",
        help="served artifact directories, comma-separated; the first also gets "
        "the freshness and Redis-kill measurements (default: %(default)s)",
    )
    parser.add_argument(
        "--world",
        type=Path,
        default=Path("artifacts/trained-demo"),
        help="trained artifacts whose world's users are loaded (%(default)s)",
    )
    parser.add_argument("--population", type=int, default=1000, help="world users loaded")
    parser.add_argument("--requests", type=int, default=128, help="perf_analyzer's requests")
    parser.add_argument("--concurrency", type=int, default=4, help="perf_analyzer's")
    parser.add_argument("--window", type=int, default=100, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="by id / with history pairs")
    parser.add_argument("--probes", type=int, default=5, help="freshness probes of each kind")
    parser.add_argument("--locust-users", type=int, default=4)
    parser.add_argument("--probe-gap-s", type=float, default=3.0, help="seconds between probes")
    parser.add_argument(
        "--phase-s",
        type=float,
        default=5.0,
        help="seconds before the kill, while down, and after the restart",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_work_and_out(parser, WORK, RESULTS / "user_state_load.json")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dirs = [Path(d).resolve() for d in args.artifacts.split(",") if d]
    rows = [measure_artifacts(args, d, full=(i == 0)) for i, d in enumerate(dirs)]
    result = {
        "what": "recommend by user id under load (bench/bench_user_state.py)",
        "command": "python -m bench.bench_user_state "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "world": shown_path(args.world.resolve()),
        "population": args.population,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, shared with other work",
        "servers": rows,
    }
    write_results(args.out, result)
    print(json.dumps(result, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
