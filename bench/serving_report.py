"""Reporting the serving benchmark: ratios, the markdown table of docs/performance.md, a plot."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from harness.serving_repository import IN_PROCESS_BATCH
from harness.serving_rows import best, ratio, served_rows
from phoenix.util.doc_blocks import with_block

REPO_ROOT = Path(__file__).resolve().parents[1]
TABLE_START, TABLE_END = "<!-- serving-table:start -->", "<!-- serving-table:end -->"


def summarize(results: dict, concurrency_for_batching: int = 16) -> dict[str, dict]:
    """Per workload: served best vs in-process best, batching on/off, gRPC/HTTP."""
    summary = {}
    for workload, figures in results.get("in_process", {}).items():
        in_process = max(f["throughput"] for f in figures.values())
        top = best(served_rows(results, workload=workload, batching="on"))
        row = {
            "in_process_batch_1": figures["batch_1"]["throughput"],
            "in_process_best": in_process,
            "served_best": top["throughput"] if top else None,
            "served_best_setting": (f"{top['protocol']}, c={top['concurrency']}" if top else None),
            "served_vs_in_process": ratio(top["throughput"] if top else None, in_process),
        }
        for protocol in ("http", "grpc"):
            on = served_rows(results, workload=workload, protocol=protocol, batching="on",
                             concurrency=concurrency_for_batching)  # fmt: skip
            off = served_rows(results, workload=workload, protocol=protocol, batching="off",
                              concurrency=concurrency_for_batching)  # fmt: skip
            row[f"batching_on_off_{protocol}"] = ratio(
                on[0]["throughput"] if on else None, off[0]["throughput"] if off else None
            )
        grpc = best(served_rows(results, workload=workload, protocol="grpc", batching="on"))
        http = best(served_rows(results, workload=workload, protocol="http", batching="on"))
        row["grpc_vs_http"] = ratio(
            grpc["throughput"] if grpc else None, http["throughput"] if http else None
        )
        summary[workload] = row
    return summary


def fmt(value: Optional[float], spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(results: dict) -> str:
    lines = [
        "| workload | in-process req/s (1 / 8 users per call) | served best req/s | "
        "served / in-process | batching on / off at c=16 (HTTP, gRPC) | gRPC / HTTP |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for workload, row in results["summary"].items():
        in_process = results["in_process"][workload]
        lines.append(
            f"| {workload} | {in_process['batch_1']['throughput']:.0f} / "
            f"{in_process[f'batch_{IN_PROCESS_BATCH}']['throughput']:.0f} | "
            f"{fmt(row['served_best'], '.0f')} ({row['served_best_setting']}) | "
            f"{fmt(row['served_vs_in_process'], '.0%')} | "
            f"{fmt(row['batching_on_off_http'], '.2f', 'x')}, "
            f"{fmt(row['batching_on_off_grpc'], '.2f', 'x')} | "
            f"{fmt(row['grpc_vs_http'], '.2f', 'x')} |"
        )
    failed = sum(sum(v.values()) for v in results["failed_requests"].values())
    errors = sum(1 for r in results["served"] if r["error"])
    lines.append("")
    lines.append(
        f"Failed requests (server statistics): {failed}; perf_analyzer runs with errors: {errors}."
    )
    return "\n".join(lines)


def short_path(path: str) -> str:
    """``path`` relative to the repository root when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def update_docs(path: Path, table: str, results: dict) -> None:
    """Rewrite the table between the markers of ``path`` (left alone without markers)."""
    if not path.is_file():
        print(f"note: {path} does not exist; table not written there")
        return
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        print(f"note: {path} has no {TABLE_START} ... {TABLE_END} markers; table not written")
        return
    machine, settings = results["machine"], results["settings"]
    loads = machine["load_average_at_start"][0], machine.get("load_average_at_end", [0])[0]
    stamp = (
        f"Measured {results['date']} on {machine['cpu_count']} CPU cores (1-minute load average "
        f"{loads[0]:.1f} at the start, {loads[1]:.1f} at the end), artifacts "
        f"`{short_path(settings['artifacts'])}`, repository "
        f"`{short_path(settings.get('model_repository', 'model_repository'))}`."
    )
    path.write_text(with_block(text, TABLE_START, TABLE_END, f"{stamp}\n\n{table}", path))
    print(f"updated the table in {path}")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["in_process"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        thr, lat = axes[row]
        for protocol in ("http", "grpc"):
            for batching in ("on", "off"):
                rows = sorted(
                    served_rows(results, workload=workload, protocol=protocol, batching=batching),
                    key=lambda r: r["concurrency"],
                )
                if not rows:
                    continue
                style = "-" if batching == "on" else "--"
                label = f"{protocol}, batching {batching}"
                xs = [r["concurrency"] for r in rows]
                thr.plot(xs, [r["throughput"] for r in rows], style, marker="o", label=label)
                lat.plot(xs, [r["p99_ms"] for r in rows], style, marker="o", label=label)
        in_process = results["summary"][workload]["in_process_best"]
        thr.axhline(in_process, color="gray", linestyle=":", label="in-process best")
        thr.set_title(f"{workload}: throughput")
        thr.set_ylabel("requests / s")
        lat.set_title(f"{workload}: p99 latency")
        lat.set_ylabel("ms")
        lat.set_yscale("log")
        for ax in (thr, lat):
            ax.set_xscale("log", base=2)
            ax.set_xticks(results["settings"]["concurrency"])
            ax.set_xticklabels([str(c) for c in results["settings"]["concurrency"]])
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        thr.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
