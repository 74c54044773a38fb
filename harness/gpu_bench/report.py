"""The GPU section of docs/performance.md, from the JSON files of the GPU benchmark.

    python -m harness.gpu_bench.report          # rewrite the section from bench/results/gpu
    python -m harness.gpu_bench.report --check  # exit 1: the section is not what the files give
    python -m harness.gpu_bench.report --results DIR --docs FILE

Rewrites what lies between the markers `<!-- gpu-table:start -->` and `<!-- gpu-table:end -->`.
A step of `bench/gpu/measure.py` whose JSON is missing shows "not yet measured", so the section
can be filled step by step and rendered again from the files a GPU machine wrote; the other
suites (more ranker instances, a stub's host work, the top-k variants) show when their file is
there.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Optional

from harness.gpu_bench import profiles
from harness.gpu_bench.markdown import NOT_IN_RUN, NOT_MEASURED, fmt, head, ms, row, stamp
from harness.gpu_bench.production_tables import (
    prefix_cache_table,
    production_table,
    reference_table,
    xrex_table,
)
from harness.serving_rows import best, ratio, served_rows
from phoenix.util.command_line import command_parser
from phoenix.util.doc_blocks import with_block

TABLE_START, TABLE_END = "<!-- gpu-table:start -->", "<!-- gpu-table:end -->"
STEPS = ("engine", "retrieval", "startup", "serving")  # measure.py's steps, recommend aside
# Every suite's file in the results folder, by the key the renderers read.
FILES = {
    "engine": "engine.json",
    "retrieval": "retrieval.json",
    "topk": "topk.json",
    "topk_programs": "topk-diag.json",
    "startup": "startup.json",
    "serving": "serving.json",
    "serving_instances": "serving-ranker8.json",
    "service_host": "service-host.json",
    "recommend": "recommend.json",
    "production": "production.json",
    "prefix_cache": "prefix-cache.json",
    "reference": "reference.json",
    "xrex": "xrex.json",
}


def load_results(folder: Path) -> dict[str, dict]:
    """Each suite's JSON in ``folder`` by its FILES key (missing files left out)."""
    return {
        key: json.loads((folder / name).read_text())
        for key, name in FILES.items()
        if (folder / name).is_file()
    }


def engine_rows(result: Optional[dict]) -> list[dict]:
    """The file's points, then every point of its profile that the file lacks (unmeasured)."""
    rows = list(result["ranking"]) if result else []
    profile = profiles.PROFILES.get((result or {}).get("profile", "gpu"), profiles.GPU)
    measured = {(r["config"], r["users"], r["candidates"]) for r in rows}
    return rows + [
        {"config": name, "users": users, "candidates": candidates}
        for name, points in profile.ranking_points.items()
        for users, candidates in points
        if (name, users, candidates) not in measured
    ]


def engine_table(result: Optional[dict]) -> list[str]:
    lines = [
        f"**Engine against the plain jitted original**, same weights and inputs "
        f"(`bench/gpu/engine_points.py`): {stamp(result)}.",
        "",
        *head("config", "users x candidates", "original (jit) cand/s", "engine cand/s",
              "engine / original (target >= 1.0x)", "device ranker cand/s (from raw ids)",
              "device ranker / original"),
    ]  # fmt: skip
    for r in engine_rows(result):
        point = (r["config"], f"{r['users']} x {r['candidates']}")
        if "error" in r:
            lines.append(row(*point, f"error: {r['error'][:80]}", "", "", "", ""))
            continue
        lines.append(row(
            *point,
            fmt(r.get("original_jit_cands_per_s"), ",.0f"),
            fmt(r.get("engine_cands_per_s"), ",.0f"),
            fmt(r.get("engine_vs_original"), ".2f", "x"),
            fmt(r.get("device_ranker_cands_per_s"), ",.0f"),
            fmt(r.get("device_ranker_vs_original"), ".2f", "x"),
        ))  # fmt: skip
    return lines


def engine_time_table(result: Optional[dict]) -> list[str]:
    """Milliseconds a call and device launches: the original with its inputs copied from the
    host or already on the device, the engine's two passes (empty without those figures)."""
    rows = [r for r in (result or {}).get("ranking", []) if "original_device_inputs_s" in r]
    if not rows:
        return []
    lines = [
        "**Where a call's time goes**, ms a call: the original from host arrays and with its "
        "inputs already on the device; the engine's `score` (hashed features from the host) and "
        "the device ranker's `rank` (raw ids, as served), each with the cached pass (the "
        "context first, the candidates against its cache) and the joint pass (context and "
        "candidates as one sequence); device launches a call (the optimized program's device "
        "instructions).",
        "",
        *head("config", "users x candidates", "original", "original, inputs on the device",
              "score cached / joint", "rank cached / joint",
              "launches: original, score cached / joint"),
    ]  # fmt: skip
    for r in rows:
        n = r.get("launches", {})
        lines.append(row(
            r["config"],
            f"{r['users']} x {r['candidates']}",
            ms(r["original_jit_s"]),
            ms(r["original_device_inputs_s"]),
            f"{ms(r.get('engine_cached_s'))} / {ms(r.get('engine_joint_s'))}",
            f"{ms(r.get('device_ranker_cached_s'))} / {ms(r.get('device_ranker_joint_s'))}",
            f"{n.get('original', '-')}, {n.get('score_cached', '-')} / {n.get('score_joint', '-')}",
        ))  # fmt: skip
    return lines


def retrieval_table(result: Optional[dict]) -> list[str]:
    targets = {1_000_000: ">= 20,000", 10_000_000: ">= 2,000"}
    lines = [
        f"**Retrieval**, exact top 100 (`bench/gpu/retrieval.py`): {stamp(result)}.",
        "",
        *head("corpus", "users per call", "top-k queries/s (target)",
              "user tower + top-k queries/s"),
    ]  # fmt: skip
    rows = result["retrieval"] if result else [{"corpus": size} for size in targets]
    for r in rows:
        target = targets.get(r["corpus"], "-")
        lines.append(row(
            f"{r['corpus']:,}",
            r.get("batch", profiles.GPU.retrieval_batch),
            f"{fmt(r.get('top_k_queries_per_s'), ',.0f')} ({target})",
            fmt(r.get("end_to_end_queries_per_s"), ",.0f"),
        ))  # fmt: skip
    return lines


TOPK_TITLES = {
    "topk": "every variant",
    "topk_programs": "the engine's variants, with their device programs timed alone "
    "(`/program`: one call of all the users, inputs already on the device)",
}


def topk_table(result: Optional[dict], key: str) -> list[str]:
    """Top 100 computed several ways (bench/gpu/topk_variants.py): what to choose from."""
    if not result:
        return []
    names = list(dict.fromkeys(n for r in result["topk"] for n in r["queries_per_s"]))
    lines = [
        f"**Top 100 over a device-resident corpus, several ways**, {TOPK_TITLES[key]}, "
        f"queries/s (`bench/gpu/topk_variants.py`, whose docstring says what each variant is; "
        f"the engine variants split the users into device calls of at most 16; XLA flags: "
        f"{result.get('xla_flags') or 'none'}): {stamp(result)}.",
        "",
        *head("corpus", "users per call", *names),
    ]
    for r in result["topk"]:
        values = [fmt(r["queries_per_s"].get(n), ",.0f", missing="-") for n in names]
        lines.append(row(f"{r['corpus']:,}", r["batch"], *values))
    return lines


def startup_table(result: Optional[dict]) -> list[str]:
    s = result["startup"] if result else {}
    models = s.get("models", "all")
    loaded = "whole repository" if models == "all" else ", ".join(models)
    return [
        f"**Server start-up** ({loaded}, until ready; `bench/gpu/startup.py`): {stamp(result)}.",
        "",
        *head("empty program store (target <= 60 s)", "restart, store filled (target <= 15 s)"),
        row(fmt(s.get("empty_cache_s"), ".1f", " s"), fmt(s.get("filled_cache_s"), ".1f", " s")),
    ]


def first_value(rows: list[dict], pick: Callable[[dict], float]) -> Optional[float]:
    return pick(rows[0]) if rows else None


def failed_requests(result: dict) -> Optional[int]:
    """The server statistics' failed requests of a bench_serving run (None: not counted)."""
    failed = result.get("failed_requests")
    return sum(sum(v.values()) for v in failed.values()) if failed else None


def throughput(result: dict, workload: str, batching: str, concurrency: int) -> Optional[float]:
    rows = served_rows(result, workload=workload, batching=batching, concurrency=concurrency)
    return first_value(rows, lambda r: r["throughput"])


def serving_rows(result: Optional[dict]) -> list[tuple[str, str, str]]:
    """(figure, measured, target) of the served ranker."""
    missing = NOT_MEASURED if result is None else NOT_IN_RUN
    result = result or {}
    best_512 = best(served_rows(result, workload="ranker-512", batching="on"))
    best_64 = best(served_rows(result, workload="ranker-64", batching="on"))
    p99_64 = first_value(
        served_rows(result, workload="ranker-64", batching="on", concurrency=16),
        lambda r: r["p99_ms"],
    )
    rows = [
        (
            "ranker-64 requests/s at its best concurrency, batching on",
            fmt(best_64["throughput"] if best_64 else None, ",.0f", missing=missing)
            + (f" (c={best_64['concurrency']})" if best_64 else ""),
            "-",
        ),
        (
            "ranker-512 candidates/s at its best concurrency",
            fmt(512 * best_512["throughput"] if best_512 else None, ",.0f", missing=missing)
            + (f" (c={best_512['concurrency']})" if best_512 else ""),
            ">= 2,000,000",
        ),
    ]
    for workload in ("ranker-64", "ranker-512"):
        summary = result.get("summary", {}).get(workload, {})
        rows.append((
            f"{workload} served / in process (best of 1 and 8 users per call)",
            fmt(summary.get("served_vs_in_process"), ".0%", missing=missing),
            ">= 50%",
        ))  # fmt: skip
    rows.append(("ranker-64 p99 at concurrency 16, batching on",
                 fmt(p99_64, ".1f", " ms", missing=missing), "<= 25 ms"))  # fmt: skip
    for workload in ("ranker-64", "ranker-512"):
        on, off = (throughput(result, workload, b, 64) for b in ("on", "off"))
        figure = f"{workload} batching on / off at concurrency 64"
        rows.append((figure, fmt(ratio(on, off), ".2f", "x", missing=missing), ">= 4x"))
    failures = failed_requests(result)
    rows.append(("failed requests (server statistics)", fmt(failures, "d", missing=missing), "0"))
    return rows


def instance_counts(result: Optional[dict]) -> str:
    instances = (result or {}).get("settings", {}).get("instances")
    if not isinstance(instances, dict):
        return "the profile's"
    return ", ".join(f"{k} {v}" for k, v in instances.items())


def serving_table(result: Optional[dict], title: str = "**Served ranker**") -> list[str]:
    device = (result or {}).get("settings", {}).get("device", "gpu")
    lines = [
        f"{title} (`bench/bench_serving.py --device {device}`: perf_analyzer over HTTP, batching "
        f"on and off; instances: {instance_counts(result)}): {stamp(result)}.",
        "",
        *head("figure", "measured", "target"),
    ]
    return lines + [row(*cells) for cells in serving_rows(result)]


def served_points_table(results: list[Optional[dict]]) -> list[str]:
    """Requests/s of each served ranker run at each concurrency, batching on against off."""
    runs = [r for r in results if r and served_rows(r)]
    if not runs:
        return []
    levels = sorted({row["concurrency"] for r in runs for row in served_rows(r)})
    lines = [
        "**Served ranker by concurrency**, requests/s with batching on / off (the runs above):",
        "",
        *head("workload", "instances", *(f"c={c}" for c in levels)),
    ]
    for workload in ("ranker-64", "ranker-512"):
        for run in runs:
            cells = [
                " / ".join(
                    fmt(throughput(run, workload, b, c), ",.0f", missing="-") for b in ("on", "off")
                )
                for c in levels
            ]
            lines.append(row(workload, instance_counts(run), *cells))
    return lines


def service_host_table(result: Optional[dict]) -> list[str]:
    """A served ranker request's host work in its stub (bench/bench_service_host.py)."""
    if not result:
        return []
    by_batch = result["us_per_request_by_batch"]
    m = result.get("machine", {})
    host = f"the {m['cpu_count']} host cores" if m.get("cpu_count") else "the host"
    where = f"{host} of the {m['gpu']} machine" if m.get("gpu") else host
    return [
        f"**A ranker request's host work in its stub**, µs a request by requests a batch "
        f"(`bench/bench_service_host.py`: `RankerService.handle` with the device call's answer "
        f"cached; `{Path(result.get('artifacts', '?')).name}`, 64 candidates, 32 history "
        f"items): measured on {where}.",
        "",
        *head(*(f"{n} a batch" for n in by_batch)),
        row(*(f"{us:.0f}" for us in by_batch.values())),
    ]


def recommend_table(result: Optional[dict]) -> list[str]:
    if result is None:
        return [f"**recommend end to end**: *{NOT_MEASURED}*."]
    top = best(served_rows(result, workload="recommend", batching="on"))
    corpus = Path(result.get("settings", {}).get("artifacts", "?")).name
    in_process = result.get("in_process", {}).get("recommend", {})
    one_eight = " / ".join(
        fmt(in_process.get(k, {}).get("throughput"), ",.0f", missing="-")
        for k in ("batch_1", "batch_8")
    )
    points = sorted(served_rows(result, workload="recommend", batching="on"),
                    key=lambda r: r["concurrency"])  # fmt: skip
    failures = fmt(failed_requests(result), "d", missing=NOT_IN_RUN)
    rows = [
        (
            f"requests/s at concurrency {r['concurrency']}, p50 / p99",
            f"{r['throughput']:,.0f}, {r['p50_ms']:.1f} / {r['p99_ms']:.1f} ms",
            ">= 1,000, p99 <= 50 ms" if r is top else "-",
        )
        for r in points
    ]
    rows += [
        ("in process, 1 / 8 users per call, requests/s", one_eight, "-"),
        ("failed requests (server statistics)", failures, "0"),
    ]
    lines = [
        f"**recommend end to end** (`bench/bench_serving.py --workloads recommend`: the "
        f"`recommend_chain` model, top 100 over the corpus file of `{corpus}`; perf_analyzer "
        f"over HTTP, batching on; instances: {instance_counts(result)}): {stamp(result)}.",
        "",
        *head("figure", "measured", "target"),
    ]
    return lines + [row(*cells) for cells in rows]


def render(results: dict[str, dict]) -> str:
    """The whole section body between the markers."""
    serving, more = results.get("serving"), results.get("serving_instances")
    parts = [
        engine_table(results.get("engine")),
        engine_time_table(results.get("engine")),
        retrieval_table(results.get("retrieval")),
        topk_table(results.get("topk"), "topk"),
        topk_table(results.get("topk_programs"), "topk_programs"),
        startup_table(results.get("startup")),
        serving_table(serving),
        serving_table(more, "**Served ranker, more instances**") if more else [],
        served_points_table([serving, more]) if more else [],
        service_host_table(results.get("service_host")),
        recommend_table(results.get("recommend")),
        production_table(results.get("production")),
        prefix_cache_table(results.get("prefix_cache")),
        reference_table(results.get("reference")),
        xrex_table(results.get("xrex")),
    ]
    return "\n\n".join("\n".join(lines) for lines in parts if lines)


def section(text: str) -> Optional[str]:
    """What stands between the markers of ``text`` (None without them)."""
    if TABLE_START not in text or TABLE_END not in text:
        return None
    return text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip("\n")


def update_docs(path: Path, body: str) -> None:
    """Replace the text between the markers of ``path``; a readable error without them."""
    text = path.read_text()
    if section(text) is None:
        raise SystemExit(f"error: {path} has no {TABLE_START} ... {TABLE_END} markers")
    path.write_text(with_block(text, TABLE_START, TABLE_END, body, path))


def check_docs(path: Path, body: str) -> bool:
    """Whether the section of ``path`` is ``body``; prints where they part when not."""
    found = section(path.read_text())
    if found is None:
        raise SystemExit(f"error: {path} has no {TABLE_START} ... {TABLE_END} markers")
    if found == body:
        return True
    for number, (old, new) in enumerate(zip(found.splitlines(), body.splitlines()), 1):
        if old != new:
            print(f"line {number} of the section differs:\n  docs:  {old}\n  files: {new}")
            break
    else:
        print(f"the section has {len(found.splitlines())} lines, the files give "
              f"{len(body.splitlines())}")  # fmt: skip
    return False


def main(argv=None) -> int:
    parser = command_parser("python -m harness.gpu_bench.report", __doc__)
    add = parser.add_argument
    folder = "folder of the suites' JSON files (default: bench/results/gpu)"
    add("--results", type=Path, default=profiles.RESULTS_GPU, help=folder)
    docs = "file with the markers (default: docs/performance.md)"
    add("--docs", type=Path, default=profiles.REPO_ROOT / "docs" / "performance.md", help=docs)
    check = "write nothing; exit 1 when the section differs from what the files give"
    add("--check", action="store_true", help=check)
    args = parser.parse_args(argv)
    results = load_results(args.results)
    body = render(results)
    if args.check:
        if check_docs(args.docs, body):
            print(f"the GPU section of {args.docs} is what {args.results} gives")
            return 0
        print(f"run `python -m harness.gpu_bench.report` to render it again from {args.results}")
        return 1
    update_docs(args.docs, body)
    print(f"updated the GPU section of {args.docs} from {sorted(results) or 'no results'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
