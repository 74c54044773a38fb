"""Online metrics of served feeds per model version, in time buckets, and their plot.

What a load of simulated users (``phoenix.world.simulate``) saw and did, counted per model
version label and per time bucket of ``bucket_s`` seconds since the version's first record:

- ``impressions``: viewed posts the world knows; ``unknown_posts`` the served posts it did not;
- ``engagements``: per action, the engagements per impression (each action's rate);
- ``negative_rate``: impressions with at least one negative action (``NEGATIVE_ACTIONS``);
- ``in_network_share``: impressions of in-network posts, among those whose feed carried the
  flag (null when none did);
- ``latency_ms``: percentiles of the feed requests' latency; ``requests`` and ``failures``.

Rates come with 95% Wilson score intervals (``low``, ``high``): exact enough for small counts
and rates near 0, where the normal approximation fails. They treat impressions as independent,
which they are not: a user's impressions share the user's tastes, so these intervals are too
narrow to compare versions by. Each version therefore also keeps its counts per user and
bucket (``per_user``, views recorded with a ``user_id``), from which
``phoenix.loop.compare`` resamples users (a per-user bootstrap).

``write`` keeps the versions already in the JSON file that this run did not record, so runs
with different version labels gather in one file and one plot (time since each one's start).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from phoenix.config import ACTION_NAMES, NEGATIVE_ACTIONS

Z_95 = 1.959963984540054
LATENCY_PERCENTILES = (50, 90, 99)
PLOTTED_ACTIONS = ("favorite", "click", "dwell", "reply", "repost")
NEGATIVE_COLUMNS = [ACTION_NAMES.index(name) for name in NEGATIVE_ACTIONS]
# one row of a version's per-user table: a user's counts in one bucket
PER_USER_COLUMNS = ("user_id", "bucket", "impressions", "negative", "flagged", "in_network",
                    *ACTION_NAMES)  # fmt: skip
SCHEMA = 1


def wilson(successes: int, trials: int, z: float = Z_95) -> dict:
    """A rate with its Wilson score interval; all null without trials."""
    if trials <= 0:
        return {"rate": None, "low": None, "high": None, "count": successes}
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    return {
        "rate": p,
        "low": max(0.0, centre - half),
        "high": min(1.0, centre + half),
        "count": successes,
    }


@dataclass
class Counts:
    """What one version saw in one time bucket (or over the whole run)."""

    impressions: int = 0
    unknown_posts: int = 0
    actions: np.ndarray = field(default_factory=lambda: np.zeros(len(ACTION_NAMES), np.int64))
    negative: int = 0  # impressions with a negative action
    flagged: int = 0  # impressions whose feed said whether the post is in-network
    in_network: int = 0
    requests: int = 0
    failures: int = 0
    latencies_ms: list = field(default_factory=list)

    def add_views(self, actions: np.ndarray, in_network: Optional[np.ndarray], unknown: int):
        self.impressions += len(actions)
        self.unknown_posts += unknown
        self.actions += actions.sum(axis=0, dtype=np.int64)
        self.negative += int(actions[:, NEGATIVE_COLUMNS].any(axis=1).sum())
        if in_network is not None:
            self.flagged += len(in_network)
            self.in_network += int(np.sum(in_network))

    def add_request(self, latency_s: float, ok: bool):
        self.requests += 1
        self.failures += not ok
        if ok:  # a failure's time says nothing of serving a feed
            self.latencies_ms.append(1e3 * latency_s)

    def summary(self) -> dict:
        latency = None
        if self.latencies_ms:
            values = np.percentile(self.latencies_ms, LATENCY_PERCENTILES)
            latency = {f"p{q}": float(v) for q, v in zip(LATENCY_PERCENTILES, values)}
            latency["mean"] = float(np.mean(self.latencies_ms))
        return {
            "impressions": self.impressions,
            "unknown_posts": self.unknown_posts,
            "requests": self.requests,
            "failures": self.failures,
            "engagements": {
                name: wilson(int(count), self.impressions)
                for name, count in zip(ACTION_NAMES, self.actions)
            },
            "negative_rate": wilson(self.negative, self.impressions),
            "in_network_share": wilson(self.in_network, self.flagged) if self.flagged else None,
            "latency_ms": latency,
        }


class OnlineMetrics:
    """Counts per version label and time bucket; ``ts`` are wall-clock seconds."""

    def __init__(self, bucket_s: float = 10.0):
        if not bucket_s > 0:
            raise ValueError(f"bucket_s must be > 0, got {bucket_s}")
        self.bucket_s = bucket_s
        self.start_ts: dict[str, float] = {}
        self.buckets: dict[str, dict[int, Counts]] = {}
        self.totals: dict[str, Counts] = {}
        # version -> (user, bucket) -> counts in PER_USER_COLUMNS' order from "impressions"
        self.per_user: dict[str, dict[tuple[int, int], np.ndarray]] = {}

    def _bucket(self, version: str, ts: float) -> int:
        start = self.start_ts.setdefault(version, ts)
        return max(0, int((ts - start) // self.bucket_s))

    def _counts(self, version: str, ts: float) -> tuple[Counts, Counts]:
        bucket = self._bucket(version, ts)
        buckets = self.buckets.setdefault(version, {})
        total = self.totals.setdefault(version, Counts())
        return buckets.setdefault(bucket, Counts()), total

    def record_request(self, version: str, ts: float, latency_s: float, ok: bool) -> None:
        """One feed request and how long it took."""
        for counts in self._counts(version, ts):
            counts.add_request(latency_s, ok)

    def record_views(
        self,
        version: str,
        ts: float,
        actions: np.ndarray,
        in_network: Optional[np.ndarray] = None,
        unknown_posts: int = 0,
        user_id: Optional[int] = None,
    ) -> None:
        """The actions [V, 19] on the V posts viewed of one feed (``in_network`` [V] if known),
        also counted for ``user_id`` when given."""
        actions = np.asarray(actions).reshape(-1, len(ACTION_NAMES))
        for counts in self._counts(version, ts):
            counts.add_views(actions, in_network, unknown_posts)
        if user_id is not None:
            self._add_user_views(version, ts, int(user_id), actions, in_network)

    def _add_user_views(self, version: str, ts: float, user_id: int, actions: np.ndarray,
                        in_network: Optional[np.ndarray]) -> None:  # fmt: skip
        key = (user_id, self._bucket(version, ts))
        table = self.per_user.setdefault(version, {})
        row = table.setdefault(key, np.zeros(len(PER_USER_COLUMNS) - 2, np.int64))
        flagged = 0 if in_network is None else len(in_network)
        row[:4] += (len(actions), int(actions[:, NEGATIVE_COLUMNS].any(axis=1).sum()), flagged,
                    0 if in_network is None else int(np.sum(in_network)))  # fmt: skip
        row[4:] += actions.sum(axis=0, dtype=np.int64)

    def per_user_table(self, version: str) -> dict:
        """A version's counts per user and bucket: ``columns`` and ``rows`` (one a line)."""
        table = self.per_user.get(version, {})
        rows = [[user, bucket, *map(int, table[user, bucket])] for user, bucket in sorted(table)]
        return {"columns": list(PER_USER_COLUMNS), "rows": rows}

    def summary(self) -> dict:
        versions = {}
        for version, buckets in self.buckets.items():
            start = self.start_ts[version]
            versions[version] = {
                "start_ts": start,
                "total": self.totals[version].summary(),
                "buckets": [
                    {"start_s": index * self.bucket_s, **buckets[index].summary()}
                    for index in sorted(buckets)
                ],
                "per_user": self.per_user_table(version),
            }
        return {
            "schema": SCHEMA,
            "bucket_s": self.bucket_s,
            "interval": "95% Wilson score interval per rate (low, high)",
            "versions": versions,
        }

    def write(self, path: Path, extra: Optional[dict] = None) -> dict:
        """The summary as JSON at ``path``, keeping versions already there that this run did
        not record; returns what was written."""
        written = self.summary() | (extra or {})
        earlier = read_versions(path)
        written["versions"] = {**earlier, **written["versions"]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(dumps(written))
        return written


NUMBER_LIST = re.compile(r"\[\s*(-?[\d.eE+-]+(?:,\s*-?[\d.eE+-]+)*)\s*\]")


def dumps(summary: dict) -> str:
    """``summary`` as indented JSON with each list of numbers on one line (the per-user
    tables hold thousands of numbers: one a line would make them unreadable)."""
    text = json.dumps(summary, indent=1)

    def one_line(match: re.Match) -> str:
        return "[" + ", ".join(part.strip() for part in match.group(1).split(",")) + "]"

    return NUMBER_LIST.sub(one_line, text) + "\n"


def read_versions(path: Path) -> dict:
    """The versions of an earlier online-metrics file; none when it is absent or another kind."""
    try:
        earlier = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict) or earlier.get("schema") != SCHEMA:
        return {}
    versions = earlier.get("versions")
    return versions if isinstance(versions, dict) else {}


def _series(buckets: list, pick) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Times, values and interval bounds of a rate over buckets (NaN where undefined)."""
    times = np.array([b["start_s"] for b in buckets], float)
    rates = [pick(b) or {} for b in buckets]
    values = np.array([np.nan if r.get("rate") is None else r["rate"] for r in rates], float)
    low = np.array([np.nan if r.get("low") is None else r["low"] for r in rates], float)
    high = np.array([np.nan if r.get("high") is None else r["high"] for r in rates], float)
    return times, values, low, high


def plot(summary: dict, path: Path) -> Path:
    """A PNG of the metrics over time, one line per version (and action), rates with bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    panels = axes.ravel()
    for version, data in sorted(summary["versions"].items()):
        buckets = data["buckets"]
        times = np.array([b["start_s"] for b in buckets], float)
        panels[0].plot(times, [b["impressions"] for b in buckets], marker=".", label=version)
        for name in PLOTTED_ACTIONS:
            t, v, lo, hi = _series(buckets, lambda b, n=name: b["engagements"][n])
            (line,) = panels[1].plot(t, v, marker=".", label=f"{version} {name}")
            panels[1].fill_between(t, lo, hi, color=line.get_color(), alpha=0.15)
        for panel, pick in (
            (panels[2], lambda b: b["negative_rate"]),
            (panels[3], lambda b: b["in_network_share"]),
        ):
            t, v, lo, hi = _series(buckets, pick)
            (line,) = panel.plot(t, v, marker=".", label=version)
            panel.fill_between(t, lo, hi, color=line.get_color(), alpha=0.15)
        for q in LATENCY_PERCENTILES:
            latency = [(b["latency_ms"] or {}).get(f"p{q}", np.nan) for b in buckets]
            panels[4].plot(times, latency, marker=".", label=f"{version} p{q}")
        failures = [b["failures"] for b in buckets]
        panels[5].plot(times, failures, marker=".", label=version)
    titles = (
        ("impressions per bucket", "impressions"),
        ("engagements per impression (95% Wilson)", "rate"),
        ("negative-action rate (95% Wilson)", "rate"),
        ("in-network share (95% Wilson)", "share"),
        ("feed request latency", "ms"),
        ("failed requests per bucket", "failures"),
    )
    for panel, (title, unit) in zip(panels, titles):
        panel.set_title(title)
        panel.set_xlabel(
            f"seconds since the version's start (buckets of {summary['bucket_s']:g} s)"
        )
        panel.set_ylabel(unit)
        if panel.lines:
            panel.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
