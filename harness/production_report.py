"""The production serving benchmark's summary and its table (bench/bench_production.py
writes them): medians over the rounds, ratios served / in process, FLOP rates against the
device's matmul rate. Pure: numpy and the results' dict, nothing is measured here; imports numpy and
harness.serving_repository."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.serving_repository import IN_PROCESS_BATCH


def matmul_dtype(results: dict) -> str:
    """The dtype the served model computes in, whose matmul rate its FLOP rate is set
    against: bfloat16 on a GPU, float32 on a CPU (the served ranker's ``default_compute_dtype``)."""
    return "bfloat16" if results["settings"].get("profile") == "gpu" else "float32"


def summarize(results: dict) -> dict[str, Any]:
    """Per (protocol, concurrency), medians over the rounds: served requests/s, the ratio
    served / in process (each within its point: measured one right after the other), the CPU
    seconds a request on each side; FLOP rates against the best matmul rate of the dtype the
    model computes in on the device (``matmul_dtype``)."""
    flops = results["flops_per_request"]["total"]
    dtype = matmul_dtype(results)
    matmul = max(results["matmul_gflops"][dtype].values())
    by_point: dict[tuple, list] = {}
    for point in (p for r in results["rounds"] for p in r):
        if point["served"]["error"]:
            continue
        inner = max(point["in_process"].values(), key=lambda f: f["throughput"])
        rate = point["served"]["throughput"]
        by_point.setdefault((point["protocol"], point["concurrency"]), []).append(
            (rate, rate / inner["throughput"], inner["throughput"], inner["cpu_s_per_request"],
             point["served"]["server_cpu_s_per_request"], point["served"]["p50_ms"],
             point["served"]["p99_ms"])
        )  # fmt: skip
    median = lambda values: float(np.median(values))  # noqa: E731
    rows = []
    for (protocol, concurrency), values in by_point.items():
        rate = median([v[0] for v in values])
        served_cpu = [v[4] for v in values if v[4]]
        rows.append({
            "protocol": protocol, "concurrency": concurrency, "served_req_s": rate,
            "served_vs_in_process": median([v[1] for v in values]),
            "ratios_by_round": [v[1] for v in values],
            "in_process_req_s": median([v[2] for v in values]),
            "in_process_cpu_s_per_request": median([v[3] for v in values]),
            "served_cpu_s_per_request": median(served_cpu) if served_cpu else None,
            "served_p50_ms": median([v[5] for v in values]),
            "served_p99_ms": median([v[6] for v in values]),
            "served_gflops": rate * flops / 1e9,
            "served_share_of_matmul_rate": rate * flops / 1e9 / matmul,
        })  # fmt: skip
    cpu = min(r["in_process_cpu_s_per_request"] for r in rows) if rows else float("nan")
    return {
        "rows": rows,
        "gflop_per_cpu_second": flops / cpu / 1e9,
        "float32_matmul_gflops": max(results["matmul_gflops"]["float32"].values()),
        "matmul_dtype": dtype,
        "matmul_gflops": matmul,
        "ratio_at_c16": next(
            (r["served_vs_in_process"] for r in rows if r["concurrency"] == 16), None
        ),
    }


def in_process_batches_text(results: dict) -> str:
    """How many users a call the in-process side ran beyond c=1 (bench_production's
    ``in_process_batches``): the server's largest batch joins 1 and IN_PROCESS_BATCH where it
    is larger (the GPU profile's 64)."""
    largest = results["settings"].get("max_batch", IN_PROCESS_BATCH)
    if largest <= IN_PROCESS_BATCH:
        return f"the better of 1 and {IN_PROCESS_BATCH}"
    return f"the best of 1, {IN_PROCESS_BATCH} and up to {largest}, the server's largest batch"


def table(results: dict) -> str:
    """The Markdown table of docs/production.md (and the GPU benchmark's), with its notes."""
    s = results["summary"]
    f = results["flops_per_request"]
    lines = [
        "| concurrency | protocol | served req/s | in process req/s | served / in process | "
        f"CPU-s a request, served / in process | served GFLOP/s | share of the "
        f"{matmul_dtype(results)} matmul rate |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in s["rows"]:
        cpu = r["served_cpu_s_per_request"]
        lines.append(
            f"| {r['concurrency']} | {r['protocol']} | {r['served_req_s']:.2f} | "
            f"{r['in_process_req_s']:.2f} | {r['served_vs_in_process']:.0%} | "
            f"{'n/a' if cpu is None else f'{cpu:.2f}'} / "
            f"{r['in_process_cpu_s_per_request']:.2f} | {r['served_gflops']:.0f} | "
            f"{r['served_share_of_matmul_rate']:.0%} |"
        )
    rates = results["matmul_gflops"]
    lines += [
        "",
        f"Medians of {len(results['rounds'])} rounds; at each point the service's `handle` in "
        f"process (c=1: one user a call; beyond: {in_process_batches_text(results)}), then the "
        "server right after. "
        f"{s['gflop_per_cpu_second']:.0f} GFLOP per CPU-second in process. A request is "
        f"{f['total'] / 1e9:.1f} GFLOP (prefix {f['prefix'] / 1e9:.1f}, "
        f"{results['settings']['candidates']} candidates {f['candidates'] / 1e9:.1f}). Matmul "
        "rate of this machine, same run: float32 "
        + ", ".join(f"{v:.0f}" for v in rates["float32"].values())
        + " GFLOP/s, bfloat16 "
        + ", ".join(f"{v:.0f}" for v in rates["bfloat16"].values())
        + f" ({'; '.join(rates['float32'])}).",
    ]
    locust = results.get("locust")
    if locust:
        lines += [
            "",
            f"Locust against the same server, {locust['users']} users (HTTP and gRPC) for "
            f"{locust['seconds']:.0f} s: {locust['requests']} requests, {locust['failures']} "
            f"failed, {locust['req_s']:.2f} req/s, p50 {locust['p50_ms']:.0f} ms, p99 "
            f"{locust['p99_ms']:.0f} ms.",
        ]
    return "\n".join(lines)
