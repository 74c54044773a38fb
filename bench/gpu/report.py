"""The GPU section of docs/performance.md, from the JSON files of a GPU benchmark run.

    python -m bench.gpu.report --results bench/results/gpu --docs docs/performance.md

Rewrites what lies between the markers `<!-- gpu-table:start -->` and `<!-- gpu-table:end -->`.
A step whose JSON is missing shows "not yet measured", so the section can be filled step by
step (one device call per step) and re-rendered here from the files brought back.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from bench.gpu import profiles
from bench.serving_report import best, between_markers, ratio, served_rows
from phoenix.util.command_line import command_parser

TABLE_START, TABLE_END = "<!-- gpu-table:start -->", "<!-- gpu-table:end -->"
NOT_MEASURED = "not yet measured"
NOT_IN_RUN = "not in this run"  # the step ran, but not at this point (e.g. the CPU profile)
STEPS = ("engine", "retrieval", "startup", "serving")
# Read when present: the recommend step's JSON, and the lease step serving-instances' (the
# ranker served with more instances than the profile's).
OPTIONAL = {"recommend": "recommend.json", "serving_instances": "serving-ranker8.json"}
FIRST_RUN = "first-run"  # the run before any change, for the before/after table
AFTER_FIX = "after-fix"  # served again after the first fix (2026-11-26), a column of that table


def load_results(folder: Path) -> dict[str, dict]:
    """Each step's JSON in ``folder`` (missing steps left out), the OPTIONAL files, the top-k
    experiments of experiments/topk*.json as "topk" (a list, by file name), and the first run's
    steps (folder/first-run) as "first_run"."""
    found = {}
    for step in STEPS:
        path = folder / f"{step}.json"
        if path.is_file():
            found[step] = json.loads(path.read_text())
    for key, name in OPTIONAL.items():
        if (folder / name).is_file():
            found[key] = json.loads((folder / name).read_text())
    for key, name in (("first_run", FIRST_RUN), ("after_fix", AFTER_FIX)):
        earlier = folder / name
        if earlier.is_dir() and earlier.resolve() != folder.resolve():
            found[key] = load_results(earlier)
    experiments = sorted((folder / "experiments").glob("topk*.json"))
    if experiments:
        found["topk"] = [json.loads(path.read_text()) for path in experiments]
    return found


def fmt(value: Optional[float], spec: str, suffix: str = "", missing: str = NOT_MEASURED) -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"


def stamp(result: Optional[dict]) -> str:
    """When and where a step's figures were taken (bench_serving.py's JSON has fewer fields)."""
    if result is None:
        return f"*{NOT_MEASURED}*"
    m, settings = result.get("machine", {}), result.get("settings", {})
    date = m.get("date") or result.get("date", "?")
    where = m.get("gpu") or m.get("device_kind") or settings.get("device") or m.get("backend", "?")
    versions = [f"driver {m['driver']}"] if m.get("driver") else []
    versions += [f"jax {m['jax']}", f"numpy {m['numpy']}"] if "jax" in m else []
    versions = f" ({', '.join(versions)})" if versions else ""
    profile = result.get("profile") or ("cpu" if settings.get("device") == "cpu" else "gpu")
    return f"measured {date} on {where}{versions}, profile `{profile}`"


def engine_table(result: Optional[dict]) -> list[str]:
    lines = [
        f"**Engine against the plain jitted original**, same weights and inputs: {stamp(result)}.",
        "",
        "| config | users x candidates | original (jit) cand/s | engine cand/s | "
        "engine / original (target >= 1.0x) | device ranker cand/s (from raw ids) | "
        "device ranker / original |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = result["ranking"] if result else placeholder_points()
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['config']} | {r['users']} x {r['candidates']} | error: "
                         f"{r['error'][:80]} | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {r['config']} | {r['users']} x {r['candidates']} | "
            f"{fmt(r.get('original_jit_cands_per_s'), ',.0f')} | "
            f"{fmt(r.get('engine_cands_per_s'), ',.0f')} | "
            f"{fmt(r.get('engine_vs_original'), '.2f', 'x')} | "
            f"{fmt(r.get('device_ranker_cands_per_s'), ',.0f')} | "
            f"{fmt(r.get('device_ranker_vs_original'), '.2f', 'x')} |"
        )
    return lines


def placeholder_points() -> list[dict]:
    return [
        {"config": name, "users": users, "candidates": candidates}
        for name, points in profiles.GPU.ranking_points.items()
        for users, candidates in points
    ]


def retrieval_table(result: Optional[dict]) -> list[str]:
    targets = {1_000_000: ">= 20,000", 10_000_000: ">= 2,000"}
    lines = [
        f"**Retrieval**, exact top 100: {stamp(result)}.",
        "",
        "| corpus | users per call | top-k queries/s (target) | user tower + top-k queries/s |",
        "| --- | --- | --- | --- |",
    ]
    rows = result["retrieval"] if result else [{"corpus": size} for size in targets]
    for r in rows:
        target = targets.get(r["corpus"], "-")
        lines.append(
            f"| {r['corpus']:,} | {r.get('batch', profiles.GPU.retrieval_batch)} | "
            f"{fmt(r.get('top_k_queries_per_s'), ',.0f')} ({target}) | "
            f"{fmt(r.get('end_to_end_queries_per_s'), ',.0f')} |"
        )
    return lines


def startup_table(result: Optional[dict]) -> list[str]:
    s = result["startup"] if result else {}
    models = s.get("models", "all")
    loaded = "whole repository" if models == "all" else ", ".join(models)
    return [
        f"**Server start-up** ({loaded}, until ready): {stamp(result)}.",
        "",
        "| empty program store (target <= 60 s) | restart, store filled (target <= 15 s) |",
        "| --- | --- |",
        f"| {fmt(s.get('empty_cache_s'), '.1f', ' s')} "
        f"| {fmt(s.get('filled_cache_s'), '.1f', ' s')} |",
    ]


def first_value(rows: list[dict], pick: Callable[[dict], float]) -> Optional[float]:
    return pick(rows[0]) if rows else None


def failed_requests(result: dict) -> Optional[int]:
    """The server statistics' failed requests of a bench_serving run (None: not counted)."""
    failed = result.get("failed_requests")
    return sum(sum(v.values()) for v in failed.values()) if failed else None


def serving_rows(result: Optional[dict]) -> list[tuple[str, str, str]]:
    """(figure, measured, target) for the served targets."""
    missing = NOT_MEASURED if result is None else NOT_IN_RUN
    result = result or {}
    best_512 = best(served_rows(result, workload="ranker-512", batching="on"))
    best_64 = best(served_rows(result, workload="ranker-64", batching="on"))
    summary = result.get("summary", {}).get("ranker-512", {})
    p99_64 = first_value(
        served_rows(result, workload="ranker-64", batching="on", concurrency=16),
        lambda r: r["p99_ms"],
    )
    rows = [
        (
            "ranker-64 requests/s at its best concurrency, batching on",
            fmt(best_64 and best_64["throughput"], ",.0f", missing=missing)
            + (f" (c={best_64['concurrency']})" if best_64 else ""),
            "-",
        ),
        (
            "ranker-512 candidates/s at its best concurrency",
            fmt(best_512 and 512 * best_512["throughput"], ",.0f", missing=missing)
            + (f" (c={best_512['concurrency']})" if best_512 else ""),
            ">= 2,000,000",
        ),
        (
            "ranker-512 served / in-process (best of 1 and 8 users per call)",
            fmt(summary.get("served_vs_in_process"), ".0%", missing=missing),
            ">= 50%",
        ),
        (
            "ranker-64 p99 at concurrency 16, batching on",
            fmt(p99_64, ".1f", " ms", missing=missing),
            "<= 25 ms",
        ),
    ]
    for workload in ("ranker-64", "ranker-512"):
        on = first_value(served_rows(result, workload=workload, batching="on", concurrency=64),
                         lambda r: r["throughput"])  # fmt: skip
        off = first_value(served_rows(result, workload=workload, batching="off", concurrency=64),
                          lambda r: r["throughput"])  # fmt: skip
        figure = f"{workload} batching on / off at concurrency 64"
        rows.append((figure, fmt(ratio(on, off), ".2f", "x", missing=missing), ">= 4x"))
    failures = failed_requests(result)
    rows.append(("failed requests (server statistics)", fmt(failures, "d", missing=missing), "0"))
    return rows


def serving_table(result: Optional[dict], title: str = "**Served**") -> list[str]:
    instances = (result or {}).get("settings", {}).get("instances")
    counts = (
        ", ".join(f"{k} {v}" for k, v in instances.items()) if isinstance(instances, dict) else ""
    )
    lines = [
        f"{title} (perf_analyzer over HTTP, batching on and off; instances: "
        f"{counts or 'the profile' + chr(39) + 's'}): {stamp(result)}.",
        "",
        "| figure | measured | target |",
        "| --- | --- | --- |",
    ]
    lines += [
        f"| {figure} | {value} | {target} |" for figure, value, target in serving_rows(result)
    ]
    return lines


def recommend_rows(result: dict) -> list[tuple[str, str, str]]:
    """(figure, measured, target) for the ensemble served end to end."""
    top = best(served_rows(result, workload="recommend", batching="on"))
    corpus = result.get("settings", {}).get("artifacts", "?")
    failures = failed_requests(result)
    in_process = result.get("in_process", {}).get("recommend", {})
    return [
        (
            "recommend requests/s at its best concurrency (top 100)",
            fmt(top and top["throughput"], ",.0f", missing=NOT_IN_RUN)
            + (f" (c={top['concurrency']}, artifacts `{Path(corpus).name}`)" if top else ""),
            ">= 1,000",
        ),
        (
            "p99 at that concurrency",
            fmt(top and top["p99_ms"], ".1f", " ms", missing=NOT_IN_RUN),
            "<= 50 ms",
        ),
        (
            "in process, 1 / 8 users per call",
            " / ".join(
                fmt(in_process.get(k, {}).get("throughput"), ",.0f", missing="-")
                for k in ("batch_1", "batch_8")
            ),  # fmt: skip
            "-",
        ),
        ("failed requests (server statistics)", fmt(failures, "d", missing=NOT_IN_RUN), "0"),
    ]


def recommend_table(result: Optional[dict]) -> list[str]:
    if result is None:
        return [f"**recommend end to end**: *{NOT_MEASURED}*."]
    lines = [
        f"**recommend end to end** (the ensemble: user tower, exact top 100 over the corpus "
        f"file, ranker, feed policy; perf_analyzer over HTTP): {stamp(result)}.",
        "",
        "| figure | measured | target |",
        "| --- | --- | --- |",
    ]
    return lines + [f"| {f} | {v} | {t} |" for f, v, t in recommend_rows(result)]


def before_after_table(first: dict, latest: dict, after_fix: Optional[dict] = None) -> list[str]:
    """The targets' figures in the first run (the code before any change) and now."""

    def served(result, label):
        return {f: v for f, v, _ in serving_rows(result)}.get(label, NOT_MEASURED)

    def retrieval(result, corpus):
        rows = [r for r in (result or {}).get("retrieval", []) if r["corpus"] == corpus]
        return fmt(rows[0]["top_k_queries_per_s"] if rows else None, ",.0f")

    def engine(result, users, candidates):
        rows = [
            r for r in (result or {}).get("ranking", [])
            if (r["config"], r["users"], r["candidates"]) == ("mini", users, candidates)
        ]  # fmt: skip
        return fmt(rows[0].get("device_ranker_vs_original") if rows else None, ".2f", "x")

    def served_or_failed(result, label):
        if result and not served_rows(result) and failed_requests(result) and "failed" not in label:
            return "every request failed"
        return served(result, label)

    lines = [
        "**Before and after**: the first run (`bench/results/gpu/first-run`, the code as it "
        f"stood), serving after its first fix (`{AFTER_FIX}`), and the latest files here.",
        "",
        "| figure | first run | served after the first fix | latest |",
        "| --- | --- | --- | --- |",
    ]
    labels = [label for label, _, _ in serving_rows(None)]
    fixed = (after_fix or {}).get("serving")
    for label in labels:
        lines.append(
            f"| {label} | {served_or_failed(first.get('serving'), label)} "
            f"| {served(fixed, label) if fixed else '-'} | {served(latest.get('serving'), label)} |"
        )
    more = latest.get("serving_instances")
    counts = (more or {}).get("settings", {}).get("instances") or {}
    counts = ", ".join(f"{n} {k} instances" for k, n in counts.items())
    for label in labels[:2] if more else []:
        lines.append(f"| {label}, {counts} | - | - | {served(more, label)} |")
    for corpus in (1_000_000, 10_000_000):
        lines.append(
            f"| retrieval top-k queries/s, {corpus:,} posts | "
            f"{retrieval(first.get('retrieval'), corpus)} | - | "
            f"{retrieval(latest.get('retrieval'), corpus)} |"
        )
    for users, candidates in profiles.GPU.ranking_points["mini"]:
        lines.append(
            f"| device ranker / original, mini {users} x {candidates} | "
            f"{engine(first.get('engine'), users, candidates)} | - | "
            f"{engine(latest.get('engine'), users, candidates)} |"
        )
    return lines


def topk_table(result: Optional[dict]) -> list[str]:
    """Top 100 computed several ways (bench/gpu/topk_variants.py): what to choose from."""
    if not result:
        return []
    names = list(dict.fromkeys(n for r in result["topk"] for n in r["queries_per_s"]))
    lines = [
        f"**Top 100 over a device-resident corpus, several ways**, queries/s "
        f"(`bench/gpu/topk_variants.py`, whose docstring says what each variant is; the engine "
        f"variants split the users into device calls of at most 16, `/program` is the engine's "
        f"device program alone, one call of all the users, inputs already on the device; "
        f"XLA flags: {result.get('xla_flags') or 'none'}): {stamp(result)}.",
        "",
        "| corpus | users per call | " + " | ".join(names) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for r in result["topk"]:
        values = [fmt(r["queries_per_s"].get(n), ",.0f", missing="-") for n in names]
        lines.append(f"| {r['corpus']:,} | {r['batch']} | " + " | ".join(values) + " |")
    return lines


def render(results: dict[str, dict]) -> str:
    """The whole section body between the markers."""
    parts = [
        engine_table(results.get("engine")),
        retrieval_table(results.get("retrieval")),
        *(topk_table(result) for result in results.get("topk", [])),
        startup_table(results.get("startup")),
        serving_table(results.get("serving")),
    ]
    if "serving_instances" in results:
        parts.append(serving_table(results["serving_instances"], "**Served, more instances**"))
    parts.append(recommend_table(results.get("recommend")))
    if "first_run" in results:
        parts.append(before_after_table(results["first_run"], results, results.get("after_fix")))
    parts = [lines for lines in parts if lines]
    return "\n\n".join("\n".join(lines) for lines in parts)


def update_docs(path: Path, body: str) -> None:
    """Replace the text between the markers of ``path``; a readable error without them."""
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        raise SystemExit(f"error: {path} has no {TABLE_START} ... {TABLE_END} markers")
    path.write_text(between_markers(text, TABLE_START, TABLE_END, body))


def main(argv=None) -> int:
    parser = command_parser("python -m bench.gpu.report", __doc__)
    parser.add_argument("--results", type=Path, default=profiles.RESULTS_GPU,
                        help="folder of engine/retrieval/startup/serving.json "
                        "(default: bench/results/gpu)")  # fmt: skip
    parser.add_argument("--docs", type=Path, default=profiles.REPO_ROOT / "docs" / "performance.md",
                        help="file with the markers (default: docs/performance.md)")  # fmt: skip
    args = parser.parse_args(argv)
    results = load_results(args.results)
    update_docs(args.docs, render(results))
    print(f"updated the GPU section of {args.docs} from {sorted(results) or 'no results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
