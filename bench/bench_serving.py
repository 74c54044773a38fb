"""Serving benchmark: Triton (perf_analyzer) against the in-process services, same requests.

Workloads: `ranker` with 64 and with 512 candidates per user, and the `recommend` ensemble
(top_k 100); users have full histories, ids drawn from the artifact corpus. For each workload
perf_analyzer measures throughput and p50/p95/p99 latency at each concurrency, over HTTP and
gRPC, with dynamic batching on (model_repository as it is) and off (a derived copy without
dynamic_batching). Both servers run at once and the settings are measured back to back at each
point, so drifting load from other work on the machine distorts the ratios less. In the same
run the services that the models wrap are timed in this process on the same requests, one user
per call and 8 users per call (what the batcher can form).

    python bench/bench_serving.py            # full run: writes bench/results/serving.{json,png}
    python bench/bench_serving.py --quick    # sanity run: bench/results/serving-quick.*

Writes a JSON of every figure, a plot (throughput and p99 latency against concurrency, one
line per setting) and, with --docs, the ratio table of docs/performance.md.

This file holds the options and the run; `serving_measure` the requests, the in-process timing
and perf_analyzer; `serving_servers` the servers; `serving_report` the ratios, table and plot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

from bench import serving_measure as measure
from bench import serving_report as report
from bench.serving_servers import start_servers, stop_servers
from clients.workload import random_users
from harness.results import shown_path
from phoenix.checkpoint import load_config
from phoenix.client.client import connect
from phoenix.client.inprocess import InProcessModels
from phoenix.ops import profiles
from phoenix.ops.triton_server import TritonServer
from phoenix.util.command_line import command_name, command_parser

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
DOCS = REPO_ROOT / "docs" / "performance.md"


# ----------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def name_list(choices: Sequence[str]):
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = sorted(set(names) - set(choices))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return names

    return parse


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser(command_name("bench.bench_serving"), __doc__)
    add = parser.add_argument
    artifacts = "artifact directory to serve (default: artifacts/demo)"
    add("--artifacts", type=Path, default=REPO_ROOT / "artifacts" / "demo", help=artifacts)
    repository = "repository measured with batching on; batching off is a derived copy "
    repository += "(default: model_repository)"
    add("--model-repository", type=Path, default=REPO_ROOT / "model_repository", help=repository)
    device = "instance kind of both servers' models, as `serve --device` (default: cpu)"
    add("--device", choices=("cpu", "gpu"), default="cpu", help=device)
    quick = "fast sanity run: concurrency 1,16, short windows and timings; writes "
    quick += "serving-quick.json/png and leaves the docs alone"
    add("--quick", action="store_true", help=quick)
    levels = "comma-separated concurrency levels (default: 1,4,16,64)"
    add("--concurrency", type=int_list, help=levels)
    protocols = "comma-separated, from http,grpc (default: both)"
    add("--protocols", type=name_list(("http", "grpc")), default=["http", "grpc"], help=protocols)
    batching = "dynamic batching settings, from on,off (default: both)"
    add("--batching", type=name_list(("on", "off")), default=["on", "off"], help=batching)
    workloads = f"comma-separated, from {','.join(measure.WORKLOADS)} (default: all)"
    names = list(measure.WORKLOADS)
    add("--workloads", type=name_list(tuple(names)), default=names, help=workloads)
    instances = "instances per model instead of the profile's, as MODEL=N,... (e.g. ranker=8)"
    add("--instances", type=profiles.instance_counts_arg, default={}, help=instances)
    window = "requests per perf_analyzer measurement window, at least twice the concurrency "
    window += "(default: 60; quick: 20)"
    add("--window-requests", type=int, help=window)
    users = "distinct random users cycled through (default: %(default)s)"
    add("--users", type=int, default=16, help=users)
    add("--seed", type=int, default=0, help="seed of the users (default: 0)")
    out = "JSON of all figures (default: bench/results/serving.json, serving-quick.json with "
    add("--out", type=Path, help=out + "--quick)")
    add("--plot", type=Path, help="PNG plot (default: beside --out)")
    docs = f"markdown file whose serving table (between the markers {report.TABLE_START} ... "
    docs += f"{report.TABLE_END}) is rewritten (default: docs/performance.md, none with --quick)"
    add("--docs", type=Path, help=docs)
    build = "derived repository, input data and server logs (default: build/bench)"
    add("--build-dir", type=Path, default=REPO_ROOT / "build" / "bench", help=build)
    args = parser.parse_args(argv)
    stem = "serving-quick" if args.quick else "serving"
    args.concurrency = args.concurrency or ([1, 16] if args.quick else [1, 4, 16, 64])
    args.window_requests = args.window_requests or (20 if args.quick else 60)
    args.out = args.out or RESULTS / f"{stem}.json"
    args.plot = args.plot or args.out.with_suffix(".png")
    if args.docs is None and not args.quick:
        args.docs = DOCS
    args.timing_s = 0.5 if args.quick else 3.0
    return args


# ----------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------


def measure_all(servers: dict[str, TritonServer], args, data: dict[str, Path], results) -> None:
    """Every workload and concurrency, with the settings back to back.

    On a shared machine the load of others drifts over minutes: measuring the settings one
    after the other at each point keeps that drift out of the on/off and gRPC/HTTP ratios.
    """
    before = {b: measure.failure_counts(s.http_url) for b, s in servers.items()}
    for workload in args.workloads:
        for concurrency in args.concurrency:
            for batching, server in servers.items():
                for protocol in args.protocols:
                    url = server.http_url if protocol == "http" else server.grpc_url
                    model = measure.WORKLOADS[workload][0]
                    m = measure.Measurement(workload, model, protocol, batching, concurrency)
                    measure.measure_served(m, url, data[workload], args.window_requests, args.quick)
                    print_measurement(m)
                    results["served"].append(asdict(m))
                    # A run cut short (a time-limited GPU lease) keeps what it measured.
                    partial = args.build_dir / "served-so-far.json"
                    partial.write_text(json.dumps(results, indent=2) + "\n")
    for batching, server in servers.items():
        after = measure.failure_counts(server.http_url)
        failed = {k: after[k] - before[batching].get(k, 0) for k in after}
        results["failed_requests"][batching] = failed


def measure_in_process_all(http_url: str, args, results: dict) -> None:
    print("== in process (the servers idle meanwhile)", flush=True)
    client = connect(http_url, "http")
    # each service's settings are asked of the server when first used: it serves only the
    # workloads' models
    artifacts = args.artifacts.resolve()
    models = InProcessModels.like_server(client, "http", artifacts, models=(), batched=True)
    users = make_users(args)
    results["in_process"] = {}
    for workload in args.workloads:
        requests = [measure.request_arrays(workload, user) for user in users]
        figures = measure.measure_in_process(models, workload, requests, args.timing_s)
        results["in_process"][workload] = figures
        batched = measure.IN_PROCESS_BATCH
        print(
            f"  {workload:<11} batch 1: {figures['batch_1']['throughput']:8.1f} req/s   "
            f"batch {batched}: {figures[f'batch_{batched}']['throughput']:8.1f} req/s",
            flush=True,
        )


def make_users(args) -> list[dict]:
    """Users with full histories (the ranker's cost does not depend on the history length)."""
    history = load_config(args.artifacts).history_seq_len
    return random_users(
        args.artifacts, args.users, args.seed,
        history_len=history, num_candidates=512, top_k=measure.RECOMMEND_TOP_K,
    )  # fmt: skip


def print_measurement(m: measure.Measurement) -> None:
    where = f"  {m.workload:<11} batching {m.batching:<3} {m.protocol:<4} c={m.concurrency:<3}"
    if m.error:
        print(f"{where} ERROR {m.error}", flush=True)
        return
    flag = " (unstable)" if m.unstable else ""
    print(
        f"{where} {m.throughput:8.1f} req/s  "
        f"p50 {m.p50_ms:7.1f}  p95 {m.p95_ms:7.1f}  p99 {m.p99_ms:7.1f} ms  "
        f"batch {m.avg_batch:4.1f}{flag}",
        flush=True,
    )


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    args.build_dir.mkdir(parents=True, exist_ok=True)
    users = make_users(args)
    data = {
        w: measure.write_input_data(
            args.build_dir / f"{w}.json", [measure.request_arrays(w, u) for u in users]
        )
        for w in args.workloads
    }
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(),
        "settings": {
            "artifacts": shown_path(args.artifacts),
            "model_repository": shown_path(args.model_repository),
            "device": args.device,
            "instances": args.instances or "the profile's",
            "concurrency": args.concurrency,
            "window_requests": args.window_requests,
            "users": args.users,
            "history": "full (history_seq_len)",
            "recommend_top_k": measure.RECOMMEND_TOP_K,
            "quick": args.quick,
        },
        "served": [],
        "failed_requests": {},
    }
    started = time.monotonic()
    servers = start_servers(args)
    try:
        measure_in_process_all(next(iter(servers.values())).http_url, args, results)
        measure_all(servers, args, data, results)
    finally:
        stop_servers(servers)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["wall_s"] = time.monotonic() - started
    results["summary"] = report.summarize(results)
    table = report.markdown_table(results)
    print(f"\n{table}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    report.plot(results, args.plot)
    print(f"wrote {args.out} and {args.plot} ({results['wall_s']:.0f} s)")
    if args.docs:
        report.update_docs(args.docs, table, results)
    failed = sum(sum(v.values()) for v in results["failed_requests"].values())
    return 1 if failed or any(r["error"] for r in results["served"]) else 0


if __name__ == "__main__":
    sys.exit(main())
