"""Two phases of the loop compared online, with intervals that resample users.

A phase's impressions are not independent draws: ten come in one feed, and all of a user's
feeds reflect that user's tastes and activity. Wilson intervals over impressions treat them
as independent and come out several times too narrow. Here the unit is the user: every
interval is a bootstrap that draws the phase's users with replacement and recomputes each rate
as the drawn users' engagements over their impressions (a ratio of sums, so an active user
weighs as much as in the totals).

Both phases serve the same simulated users, so the comparison is paired: one draw of users
gives both phases' rates and their difference, and the verdict reads the difference's 95%
interval: ``better`` when it lies on the good side of 0, ``worse`` on the bad side,
``overlap`` when it holds 0. A phase's own interval (per version) is the same bootstrap's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from phoenix.config import ACTION_NAMES, NEGATIVE_ACTIONS
from phoenix.training.online_metrics import PER_USER_COLUMNS, wilson

BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0  # the same report from the same online metrics
CONFIDENCE = 0.95
INTERVAL = (
    "95% per-user bootstrap: users drawn with replacement, each rate recomputed as the drawn "
    "users' engagements over their impressions; the verdict reads the interval of the paired "
    "difference (the same draw of users for both phases)"
)
RULE = (
    "better: the difference's 95% interval lies on the good side of 0 for at least one "
    "positive action's engagements per impression, and on the bad side for nothing (negative "
    "actions and the negative-action rate count lower-better); worse: the other way round; "
    "mixed: both; even: neither"
)


@dataclass(frozen=True)
class Metric:
    """A rate of the per-user table: ``numerator`` over ``denominator`` (column names)."""

    name: str
    numerator: str
    denominator: str
    better_when: str  # higher, lower, or none (a share that is neither good nor bad)


def metrics_compared() -> list[Metric]:
    """Every action's engagements per impression, the negative-action rate, the in-network
    share."""
    metrics = [
        Metric(
            f"engagements.{name}",
            name,
            "impressions",
            "lower" if name in NEGATIVE_ACTIONS else "higher",
        )  # fmt: skip
        for name in ACTION_NAMES
    ]
    metrics.append(Metric("negative_rate", "negative", "impressions", "lower"))
    metrics.append(Metric("in_network_share", "in_network", "flagged", "none"))
    return metrics


def positive_actions() -> list[str]:
    return [name for name in ACTION_NAMES if name not in NEGATIVE_ACTIONS]


# ----------------------------------------------------------------------------------------
# Per-user counts and the bootstrap
# ----------------------------------------------------------------------------------------


def user_totals(
    per_user: Mapping, bucket_s: float, users: np.ndarray, start_s: float = 0.0,
    end_s: float = math.inf,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Each column of ``per_user`` (``OnlineMetrics.per_user_table``) summed per user over the
    buckets starting in [start_s, end_s), in the order of ``users`` (0 for a user who had no
    views there)."""
    columns = list(per_user["columns"])
    rows = np.asarray(per_user["rows"], np.int64).reshape(-1, len(columns))
    starts = rows[:, columns.index("bucket")] * bucket_s
    rows = rows[(starts >= start_s) & (starts < end_s)]
    slot = np.searchsorted(users, rows[:, columns.index("user_id")])
    totals = np.zeros((len(users), len(columns)), np.int64)
    np.add.at(totals, slot, rows)
    counted = [(i, name) for i, name in enumerate(columns) if name not in ("user_id", "bucket")]
    return {name: totals[:, i] for i, name in counted}


def phase_users(*tables: Mapping) -> np.ndarray:
    """The sorted ids of every user with a row in any of ``tables``."""
    ids = [np.asarray(t["rows"], np.int64).reshape(-1, len(PER_USER_COLUMNS))[:, 0] for t in tables]
    return np.unique(np.concatenate(ids)) if ids else np.zeros(0, np.int64)


def resample_weights(users: int, draws: int, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[draws, users]: how many times each user is in each bootstrap draw of ``users`` users
    with replacement."""
    if users < 1:
        raise ValueError("no users to resample: were views recorded with a user id?")
    rng = np.random.default_rng(seed)
    return rng.multinomial(users, np.full(users, 1.0 / users), size=draws)


def drawn_rates(weights: np.ndarray, numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """The rate of each draw (NaN where the drawn users had no trials)."""
    trials = weights @ denominator
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(trials > 0, (weights @ numerator) / np.maximum(trials, 1), np.nan)


def percentile_interval(values: np.ndarray) -> tuple[Optional[float], Optional[float]]:
    finite = values[np.isfinite(values)]
    if len(finite) == 0:
        return None, None
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_rate(weights: np.ndarray, numerator: np.ndarray, denominator: np.ndarray) -> dict:
    """A phase's rate (its totals' ratio) with the bootstrap's interval, in ``wilson``'s form;
    also the draws' rates (``draws``) for the paired difference."""
    count, trials = int(numerator.sum()), int(denominator.sum())
    draws = drawn_rates(weights, numerator, denominator)
    if trials == 0:
        return {"rate": None, "low": None, "high": None, "count": count, "draws": draws}
    low, high = percentile_interval(draws)
    return {"rate": count / trials, "low": low, "high": high, "count": count, "draws": draws}


def difference_verdict(low: Optional[float], high: Optional[float], better_when: str) -> str:
    """``better``/``worse`` when the difference's interval lies wholly on one side of 0 (the
    good side per ``better_when``), ``overlap`` when it holds 0, ``n/a`` without a verdict."""
    if better_when == "none" or low is None or high is None:
        return "n/a"
    if low > 0:
        return "better" if better_when == "higher" else "worse"
    if high < 0:
        return "worse" if better_when == "higher" else "better"
    return "overlap"


def compared_rate(metric: Metric, labels: Sequence[str], totals: Sequence[Mapping],
                  weights: np.ndarray) -> dict[str, Any]:  # fmt: skip
    """One metric of both phases: each with its interval, the paired difference with its
    interval, the verdict, and the Wilson intervals for reference."""
    sides = [bootstrap_rate(weights, t[metric.numerator], t[metric.denominator]) for t in totals]
    difference: dict[str, Any] = {"value": None, "low": None, "high": None}
    if sides[0]["rate"] is not None and sides[1]["rate"] is not None:
        low, high = percentile_interval(sides[1]["draws"] - sides[0]["draws"])
        difference = {"value": sides[1]["rate"] - sides[0]["rate"], "low": low, "high": high}
    wilsons = {label: wilson(int(t[metric.numerator].sum()), int(t[metric.denominator].sum()))
               for label, t in zip(labels, totals)}  # fmt: skip
    row: dict[str, Any] = {"metric": metric.name, "better_when": metric.better_when}
    for label, side in zip(labels, sides):
        row[label] = {k: v for k, v in side.items() if k != "draws"}
    verdict = difference_verdict(difference["low"], difference["high"], metric.better_when)
    return row | {"difference": difference, "verdict": verdict, "wilson": wilsons}


# ----------------------------------------------------------------------------------------
# Phases compared
# ----------------------------------------------------------------------------------------


def overall_verdict(better: Sequence[str], worse: Sequence[str]) -> str:
    """better, worse, mixed or even (``RULE``)."""
    if better and not worse:
        return "better"
    if worse and not better:
        return "worse"
    return "mixed" if better else "even"


def compare_phases(
    metrics: Mapping,
    labels: Sequence[str] = ("v1", "v2"),
    start_s: float = 0.0,
    end_s: float = math.inf,
    draws: int = BOOTSTRAP_DRAWS,
) -> dict[str, Any]:
    """The second label's phase against the first's over the buckets starting in
    [start_s, end_s) of each (``OnlineMetrics.summary`` as ``metrics``): a row per rate
    (the actions either phase saw, the negative-action rate, the in-network share) and the
    verdict (``RULE``)."""
    versions, bucket_s = metrics["versions"], float(metrics["bucket_s"])
    tables = [versions[label]["per_user"] for label in labels]
    users = phase_users(*tables)
    totals = [user_totals(t, bucket_s, users, start_s, end_s) for t in tables]
    weights = resample_weights(len(users), draws)
    rows = []
    for metric in metrics_compared():
        seen = any(int(t[metric.numerator].sum()) for t in totals)
        if seen or not metric.name.startswith("engagements."):
            rows.append(compared_rate(metric, labels, totals, weights))
    positive = {f"engagements.{name}" for name in positive_actions()}
    better = [r["metric"] for r in rows if r["metric"] in positive and r["verdict"] == "better"]
    worse = [r["metric"] for r in rows if r["verdict"] == "worse"]
    requests = {
        label: sum(
            b["requests"] for b in versions[label]["buckets"] if start_s <= b["start_s"] < end_s
        )  # fmt: skip
        for label in labels
    }
    return {
        "labels": list(labels),
        "rows": rows,
        "users": {label: int((t["impressions"] > 0).sum()) for label, t in zip(labels, totals)},
        "impressions": {label: int(t["impressions"].sum()) for label, t in zip(labels, totals)},
        "requests": requests,
        "better_outside_interval": better,
        "worse_outside_interval": worse,
        "verdict": overall_verdict(better, worse),
        "beats": bool(better) and not worse,
        "interval": INTERVAL,
        "draws": draws,
        "rule": RULE,
    }


def compare_versions(metrics: Mapping, labels: Sequence[str] = ("v1", "v2"),
                     draws: int = BOOTSTRAP_DRAWS) -> dict[str, Any]:  # fmt: skip
    """The whole phases compared (``compare_phases``), with each one's feed latency."""
    compared = compare_phases(metrics, labels, draws=draws)
    versions = metrics["versions"]
    compared["latency_ms"] = {label: versions[label]["total"]["latency_ms"] for label in labels}
    return compared


def compare_halves(metrics: Mapping, phase_s: float, labels: Sequence[str] = ("v1", "v2"),
                   draws: int = BOOTSTRAP_DRAWS) -> dict[str, Any]:  # fmt: skip
    """The phases' first and second halves compared on their own: a served post is excluded
    for days, so a version that serves each user's best posts first wins the first half and
    may serve leftovers in the second."""
    half = phase_s / 2
    result: dict[str, Any] = {"half_s": half}
    for name, (start, end) in (("first", (0.0, half)), ("second", (half, math.inf))):
        compared = compare_phases(metrics, labels, start, end, draws)
        kept = (
            "rows",
            "impressions",
            "better_outside_interval",
            "worse_outside_interval",
            "verdict",
            "beats",
        )
        result[name] = {k: compared[k] for k in kept}
    return result
