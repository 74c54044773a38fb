"""Soak test: a long run at about half capacity, with failures, latency over time and memory.

    python bench/soak.py --duration 600                 # what `make soak` runs
    python bench/soak.py --duration 60 --out-prefix bench/results/soak-short

Starts its own server (the serve command's flags: explicit model control, supervisor) over
--artifacts on free loopback ports, unless --http-url/--grpc-url name a running one. It
measures capacity (closed loop), then sends requests at a fixed rate (open loop: latency is
counted from when a request was due, so a stalled server cannot hide its backlog), half over
HTTP and half over gRPC, and samples the resident memory (RSS) of tritonserver and every stub.
Writes JSON and PNG; exits 1 when a request failed or memory grew by more than --max-rss-growth.

The load comes from `harness/loadgen.py` (why not Locust or perf_analyzer: see its
docstring; in short, an open loop with every answer checked, reported in 10 s windows).
Every run is bounded in time and in request count.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from harness.loadgen import (
    LoadRun,
    Outcome,
    alternating_callers,
    measure_capacity,
    percentiles_ms,
    summarize,
)
from harness.memory import server_rss
from harness.results import write_results
from harness.triton import start_triton
from phoenix.util.command_line import command_parser

REPO_ROOT = Path(__file__).resolve().parents[1]


def rss_growth_pct(start: Mapping[str, int], end: Mapping[str, int]) -> dict[str, float]:
    return {
        name: round(100.0 * (end[name] - start[name]) / start[name], 2)
        for name in start
        if start[name] and name in end
    }


# ------------------------------------------------------------------------------------------
# The soak
# ------------------------------------------------------------------------------------------


def recommend_caller_factory(http_url: str, grpc_url: str, artifacts: Path, top_k: int):
    """Callers of the end-to-end `recommend` ensemble, even workers HTTP, odd ones gRPC."""
    from phoenix.checkpoint import load_example_sequence
    from phoenix.client.client import recommend_inputs

    inputs = recommend_inputs(load_example_sequence(artifacts).to_dict(), top_k=top_k)

    def check(outputs: dict[str, np.ndarray]) -> None:
        ranked = outputs["ranked_post_ids"]
        if ranked.shape[0] != 1 or not 0 < ranked.shape[1] <= top_k:
            raise AssertionError(f"wrong answer: ranked_post_ids of shape {ranked.shape}")

    return alternating_callers(
        http_url, grpc_url, "recommend", inputs, outputs=["ranked_post_ids"], check=check
    )


def windows(outcomes: Sequence[Outcome], start: float, width_s: float) -> list[dict]:
    """Per-window counts and latency percentiles (by due time)."""
    if not outcomes:
        return []
    last = max(o.due for o in outcomes)
    rows = []
    for index in range(int((last - start) // width_s) + 1):
        lo = start + index * width_s
        chosen = [o for o in outcomes if lo <= o.due < lo + width_s]
        ok = [o.latency for o in chosen if o.ok]
        rows.append(
            {
                "t_s": round(index * width_s, 1),
                "requests": len(chosen),
                "failed": len(chosen) - len(ok),
                **percentiles_ms(ok),
            }
        )
    return rows


def sample_memory(server_pid: int, stop: threading.Event, every_s: float, out: list) -> None:
    start = time.monotonic()
    while True:
        out.append({"t_s": round(time.monotonic() - start, 1), **server_rss(server_pid)})
        if stop.wait(every_s):
            return


def start_own_server(artifacts: Path, log_dir: Path):
    """A server configured like `serve` (explicit control mode + supervisor) on free ports."""
    from phoenix.ops.admin_key import server_admin_key
    from phoenix.ops.serve import DEFAULT_MODEL_REPOSITORY, server_flags
    from phoenix.ops.supervisor.state import Supervisor

    admin_key, _ = server_admin_key(log_dir)  # $PHOENIX_ADMIN_KEY, else log_dir/admin-key
    server = start_triton(
        REPO_ROOT / DEFAULT_MODEL_REPOSITORY,
        artifacts,
        log_path=log_dir / f"soak-tritonserver-{int(time.time())}.log",
        ready_timeout=900,
        **server_flags(supervised=True, admin_key=admin_key),
    )
    assert server.pid is not None  # start_triton returns it running
    supervisor = Supervisor(server.http_url, server.pid, admin_key=admin_key).start()
    return server, supervisor


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    rows = result["windows"]
    t = [r["t_s"] for r in rows]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        lat.plot(t, [r[key] if r[key] is not None else np.nan for r in rows], label=key[:3])
    failed = [r["t_s"] for r in rows if r["failed"]]
    if failed:
        lat.scatter(failed, [0] * len(failed), color="red", marker="x", label="failures")
    lat.set_ylabel("latency of right answers (ms)")
    lat.set_title(
        f"soak: {result['rate_rps']:.0f} req/s for {result['duration_s']:.0f} s, "
        f"{result['totals']['failed']} failed of {result['totals']['requests']}"
    )
    lat.legend()
    lat.grid(alpha=0.3)
    samples = result["memory"]["samples"]
    names = [n for n in samples[0] if n not in ("t_s", "total")]
    for name in names:
        mem.plot([s["t_s"] for s in samples], [s.get(name, 0) / 2**20 for s in samples], label=name)
    mem.set_ylabel("RSS (MiB)")
    mem.set_xlabel("seconds into the soak")
    mem.legend(fontsize=8)
    mem.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_soak(args: argparse.Namespace) -> dict:
    server = supervisor = None
    if args.http_url:
        http_url, grpc_url, server_pid = args.http_url, args.grpc_url, args.server_pid
    else:
        server, supervisor = start_own_server(args.artifacts, args.log_dir)
        http_url, grpc_url, server_pid = server.http_url, server.grpc_url, server.pid
        print(f"server ready after {server.ready_after_s:.1f} s", flush=True)
    try:
        make = recommend_caller_factory(http_url, grpc_url, args.artifacts, args.top_k)
        capacity = args.capacity or measure_capacity(make, 8, 10.0)["ok_per_s"] or 0.0
        rate = args.rate or max(1.0, args.load_fraction * capacity)
        print(
            f"capacity {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {args.duration:.0f} s",
            flush=True,
        )
        samples: list[dict] = []
        stop_sampling = threading.Event()
        sampler = None
        if server_pid:
            sampler = threading.Thread(
                target=sample_memory,
                args=(server_pid, stop_sampling, args.window, samples),
                daemon=True,
            )
            sampler.start()
        run = LoadRun(make, workers=args.workers, duration_s=args.duration, rate=rate)
        run.start().wait(args.duration + 120)
        stop_sampling.set()
        if sampler:
            sampler.join(10)
            samples.append(
                {"t_s": round(time.monotonic() - run.started_at, 1), **server_rss(server_pid)}
            )
        outcomes = run.snapshot()
        result = {
            "model": "recommend",
            "top_k": args.top_k,
            "artifacts": str(args.artifacts),
            "protocols": "http+grpc (alternating workers)",
            "capacity_rps": round(capacity, 2),
            "rate_rps": round(rate, 2),
            "duration_s": args.duration,
            "workers": args.workers,
            "totals": summarize(outcomes, args.duration),
            "windows": windows(outcomes, run.started_at, args.window),
            "supervisor_events": supervisor.events if supervisor else [],
        }
        if samples:
            start, end = samples[0], samples[-1]
            growth = rss_growth_pct(start, end)
            result["memory"] = {
                "start": start,
                "end": end,
                "growth_pct": growth,
                "samples": samples,
                "max_growth_pct_allowed": args.max_rss_growth,
            }
        return result
    finally:
        if supervisor:
            supervisor.stop()
        if server:
            server.stop()


def verdict(result: dict, max_growth: float) -> list[str]:
    """Reasons the soak failed (empty when it passed)."""
    problems = []
    if result["totals"]["failed"]:
        problems.append(
            f"{result['totals']['failed']} requests failed: {result['totals']['errors']}"
        )
    for name, pct in result.get("memory", {}).get("growth_pct", {}).items():
        if pct > max_growth:
            problems.append(f"RSS of {name} grew by {pct:.1f}% (> {max_growth}%)")
    return problems


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python bench/soak.py",
        "Soak the end-to-end `recommend` model at a fraction of its capacity and report "
        "failures, latency percentiles over time and RSS growth of tritonserver and its stubs.",
        show_defaults=True,
    )
    add = parser.add_argument
    add("--duration", type=float, default=600.0, help="seconds of soak")
    artifacts = "artifact directory (served, and the example request)"
    add("--artifacts", type=Path, default=Path("artifacts/demo"), help=artifacts)
    fraction = "rate as a fraction of the measured capacity"
    add("--load-fraction", type=float, default=0.5, help=fraction)
    add("--rate", type=float, help="requests per second (skips the fraction)")
    add("--capacity", type=float, help="known capacity (skips measuring it)")
    add("--top-k", type=int, default=50, help="top_k of each request")
    add("--workers", type=int, default=16, help="client threads")
    add("--window", type=float, default=10.0, help="seconds per latency window and memory sample")
    growth = "percent RSS growth (start to end) that fails the soak"
    add("--max-rss-growth", type=float, default=10.0, help=growth)
    running = "use a running server (host:port) instead of starting one; needs --grpc-url, "
    add("--http-url", help=running + "and --server-pid for memory")
    add("--grpc-url", help="gRPC host:port of the running server")
    add("--server-pid", type=int, help="tritonserver pid (memory sampling)")
    add("--log-dir", type=Path, default=Path("build/soak"), help="where the server log goes")
    prefix = "writes PREFIX.json and PREFIX.png"
    add("--out-prefix", type=Path, default=Path("bench/results/soak"), help=prefix)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.http_url and not args.grpc_url:
        print("error: --http-url needs --grpc-url too", file=sys.stderr)
        return 2
    args.log_dir.mkdir(parents=True, exist_ok=True)
    result = run_soak(args)
    problems = verdict(result, args.max_rss_growth)
    result["passed"] = not problems
    result["problems"] = problems
    json_path = write_results(args.out_prefix.with_suffix(".json"), result)
    if result.get("memory"):
        plot(result, args.out_prefix.with_suffix(".png"))
    totals = result["totals"]
    print(json.dumps({k: totals[k] for k in ("requests", "failed", "p50_ms", "p99_ms")}))
    if result.get("memory"):
        print("RSS growth %:", result["memory"]["growth_pct"])
    print(f"wrote {json_path}" + (" and .png" if result.get("memory") else ""))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
