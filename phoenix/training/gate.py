"""The offline gate: a new version against the served one on the same held-out rows.

Both versions are scored by ``evaluate.Evaluator.model_metrics`` on one evaluation set (the
held-out served days), so they see the same requests, candidates and targets. The gate passes
when the new version is not worse than the old on the primary metric beyond the tolerance;
the rollout refuses a version whose ``gate.json`` says ``"passed": false`` unless forced.

Metric names: ``ndcg@20``, ``recall@100``, ``auc.favorite``, ``log_loss.favorite`` (a dotted
name reaches into the per-action tables). Log-losses are better lower, the rest higher.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

GATE_FILE = "gate.json"
PRIMARY_METRIC = "ndcg@20"  # the blended score the feed is ranked by, against logged actions
DEFAULT_TOLERANCE = 0.01
TABLE_METRICS = (
    "ndcg@20", "recall@50", "recall@200",
    "auc.favorite", "auc.reply", "auc.repost", "auc.not_interested",
    "log_loss.favorite", "log_loss.reply", "log_loss.not_interested",
)  # fmt: skip


def lower_is_better(metric: str) -> bool:
    return metric.startswith("log_loss")


def metric_value(metrics: Mapping[str, Any], metric: str) -> float:
    """The value of ``metric`` (a dotted name for per-action tables); KeyError naming it."""
    value: Any = metrics
    for part in metric.split(".", 1):
        if not isinstance(value, Mapping) or part not in value:
            raise KeyError(f"no metric {metric!r} in the evaluation (have {sorted(metrics)})")
        value = value[part]
    return float("nan") if value is None else float(value)


@dataclass(frozen=True)
class GateRule:
    """Passed: the candidate's ``metric`` is within ``tolerance`` of the baseline's or better."""

    metric: str = PRIMARY_METRIC
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self):
        if not (self.tolerance >= 0 and math.isfinite(self.tolerance)):
            raise ValueError(f"gate tolerance must be finite and >= 0, got {self.tolerance}")

    def describe(self) -> str:
        if lower_is_better(self.metric):
            bound = f"candidate {self.metric} <= baseline {self.metric} + {self.tolerance:g}"
        else:
            bound = f"candidate {self.metric} >= baseline {self.metric} - {self.tolerance:g}"
        return f"{bound} on the held-out served rows (both finite)"

    def passes(self, candidate: Mapping[str, Any], baseline: Mapping[str, Any]) -> bool:
        new, old = metric_value(candidate, self.metric), metric_value(baseline, self.metric)
        if not (math.isfinite(new) and math.isfinite(old)):
            return False  # nothing measured (no held-out positives): nothing shown
        if lower_is_better(self.metric):
            return new <= old + self.tolerance
        return new >= old - self.tolerance


def gate_result(
    candidate: Mapping[str, Any],
    baseline: Mapping[str, Any],
    rule: GateRule,
    held_out: Mapping[str, Any],
) -> dict[str, Any]:
    """The contents of ``gate.json``."""
    return {
        "passed": bool(rule.passes(candidate, baseline)),
        "metric": rule.metric,
        "tolerance": rule.tolerance,
        "rule": rule.describe(),
        "candidate": dict(candidate),
        "baseline": dict(baseline),
        "held_out": dict(held_out),
    }


def gate_table(gate: Mapping[str, Any], metrics=TABLE_METRICS) -> str:
    """A readable table: each metric for baseline and candidate, the change, and the verdict."""
    names = list(dict.fromkeys([gate["metric"], *metrics]))
    lines = [f"{'metric':<24}{'baseline':>10}{'candidate':>11}{'change':>9}"]
    for name in names:
        try:
            old = metric_value(gate["baseline"], name)
            new = metric_value(gate["candidate"], name)
        except KeyError:
            continue
        mark = "  <- gate" if name == gate["metric"] else ""
        lines.append(f"{name:<24}{old:>10.4f}{new:>11.4f}{new - old:>+9.4f}{mark}")
    verdict = "PASSED" if gate["passed"] else "FAILED"
    lines.append(f"gate {verdict}: {gate['rule']}")
    return "\n".join(lines)
