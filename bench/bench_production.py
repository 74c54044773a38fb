"""X's production ranker served against the same code in process, at X's nano geometry
(1,022 history posts x 64 candidates, every production input filled), and the forward's FLOP
rate against this machine's matmul rate, all measured in one run on one machine.

    make bench-production                               # build/production-nano, made if absent
    python -m bench.bench_production --quick            # short windows and timings
    python -m bench.bench_production --artifacts DIR --concurrency 1,4,16 --protocols grpc,http

First the matmul rate: jitted float32 and bfloat16 matmuls of the forward's shapes (a prefix
layer's projections of 1,024 tokens, one user and eight) on this CPU, best of several. Then
``--rounds`` rounds over the concurrency levels and protocols; at each point, one right after
the other so that each has the machine's cores to itself and the load of other work on a
shared machine drifts little between them:

1. in process: the ranker's service (``ProductionRankerService.handle``, what the model wraps,
   built with the parameters the server reports) on the same requests, one user per call (and
   8, the most the dynamic batcher puts in one call, beyond c=1);
2. served: the ``ranker`` of a tritonserver (the CPU profile: dynamic batching, two instances;
   the ranker alone loaded, its prefix cache off) under perf_analyzer, with the CPU seconds the
   server's processes spent a request.

Then Locust's own load test (``loadtest/locustfile.py``, HTTP and gRPC users, generated
requests at the served geometry) against the same server for ``--locust-seconds``: requests,
failures, rate and latency. Any failed request, served or Locust's, exits 1.

Reports per point the medians over the rounds: served requests/s and latency, the ratio served
/ in process (c=1 against one user a call, beyond against the better of 1 and 8), CPU seconds
a request on each side, the forward's FLOPs per request (``bench.flops.production_flops``,
beside XLA's own count of the two programs) and the FLOP rates against the matmul rate.
Writes bench/results/production-serving.json (production-serving-quick.json with --quick)
and, with --docs, the table of docs/production.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import numpy as np

from bench import serving_measure as measure
from bench.flops import production_flops
from clients.workload import random_users
from harness import REPO_ROOT
from harness.bench_options import (
    DEFAULT_ARTIFACTS,
    PRODUCTION_DOCS,
    in_process_batches,
    production_args,
    production_repository,
    served_profile,
)
from harness.locust_runs import locust_totals, stats_rows
from harness.machine import machine, require_device
from harness.production_report import summarize, table
from harness.results import command_line, shown_path
from harness.triton import start_triton
from phoenix.checkpoint import load_config
from phoenix.client.client import connect, ranker_inputs
from phoenix.client.inprocess import InProcessModels
from phoenix.schema.contracts import RANKER
from phoenix.util.doc_blocks import with_block

TABLE_START, TABLE_END = "<!-- production-serving:start -->", "<!-- production-serving:end -->"

# ----------------------------------------------------------------------------------------
# The machine's matmul rate
# ----------------------------------------------------------------------------------------

MATMULS = {  # name: (rows, inner, columns): the prefix's projections, one user and eight
    "qkv 1 user (1024x512 @ 512x1024)": (1024, 512, 1024),
    "ffn up 8 users (8192x512 @ 512x1024)": (8192, 512, 1024),
}
# On a GPU also one the device's tensor cores run near their peak: nano's own shapes are far
# too small to fill an H200, and the share of the peak is the figure asked for there.
PEAK_MATMUL = {"peak (8192x8192 @ 8192x8192)": (8192, 8192, 8192)}


def matmul_rates(seconds: float, device: str = "cpu") -> dict[str, dict[str, float]]:
    """GFLOP/s of jitted matmuls in float32 and bfloat16 (float32 accumulation), the best
    call of those run within ``seconds`` per shape and dtype (on a GPU, PEAK_MATMUL too)."""
    import jax
    import jax.numpy as jnp

    rates: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(0)
    for dtype in ("float32", "bfloat16"):
        rates[dtype] = {}
        for name, (m, k, n) in (MATMULS | (PEAK_MATMUL if device == "gpu" else {})).items():
            a = jnp.asarray(rng.standard_normal((m, k)), dtype)
            b = jnp.asarray(rng.standard_normal((k, n)), dtype)
            product = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
            product(a, b).block_until_ready()
            best, started = float("inf"), time.perf_counter()
            while time.perf_counter() - started < seconds:
                t0 = time.perf_counter()
                product(a, b).block_until_ready()
                best = min(best, time.perf_counter() - t0)
            rates[dtype][name] = 2 * m * k * n / best / 1e9
    return rates


# ----------------------------------------------------------------------------------------
# The requests, the programs' FLOPs
# ----------------------------------------------------------------------------------------


def ensure_artifacts(artifacts: Path) -> None:
    if (artifacts / "config.json").is_file():
        return
    if artifacts.resolve() != DEFAULT_ARTIFACTS.resolve():
        raise SystemExit(f"{artifacts}: no artifact directory (phoenix-artifacts --ranker "
                         "production --preset nano --out DIR makes one)")  # fmt: skip
    from phoenix.production_artifacts import generate_production

    print(f"== generating {shown_path(artifacts)} (nano preset)", flush=True)
    generate_production("nano", artifacts, progress=True)


def make_requests(args, config) -> list[dict[str, np.ndarray]]:
    """Users with full histories and every production input, ``candidates`` each."""
    history = config.history_seq_len
    users = random_users(
        args.artifacts, args.users, args.seed, history_len=history, num_candidates=args.candidates
    )
    return [ranker_inputs(user) for user in users]


def xla_flops(models: InProcessModels, candidates: int) -> dict[str, float]:
    """XLA's own FLOP count (its cost analysis of the lowered programs) of one user's prefix
    and ``candidates`` candidates: a check of ``production_flops``' count (XLA counts the
    elementwise work too)."""
    from phoenix.schema.batches import empty_batch
    from phoenix.stub.services.ranker import batch_widths

    service = models.service("ranker")
    engine = service.ranker
    batch = empty_batch(RANKER, 1, batch_widths(service.config, candidates))
    user, history, cands = engine.inputs(batch)
    prefix = engine._prefix._jit.lower(engine.weights, engine.table, user, history)
    cache = engine._prefix.output_shapes(engine.weights, engine.table, user, history)
    scored = engine._candidates._jit.lower(engine.weights, engine.table, cache, cands, engine.blend)

    def flops(lowered) -> float:
        analysis = lowered.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        return float(analysis.get("flops", 0.0))

    return {"prefix": flops(prefix), "candidates": flops(scored)}


# ----------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------


def in_process(models: InProcessModels, requests: list[dict], seconds: float, batches) -> dict:
    """The service's ``handle`` in this process, ``batch`` users a call for each of
    ``batches``: requests/s, latency and CPU seconds a request (this process's)."""
    cursor = [0]

    def take(n: int) -> list[dict]:
        start = cursor[0]
        cursor[0] = (start + n) % len(requests)
        return [requests[(start + i) % len(requests)] for i in range(n)]

    figures = {}
    for batch in batches:
        started = time.process_time()
        call = lambda b=batch: models.run_many("ranker", take(b))  # noqa: E731
        rate = measure.timed_rate(call, batch, seconds)
        rate["cpu_s_per_request"] = (time.process_time() - started) / (batch * (rate["calls"] + 1))
        figures[f"batch_{batch}"] = rate
        print(f"  in process, {batch} user(s) a call: {rate['throughput']:.2f} req/s, "
              f"p50 {rate['p50_ms']:.0f} ms, {rate['cpu_s_per_request']:.2f} CPU-s a request",
              flush=True)  # fmt: skip
    return figures


def server_cpu_s(server) -> float:
    """CPU seconds of the server's processes so far (tritonserver and its stubs)."""
    import psutil

    root = psutil.Process(server.process.pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # gone meanwhile
            continue
        total += times.user + times.system
    return total


def ranker_successes(http_url: str) -> int:
    stats = connect(http_url, "http").get_inference_statistics("ranker")["model_stats"]
    return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)


def served(server, protocol: str, concurrency: int, args, data: Path) -> dict:
    """perf_analyzer at one point, and the server's CPU seconds a request meanwhile."""
    url = server.http_url if protocol == "http" else server.grpc_url
    m = measure.Measurement("production", "ranker", protocol, "on", concurrency)
    cpu, done = server_cpu_s(server), ranker_successes(server.http_url)
    measure.measure_served(m, url, data, args.window_requests, args.quick)
    count = ranker_successes(server.http_url) - done
    row = asdict(m)
    row["server_cpu_s_per_request"] = (server_cpu_s(server) - cpu) / count if count else None
    print(f"  served {protocol} c={concurrency}: {m.throughput:.2f} req/s, p50 "
          f"{m.p50_ms:.0f} p99 {m.p99_ms:.0f} ms, batch {m.avg_batch:.1f}, "
          f"{row['server_cpu_s_per_request'] or 0:.2f} CPU-s a request"
          f"{' ERROR ' + m.error if m.error else ''}", flush=True)  # fmt: skip
    return row


def measure_round(models, server, args, requests, data) -> list[dict]:
    """Each point of a round: in process, then served right after (c=1 against one user a
    call; beyond against the best of ``in_process_batches``)."""
    points = []
    for concurrency in args.concurrency:
        for protocol in args.protocols:
            batches = in_process_batches(concurrency, models.max_batch[RANKER.name])
            inner = in_process(models, requests, args.timing_s, batches)
            points.append({
                "protocol": protocol, "concurrency": concurrency, "in_process": inner,
                "served": served(server, protocol, concurrency, args, data),
            })  # fmt: skip
    return points


def locust_run(server, args) -> dict:
    """Locust's own load test (HTTP and gRPC users drawing generated requests at the served
    geometry) against the running server: requests, failures, rate and latency."""
    prefix = args.build_dir / "locust" / "locust"
    command = [
        sys.executable, str(REPO_ROOT / "loadtest" / "locustfile.py"),
        "--artifacts", str(args.artifacts), "--host", "127.0.0.1",
        "--http-port", str(server.http_port), "--grpc-port", str(server.grpc_port),
        "--users", str(args.locust_users), "--spawn-rate", str(args.locust_users),
        "--run-time", f"{int(args.locust_seconds)}s", "--results", str(prefix.parent),
    ]  # fmt: skip
    print(f"== Locust, {args.locust_users} users for {args.locust_seconds:.0f} s", flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          timeout=args.locust_seconds + 300)  # fmt: skip
    totals, total = locust_totals(prefix), stats_rows(prefix).get("Aggregated", {})
    figures = {
        "users": args.locust_users, "seconds": args.locust_seconds,
        "exit_code": done.returncode, "requests": totals.requests, "failures": totals.failures,
        "req_s": float(total.get("Requests/s", 0)), "p50_ms": float(total.get("50%", 0)),
        "p99_ms": float(total.get("99%", 0)),
    }  # fmt: skip
    print(f"  {figures['requests']} requests, {figures['failures']} failed, "
          f"{figures['req_s']:.2f} req/s, p50 {figures['p50_ms']:.0f} p99 "
          f"{figures['p99_ms']:.0f} ms (exit {done.returncode})", flush=True)  # fmt: skip
    return figures


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = production_args(argv, __doc__)
    require_device(args.device)
    ensure_artifacts(args.artifacts)
    config = load_config(args.artifacts)
    if config.ranker_family != "production":
        raise SystemExit(f"{args.artifacts}: the ranker is of the {config.ranker_family} family")
    from phoenix.checkpoint.production import production_config
    from phoenix.ops.compile import ensure_programs

    ranker = production_config(config)
    args.candidates = args.candidates or ranker.candidate_seq_len
    args.build_dir.mkdir(parents=True, exist_ok=True)
    served_repository = production_repository(args)
    ensure_programs(args.artifacts, args.device, served_repository, [RANKER.name])
    requests = make_requests(args, config)
    data = measure.write_input_data(args.build_dir / "ranker.json", requests)
    results: dict[str, Any] = {
        "command": command_line("bench.bench_production", argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "settings": {
            "artifacts": shown_path(args.artifacts),
            "history": config.history_seq_len,
            "candidates": args.candidates,
            "users": args.users,
            "profile": args.device,
            "instances": args.instances or served_profile(args).models["ranker"].instances,
            "concurrency": args.concurrency,
            "protocols": args.protocols,
            "window_requests": args.window_requests,
            "quick": args.quick,
        },  # fmt: skip
        "flops_per_request": production_flops(ranker, args.candidates),
    }
    started = time.monotonic()
    print("== matmul rate of this machine", flush=True)
    results["matmul_gflops"] = matmul_rates(0.5 if args.quick else 3.0, args.device)
    print(f"  {results['matmul_gflops']}", flush=True)
    log = args.build_dir / "tritonserver.log"
    print(f"== starting tritonserver (the ranker alone; log {shown_path(log)})", flush=True)
    server = start_triton(
        served_repository, args.artifacts, log_path=log, exit_timeout_secs=5,
        model_control_mode="explicit", load_model=["ranker"],
    )  # fmt: skip
    try:
        print("== in process (the server idle meanwhile)", flush=True)
        client = connect(server.http_url, "http")
        models = InProcessModels.like_server(client, "http", args.artifacts.resolve(),
                                             models=(RANKER.name,), batched=True)  # fmt: skip
        results["settings"]["max_batch"] = models.max_batch[RANKER.name]
        before = measure.failure_counts(server.http_url)
        results["rounds"] = []
        for round_ in range(args.rounds):
            print(f"== round {round_ + 1} of {args.rounds}", flush=True)
            results["rounds"].append(measure_round(models, server, args, requests, data))
        if args.locust_seconds > 0:
            results["locust"] = locust_run(server, args)
        results["xla_flops"] = xla_flops(models, args.candidates)
        after = measure.failure_counts(server.http_url)
        results["failed_requests"] = after.get("ranker", 0) - before.get("ranker", 0)
    finally:
        server.stop()
    results["machine"]["load_avg_end"] = [round(v, 2) for v in os.getloadavg()]
    results["wall_s"] = time.monotonic() - started
    results["summary"] = summarize(results)
    text = table(results)
    print(f"\n{text}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {shown_path(args.out)} ({results['wall_s']:.0f} s)")
    if args.docs:
        docs = PRODUCTION_DOCS
        docs.write_text(with_block(docs.read_text(), TABLE_START, TABLE_END, text, docs))
        print(f"rewrote the table of {shown_path(docs)}")
    served_rows = [point["served"] for r in results["rounds"] for point in r]
    errors = results["failed_requests"] or any(row["error"] for row in served_rows)
    errors = errors or (results.get("locust") or {}).get("failures", 0) != 0
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
