"""The loop's report: ``loop.json`` (everything), ``loop.md`` (the verdicts and tables, also
printed), ``loop.png`` (both phases' rates with per-user intervals and their differences) and
the online metrics over time.

The report opens with the outcome in words: v2's offline gate, whether v2 was rolled out (and
how many requests failed while it was), and v2's online verdict against v1 with per-user
intervals (``compare``). A v2 that its gate refused is not rolled out; the second phase then
serves v1 again to the same users (label ``v1-again``), an A/A comparison that shows what
the intervals say when nothing changed, and the report says so.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.loop.compare import compare_halves, compare_versions
from phoenix.loop.options import LoopError, LoopOptions, Progress

SCHEMA = 2
FIRST, SECOND_V2, SECOND_V1 = "v1", "v2", "v1-again"
HEADLINE_METRICS = ("ndcg@20", "recall@100", "recall@200")
# below this many users, resampling users understates the spread markedly (docs/loop.md)
FEW_USERS = 16


def second_label(rolled_out: bool) -> str:
    """The label of the second measured phase: v2 when it was rolled out, else v1 again."""
    return SECOND_V2 if rolled_out else SECOND_V1


def rollout_window(locust: Optional[Mapping], metrics: Optional[Mapping]) -> Optional[dict]:
    """The failed requests of the reacting users who ran through the rollout: Locust's count
    (feeds and engagement writes) and the feeds the online metrics recorded; None when no
    rollout ran."""
    if locust is None:
        return None
    feeds = (metrics or {}).get("total", {})
    return {
        "locust_requests": locust["requests"],
        "locust_failures": locust["failures"],
        "by_name": locust["by_name"],
        "feed_requests": feeds.get("requests"),
        "feed_failures": feeds.get("failures"),
    }


def gate_figures(gate: Mapping) -> dict[str, Any]:
    """gate.json's verdict and headline figures (both sides' ndcg@20, recall and AUCs)."""
    keep = ("ndcg@20", "recall@100", "recall@200", "auc", "log_loss")

    def pick(side: Mapping) -> dict:
        return {k: side[k] for k in keep if k in side}

    return {
        "passed": gate["passed"],
        "rule": gate.get("rule"),
        "held_out": gate.get("held_out"),
        "candidate": pick(gate.get("candidate", {})),
        "baseline": pick(gate.get("baseline", {})),
    }


def gate_text(gate: Mapping) -> str:
    """``passed (ndcg@20 v1 0.1967 -> v2 0.3349 on 64 held-out users; rule)``."""
    verdict = "passed" if gate["passed"] else "FAILED"
    figures = [
        f"{m} v1 {gate['baseline'][m]:.4f} -> v2 {gate['candidate'][m]:.4f}"
        for m in HEADLINE_METRICS[:1]
        if m in gate.get("baseline", {}) and m in gate.get("candidate", {})
    ]
    users = (gate.get("held_out") or {}).get("users")
    on = f" on {users} held-out users" if users is not None else ""
    return f"{verdict} ({'; '.join(figures)}{on}; {gate.get('rule')})"


def listed(metrics: Sequence[str]) -> str:
    return ", ".join(m.removeprefix("engagements.") for m in metrics) or "nothing"


def outcome(gate: Mapping, rollout: Mapping, window: Optional[Mapping],
            comparison: Mapping) -> dict[str, Any]:  # fmt: skip
    """The run's verdicts, and a headline that states them in words."""
    rolled = rollout["state"] == "done"
    first, second = comparison["labels"]
    gate_line = f"v2's offline gate: {gate_text(gate)}."
    if rolled:
        assert window is not None  # a rollout's Locust window
        forced = "" if gate["passed"] else " (forced past its failed gate)"
        rollout_line = (f"v2 was rolled out under load{forced}: {window['locust_failures']} "
                        f"failed of {window['locust_requests']:,} requests.")  # fmt: skip
    else:
        rollout_line = f"v2 was not rolled out: {rollout['reason']}. v1 kept serving."
    users = comparison["users"][second]
    online_line = (
        f"Online, {second} against {first} ({users} users, 95% per-user bootstrap intervals "
        f"of the difference): **{comparison['verdict']}**, better on "
        f"{listed(comparison['better_outside_interval'])}, worse on "
        f"{listed(comparison['worse_outside_interval'])}."
    )
    if not rolled:
        online_line += (" The second phase served v1 again to the same users: an A/A check of "
                        "what the intervals say when nothing changed.")  # fmt: skip
    if users < FEW_USERS:
        online_line += (f" With fewer than {FEW_USERS} users a bootstrap over users is rough: "
                        "read the intervals as a guide only.")  # fmt: skip
    return {
        "gate": "passed" if gate["passed"] else "failed",
        "rolled_out": rolled,
        "second_phase": second,
        # v2's online verdict; None when it was not served (then online_verdict is the A/A's)
        "online_verdict_of_v2": comparison["verdict"] if rolled else None,
        "online_verdict": comparison["verdict"],
        "headline": " ".join((gate_line, rollout_line, online_line)),
    }


def assemble_report(
    options: LoopOptions,
    metrics: Mapping,
    *,
    gate: Mapping,
    rollout: Mapping,
    export: Mapping,
    steps: Sequence[Mapping],
    phases: Mapping,
) -> dict[str, Any]:
    """The loop's report (loop.json). ``rollout``: ``state`` (``done`` or ``refused``),
    ``reason``, the rollout library's ``report`` and the window's Locust counts (``locust``,
    None when no rollout ran)."""
    labels = (FIRST, second_label(rollout["state"] == "done"))
    versions = metrics["versions"]
    for label in labels:
        if label not in versions:
            raise LoopError(f"the online metrics hold no version {label!r}: did its users run?")
    settings = {k: str(v) if isinstance(v, Path) else v
                for k, v in dataclasses.asdict(options).items()}  # fmt: skip
    comparison = compare_versions(metrics, labels)
    window = rollout_window(rollout.get("locust"), versions.get("rollout"))
    library = {k: v for k, v in (rollout.get("report") or {}).items() if k != "previous_configs"}
    return {
        "schema": SCHEMA,
        "what": "one run of the loop (python -m phoenix.loop; docs/loop.md)",
        "settings": settings,
        "outcome": outcome(gate, rollout, window, comparison),
        "comparison": comparison,
        "comparison_by_half": compare_halves(metrics, 60.0 * options.minutes, labels),
        "rollout_window": window,
        "rollout": {"state": rollout["state"], "reason": rollout.get("reason"), **library},
        "gate": gate_figures(gate),
        "export": dict(export),
        "phases": dict(phases),
        "steps": list(steps),
        "interval": comparison["interval"],
    }


# ----------------------------------------------------------------------------------------
# loop.md
# ----------------------------------------------------------------------------------------


def rate_text(rate: Optional[Mapping]) -> str:
    if not rate or rate.get("rate") is None:
        return "n/a"
    if rate.get("low") is None:
        return f"{rate['rate']:.4f}"
    return f"{rate['rate']:.4f} [{rate['low']:.4f}, {rate['high']:.4f}]"


def difference_text(difference: Mapping) -> str:
    if difference.get("value") is None:
        return "n/a"
    if difference.get("low") is None:
        return f"{difference['value']:+.4f}"
    return f"{difference['value']:+.4f} [{difference['low']:+.4f}, {difference['high']:+.4f}]"


def comparison_table(comparison: Mapping) -> list[str]:
    first, second = comparison["labels"]
    lines = [
        f"{first}: {comparison['impressions'][first]:,} impressions of "
        f"{comparison['requests'][first]:,} feeds from {comparison['users'][first]} users; "
        f"{second}: {comparison['impressions'][second]:,} of {comparison['requests'][second]:,}"
        f" from {comparison['users'][second]}. Intervals: {comparison['interval']}.",
        "",
        f"| metric | {first} (95% interval) | {second} (95% interval) | {second} - {first} "
        "(95% interval) | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in comparison["rows"]:
        lines.append(f"| {row['metric']} | {rate_text(row[first])} | {rate_text(row[second])} | "
                     f"{difference_text(row['difference'])} | {row['verdict']} |")  # fmt: skip
    for q in ("p50", "p90", "p99"):
        a, b = (comparison["latency_ms"][k] or {} for k in (first, second))
        if q in a and q in b:
            lines.append(f"| latency {q} (ms) | {a[q]:.1f} | {b[q]:.1f} | {b[q] - a[q]:+.1f} | |")
    return lines


def halves_lines(report: Mapping) -> list[str]:
    lines = []
    for half in ("first", "second"):
        if half in report.get("comparison_by_half", {}):
            part = report["comparison_by_half"][half]
            counts = " and ".join(f"{n:,}" for n in part["impressions"].values())
            lines.append(f"- {half} half of each phase ({counts} impressions): {part['verdict']};"
                         f" better on {listed(part['better_outside_interval'])}; worse on "
                         f"{listed(part['worse_outside_interval'])}")  # fmt: skip
    return lines


def rollout_lines(report: Mapping) -> list[str]:
    window = report["rollout_window"]
    if window is None:
        return [f"No rollout: {report['rollout']['reason']}."]
    lines = [f"Rollout under load: {window['locust_failures']} failed of "
             f"{window['locust_requests']:,} Locust requests (feeds: {window['feed_failures']} "
             f"of {window['feed_requests']})", "", "| t (s) | event |", "|---|---|"]  # fmt: skip
    for event in report["rollout"].get("timeline", []):
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("t_s", "event"))
        lines.append(f"| {event['t_s']:.2f} | {event['event']} {detail} |")
    return lines


def gate_lines(gate: Mapping) -> list[str]:
    lines = [f"Offline gate: {'passed' if gate['passed'] else 'FAILED'} ({gate['rule']}; "
             f"{(gate.get('held_out') or {}).get('users')} held-out users)"]  # fmt: skip
    for metric in HEADLINE_METRICS:
        if metric in gate["candidate"] and metric in gate["baseline"]:
            lines.append(f"- {metric}: v1 {gate['baseline'][metric]:.4f} -> v2 "
                         f"{gate['candidate'][metric]:.4f}")  # fmt: skip
    return lines


def markdown_report(report: Mapping) -> str:
    """The outcome in words, the comparison table, the halves, the rollout and the gate."""
    lines = [report["outcome"]["headline"], ""]
    lines += comparison_table(report["comparison"])
    lines += ["", *halves_lines(report), "", *rollout_lines(report), ""]
    lines += gate_lines(report["gate"])
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# loop.png
# ----------------------------------------------------------------------------------------

VERDICT_COLOURS = {"better": "tab:green", "worse": "tab:red"}


def error_bars(sides: Sequence[Mapping], centre: str, low: str, high: str) -> list:
    """matplotlib's yerr/xerr from interval bounds (clipped at 0: the bootstrap's percentile
    interval need not hold the point estimate of a very skewed rate)."""
    values = np.array([s[centre] for s in sides], float)
    lows = np.array([np.nan if s[low] is None else s[low] for s in sides], float)
    highs = np.array([np.nan if s[high] is None else s[high] for s in sides], float)
    below, above = np.nan_to_num(values - lows), np.nan_to_num(highs - values)
    return [np.maximum(0, below), np.maximum(0, above)]


def relative(difference: Mapping, base: float) -> dict:
    """A difference and its interval as shares of the first phase's rate (rare actions'
    differences are too small to see on one axis with the common ones'); NaN without one."""
    scale = base if base else float("nan")
    return {k: None if difference[k] is None else difference[k] / scale
            for k in ("value", "low", "high")}  # fmt: skip


def plot_report(report: Mapping, path: Path) -> Path:
    """A PNG: both phases' rates with their per-user intervals, the paired differences with
    theirs (green: better, red: worse) and the feeds' latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comparison = report["comparison"]
    labels = comparison["labels"]
    rows = [r for r in comparison["rows"]
            if all((r[k] or {}).get("rate") is not None for k in labels)]  # fmt: skip
    names = [r["metric"].removeprefix("engagements.") for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(18, 5.5), gridspec_kw={"width_ratios": [4, 2.5, 1.3]})
    x = np.arange(len(rows))
    for offset, label in ((-0.2, labels[0]), (0.2, labels[1])):
        sides = [r[label] for r in rows]
        axes[0].bar(x + offset, [s["rate"] for s in sides], 0.4, label=label, capsize=3,
                    yerr=error_bars(sides, "rate", "low", "high"))  # fmt: skip
    axes[0].set_xticks(x, names, rotation=45, ha="right")
    axes[0].set_title("rate per impression (95% per-user bootstrap intervals)")
    axes[0].legend()
    differences = [relative(r["difference"], r[labels[0]]["rate"]) for r in rows]
    colours = [VERDICT_COLOURS.get(r["verdict"], "tab:gray") for r in rows]
    axes[1].barh(x, [d["value"] for d in differences], color=colours, capsize=3,
                 xerr=error_bars(differences, "value", "low", "high"))  # fmt: skip
    axes[1].axvline(0, color="black", linewidth=0.8)
    axes[1].set_yticks(x, names)
    axes[1].invert_yaxis()
    axes[1].set_title(f"({labels[1]} - {labels[0]}) / {labels[0]}, paired 95% interval")
    quantiles = ("p50", "p90", "p99")
    qx = np.arange(len(quantiles))
    for offset, label in ((-0.2, labels[0]), (0.2, labels[1])):
        latency = comparison["latency_ms"][label] or {}
        axes[2].bar(qx + offset, [latency.get(q, np.nan) for q in quantiles], 0.4, label=label)
    axes[2].set_xticks(qx, quantiles)
    axes[2].set_title("feed latency (ms)")
    axes[2].legend()
    fig.suptitle(plot_title(report))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_title(report: Mapping) -> str:
    result, window = report["outcome"], report["rollout_window"]
    first, second = report["comparison"]["labels"]
    rollout = ("not rolled out" if window is None else
               f"rolled out, {window['locust_failures']} failed of {window['locust_requests']:,}"
               " requests")  # fmt: skip
    return (
        f"gate {result['gate']}; {rollout}; online {second} vs {first} "
        f"({report['settings']['minutes']:g} min each): {result['online_verdict']}"
    )


# ----------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------


def strict_json(value: Any) -> Any:
    """``value`` with NaN and infinities as null (a shadow of empty feeds measures no rank
    correlation): loop.json stays standard JSON."""
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def in_repository_terms(value: Any) -> Any:
    """``value`` with this checkout's absolute path left out of its strings (the rollout's
    timeline names artifact directories): results read the same in every checkout."""
    root = f"{Path(__file__).resolve().parents[2]}/"
    if isinstance(value, str):
        return value.replace(root, "")
    if isinstance(value, Mapping):
        return {k: in_repository_terms(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [in_repository_terms(v) for v in value]
    return value


def write_outputs(report: Mapping, metrics: dict, out: Path, log: Progress) -> None:
    """loop.json, loop.png, loop.md and the online metrics over time (JSON and PNG) in out."""
    from phoenix.training.online_metrics import dumps, plot

    out.mkdir(parents=True, exist_ok=True)
    report = in_repository_terms(report)
    (out / "loop.json").write_text(json.dumps(strict_json(report), indent=1) + "\n")
    (out / "online-metrics.json").write_text(dumps(metrics))
    plot(metrics, out / "online-metrics.png")
    plot_report(report, out / "loop.png")
    table = markdown_report(report)
    (out / "loop.md").write_text(table + "\n")
    print(table, flush=True)
    log(f"wrote {out}/loop.json, loop.png, loop.md, online-metrics.json and online-metrics.png")
