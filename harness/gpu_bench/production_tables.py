"""The GPU section's tables of X's production ranker: served (bench/bench_production.py, the
``production`` step), its prefix cache (bench/bench_prefix_cache.py, ``prefix-cache``), X's
outputs reproduced (``reference``) and X's own forward beside ours (bench/bench_xrex.py,
``xrex``), from their JSON. Pure text: report.py renders them with the other suites."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from harness.gpu_bench.markdown import NOT_MEASURED, fmt, head, row, stamp

MIB = 2**20


def production_table(result: Optional[dict]) -> list[str]:
    """Served requests/s and latency by concurrency against the service in process, and the
    FLOP rate against the device's bfloat16 matmul rate measured in the same run."""
    title = "**X's production ranker served**"
    if result is None:
        return [f"{title} (`bench/bench_production.py --device gpu`: nano, history 1,022 x 64 "
                f"candidates): *{NOT_MEASURED}*."]  # fmt: skip
    settings, summary = result["settings"], result["summary"]
    lines = [
        f"{title} (`bench/bench_production.py --device {settings['profile']}`: "
        f"`{Path(settings['artifacts']).name}`, history {settings['history']:,} x "
        f"{settings['candidates']} candidates, every production input; the `ranker` alone, "
        f"{settings['instances']} instances, its prefix cache off; perf_analyzer against the "
        f"service's `handle` in process, medians of rounds: {len(result['rounds'])}): "
        f"{stamp(result)}.",
        "",
        *head("concurrency", "protocol", "served req/s", "p50 / p99", "in process req/s",
              "served / in process", "served TFLOP/s",
              f"share of the {summary.get('matmul_dtype', 'float32')} matmul rate"),
    ]  # fmt: skip
    for r in sorted(summary["rows"], key=lambda r: (r["concurrency"], r["protocol"])):
        latency = (
            f"{r['served_p50_ms']:.1f} / {r['served_p99_ms']:.1f} ms"
            if "served_p99_ms" in r
            else "-"
        )
        lines.append(row(
            r["concurrency"], r["protocol"], f"{r['served_req_s']:,.1f}", latency,
            f"{r['in_process_req_s']:,.1f}", f"{r['served_vs_in_process']:.0%}",
            f"{r['served_gflops'] / 1e3:.2f}", f"{r['served_share_of_matmul_rate']:.1%}",
        ))  # fmt: skip
    flops = result["flops_per_request"]
    rates = result["matmul_gflops"].get(summary.get("matmul_dtype", "float32"), {})
    best = max(rates, key=rates.get) if rates else None
    locust = result.get("locust")
    notes = [
        f"A request is {flops['total'] / 1e9:.1f} GFLOP of matmuls (the prefix "
        f"{flops['prefix'] / 1e9:.1f})",
        f"the best matmul rate of the same run {rates[best] / 1e3:,.0f} TFLOP/s ({best})"
        if best
        else "",
        f"failed requests: {fmt(result.get('failed_requests'), 'd')}",
        f"Locust, {locust['users']} users for {locust['seconds']:.0f} s: {locust['requests']} "
        f"requests, {locust['failures']} failed, p99 {locust['p99_ms']:.0f} ms"
        if locust
        else "",
    ]
    return [*lines, "", "; ".join(n for n in notes if n) + "."]


def cache_rows(name: str, points: dict, memory: Optional[str]) -> list[str]:
    rows = []
    for key, p in points.items():
        call = p["call_ms"]
        rows.append(row(
            name, key.replace("x", " x "), f"{call['off']:.2f}", f"{call['miss']:.2f}",
            f"{call['hit']:.2f}",
            f"{p['hit_over_miss']:.2f}x", f"{100 * p['bookkeeping_share_of_miss']:.2f}%",
            memory or "-",
        ))  # fmt: skip
    return rows


def production_memory(memory: dict) -> str:
    shown = f"{memory['bytes_per_user'] / MIB:.2f} MiB"
    in_use = memory.get("device_in_use_bytes_per_user")
    return shown + ("" if in_use is None else f" ({in_use / MIB:.2f} MiB of device memory)")


def prefix_cache_table(result: Optional[dict]) -> list[str]:
    """Hits against misses (and the cache off), one user a call and eight, for the original's
    mini shapes and the production nano ranker, with what a cached user holds."""
    title = "**The prefix cache**"
    what = (
        "`bench/bench_prefix_cache.py --skip-paged`: a user's next page of 64 other candidates "
        "after a full history of 1,022 posts, the same calls with the cache off, missing and "
        "hitting"
    )
    if result is None:
        return [f"{title} ({what}): *{NOT_MEASURED}*."]
    engine = result["engine"]
    mini = f"original, mini, {engine['config']['dtype']}"
    lines = [
        f"{title} ({what}): {stamp(result)}.",
        "",
        *head("model", "users x candidates", "off ms", "miss ms", "hit ms", "hit / miss",
              "bookkeeping of a miss", "a cached user holds"),
        *cache_rows(mini, engine["points"], f"{engine['entry_bytes'] / MIB:.2f} MiB"),
    ]  # fmt: skip
    production = result.get("production")
    if production:
        config = production["config"]
        name = f"production, nano, {config['dtype']}"
        lines += cache_rows(name, production["points"], production_memory(production["memory"]))
    return lines


def reference_table(result: Optional[dict]) -> list[str]:
    """The production ranker's serving passes on the device against X's own outputs."""
    title = "**X's outputs, reproduced on the device**"
    what = (
        "`phoenix-check-reference tests/data/production`: X's parameters and inputs through "
        "the production ranker's serving passes, against the outputs X's own code gave for "
        "them; within: log-probs max 0.08 and mean 0.005, continuous max 0.1 or 2 bfloat16 steps"
    )
    if result is None:
        return [f"{title} ({what}): *{NOT_MEASURED}*."]
    lines = [
        f"{title} ({what}): {stamp(result)}.",
        "",
        *head("set", "batch", "keys", "log-probs, max / mean abs. difference",
              "continuous, max", "within"),
    ]  # fmt: skip
    for found in result["sets"]:
        by_output = {d["output"]: d for d in found["differences"]}
        log_probs, continuous = by_output["log_probs"], by_output["continuous"]
        lines.append(row(
            found["set"], found["batch"], found["attention_keys"],
            f"{log_probs['max']:.4f} / {log_probs['mean']:.5f}", f"{continuous['max']:.4f}",
            "yes" if found["ok"] else "**no**",
        ))  # fmt: skip
    return lines


def xrex_table(result: Optional[dict]) -> list[str]:
    """X's own forward against ours on the device: time per call and agreement, by batch."""
    title = "**X's own forward against ours, same device, same inputs**"
    what = (
        "`bench/bench_xrex.py --payload .gpu --device gpu`: X's jitted forward from its "
        "release (its serving kernel) and the production ranker's serving forward, each "
        "call's inputs from the host and outputs back, median ms; ours against X's outputs "
        "within the reference tolerances"
    )
    if result is None:
        return [f"{title} ({what}): *{NOT_MEASURED}*."]
    settings, x = result["settings"], result["x"]
    limits = {d["output"]: d["limit"] for d in result["rows"][0]["ours"]["differences"]}
    lines = [
        f"{title} ({what}: log-probs {limits['log_probs']}, continuous "
        f"{limits['continuous']}; {settings['model']}, history {settings['history']:,} x "
        f"{settings['candidates']} candidates, X on JAX {x['jax']}, its kernel: {x['kernel']}): "
        f"{stamp(result)}.",
        "",
        *head("batch", "X ms", "ours ms", "X / ours", "log-probs, max / mean abs. difference",
              "past the limit (bfloat16 steps)", "within"),
    ]  # fmt: skip
    for found in result["rows"]:
        ours = found["ours"]
        log_probs = next(d for d in ours["differences"] if d["output"] == "log_probs")
        lines.append(row(
            found["batch"], f"{found['x']['median_ms']:.2f}", f"{ours['median_ms']:.2f}",
            f"{found['x_over_ours']:.2f}x", f"{log_probs['max']:.4f} / {log_probs['mean']:.5f}",
            f"{log_probs['over']} ({log_probs['over_steps']:g})" if log_probs["over"] else "0",
            "yes" if ours["ok"] else "**no**",
        ))  # fmt: skip
    replay = result["replay"]
    drift = {d["output"]: d for d in replay["x_here_against_stored"]}["log_probs"]
    lines += ["", (
        f"X's own code re-run here on `{Path(replay['set']).name}` (made by X's code on a CPU "
        f"under its pinned JAX 0.8.1) against the outputs stored: log-probs max "
        f"{drift['max']:.4f}, mean {drift['mean']:.5f}."
    )]  # fmt: skip
    return lines
