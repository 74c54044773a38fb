"""The loop's online comparison (phoenix.loop.compare): per-user bootstrap intervals,
paired across the two phases, and the verdicts that read them."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.loop.compare import (
    compare_halves,
    compare_versions,
    difference_verdict,
    overall_verdict,
    resample_weights,
    user_totals,
)
from phoenix.training.online_metrics import OnlineMetrics, wilson

FAVORITE = ACTION_NAMES.index("favorite")
NOT_INTERESTED = ACTION_NAMES.index("not_interested")
DRAWS = 1000


def user_feeds(metrics: OnlineMetrics, label: str, user: int, feeds: int, favorite_rate: float,
               rng, negative_rate: float = 0.0, start: float = 0.0) -> None:  # fmt: skip
    """``feeds`` feeds of 10 views for ``user``, a feed a second from ``start``, each view a
    favorite with ``favorite_rate`` (drawn) and a not-interested with ``negative_rate``."""
    for i in range(feeds):
        actions = np.zeros((10, len(ACTION_NAMES)), np.int8)
        actions[:, FAVORITE] = rng.random(10) < favorite_rate
        actions[:, NOT_INTERESTED] = rng.random(10) < negative_rate
        ts = start + i
        metrics.record_request(label, ts, 0.02, ok=True)
        metrics.record_views(label, ts, actions, np.zeros(10, bool), user_id=user)


def row(comparison: dict, metric: str) -> dict:
    return next(r for r in comparison["rows"] if r["metric"] == metric)


def test_users_whose_rates_differ_widen_the_interval_past_wilsons():
    """16 users at 2% to 30% favorites, 600 views each: Wilson treats the 9,600 views as
    independent; resampling users sees that they come from 16 users. Both phases saw the
    same views (the same seed), so their difference is 0 in every draw."""
    metrics = OnlineMetrics()
    for label in ("v1", "v2"):
        rng = np.random.default_rng(1)
        for user, rate in enumerate(np.linspace(0.02, 0.30, 16)):
            user_feeds(metrics, label, 100 + user, 60, rate, rng)
    favorite = row(compare_versions(metrics.summary(), draws=DRAWS), "engagements.favorite")
    v1, by_wilson = favorite["v1"], favorite["wilson"]["v1"]
    assert v1["count"] == by_wilson["count"] and v1["rate"] == pytest.approx(by_wilson["rate"])
    assert v1["low"] < v1["rate"] < v1["high"]
    width, wilson_width = v1["high"] - v1["low"], by_wilson["high"] - by_wilson["low"]
    assert width > 3 * wilson_width
    assert favorite["difference"] == {"value": 0.0, "low": 0.0, "high": 0.0}
    assert favorite["verdict"] == "overlap"


def test_a_gain_of_every_user_is_found_through_the_pairing():
    """Every user gains 3 points over rates that differ between users by 28: each phase's
    interval is wide and they overlap, but the paired difference lies above 0."""
    metrics, rng = OnlineMetrics(), np.random.default_rng(2)
    for user, rate in enumerate(np.linspace(0.02, 0.30, 16)):
        user_feeds(metrics, "v1", user, 60, rate, rng)
        user_feeds(metrics, "v2", user, 60, rate + 0.03, rng)
    comparison = compare_versions(metrics.summary(), draws=DRAWS)
    favorite = row(comparison, "engagements.favorite")
    assert favorite["v2"]["low"] < favorite["v1"]["high"]  # the phases' intervals overlap
    assert 0 < favorite["difference"]["low"] < favorite["difference"]["value"]
    assert favorite["difference"]["value"] == pytest.approx(0.03, abs=0.01)
    assert favorite["verdict"] == "better"
    assert comparison["better_outside_interval"] == ["engagements.favorite"]
    assert comparison["verdict"] == "better" and comparison["beats"] is True
    assert comparison["users"] == {"v1": 16, "v2": 16}


def test_one_users_gain_is_not_a_gain_of_the_version():
    """One of eight users goes from 5% to 60% favorites, the rest do not move: counted over
    impressions, Wilson's intervals call that better; resampling users does not."""
    metrics, rng = OnlineMetrics(), np.random.default_rng(3)
    for user in range(8):
        user_feeds(metrics, "v1", user, 50, 0.05, rng)
        user_feeds(metrics, "v2", user, 50, 0.60 if user == 0 else 0.05, rng)
    favorite = row(compare_versions(metrics.summary(), draws=DRAWS), "engagements.favorite")
    assert favorite["wilson"]["v2"]["low"] > favorite["wilson"]["v1"]["high"]
    assert favorite["difference"]["low"] <= 0 < favorite["difference"]["high"]
    assert favorite["verdict"] == "overlap"


def test_more_negative_actions_are_worse_and_keep_v2_from_beating_v1():
    metrics, rng = OnlineMetrics(), np.random.default_rng(4)
    for user in range(12):
        user_feeds(metrics, "v1", user, 40, 0.05, rng, negative_rate=0.01)
        user_feeds(metrics, "v2", user, 40, 0.15, rng, negative_rate=0.10)
    comparison = compare_versions(metrics.summary(), draws=DRAWS)
    assert comparison["better_outside_interval"] == ["engagements.favorite"]
    assert set(comparison["worse_outside_interval"]) == {
        "engagements.not_interested",
        "negative_rate",
    }
    assert comparison["verdict"] == "mixed" and comparison["beats"] is False
    # actions neither phase saw are left out; the rates every report has are there
    assert {r["metric"] for r in comparison["rows"]} == {
        "engagements.favorite", "engagements.not_interested", "negative_rate",
        "in_network_share"}  # fmt: skip
    assert row(comparison, "in_network_share")["verdict"] == "n/a"
    assert comparison["latency_ms"]["v1"]["p50"] == pytest.approx(20.0)


def test_the_verdict_reads_the_side_of_zero_the_difference_lies_on():
    assert difference_verdict(0.01, 0.03, "higher") == "better"
    assert difference_verdict(-0.03, -0.01, "higher") == "worse"
    assert difference_verdict(0.01, 0.03, "lower") == "worse"
    assert difference_verdict(-0.03, -0.01, "lower") == "better"
    assert difference_verdict(-0.01, 0.01, "higher") == "overlap"
    assert difference_verdict(0.01, 0.03, "none") == "n/a"
    assert difference_verdict(None, None, "higher") == "n/a"
    assert [overall_verdict(b, w) for b, w in (("a", ""), ("", "b"), ("a", "b"), ("", ""))] == [
        "better", "worse", "mixed", "even"]  # fmt: skip


def test_user_totals_sum_a_users_buckets_within_the_span():
    table = {
        "columns": ["user_id", "bucket", "impressions", "negative", "favorite"],
        "rows": [[7, 0, 10, 1, 2], [7, 3, 10, 0, 5], [9, 1, 20, 2, 1]],
    }
    users = np.array([7, 8, 9])
    whole = user_totals(table, 10.0, users)
    assert whole["impressions"].tolist() == [20, 0, 20] and whole["favorite"].tolist() == [7, 0, 1]
    early = user_totals(table, 10.0, users, start_s=0.0, end_s=20.0)  # buckets 0 and 1
    assert early["favorite"].tolist() == [2, 0, 1]


def test_a_draw_resamples_as_many_users_as_there_are_and_repeats_for_a_seed():
    weights = resample_weights(16, 500)
    assert weights.shape == (500, 16) and (weights.sum(axis=1) == 16).all()
    assert (weights == resample_weights(16, 500)).all()
    assert (weights == 1).all(axis=1).mean() < 0.01  # a draw is seldom the sample itself
    with pytest.raises(ValueError, match="no users to resample"):
        resample_weights(0, 10)


def test_each_half_of_the_phases_is_compared_with_its_own_users_counts():
    metrics, rng = OnlineMetrics(bucket_s=10.0), np.random.default_rng(5)
    for user in range(10):  # v2 better in the first 60 s only
        user_feeds(metrics, "v1", user, 120, 0.05, rng)
        user_feeds(metrics, "v2", user, 60, 0.25, rng)
        user_feeds(metrics, "v2", user, 60, 0.05, rng, start=60.0)
    halves = compare_halves(metrics.summary(), phase_s=120.0, draws=DRAWS)
    assert halves["half_s"] == 60.0
    assert halves["first"]["impressions"] == {"v1": 6000, "v2": 6000}
    assert halves["first"]["verdict"] == "better"
    assert halves["second"]["verdict"] == "even"


def test_the_totals_of_the_per_user_table_are_the_versions_totals():
    metrics, rng = OnlineMetrics(), np.random.default_rng(6)
    for user in range(5):
        user_feeds(metrics, "v1", user, 7, 0.2, rng, negative_rate=0.05)
        user_feeds(metrics, "v2", user, 7, 0.2, rng, negative_rate=0.05)
    summary = metrics.summary()
    comparison = compare_versions(summary, draws=DRAWS)
    for label in ("v1", "v2"):
        total = summary["versions"][label]["total"]
        assert comparison["impressions"][label] == total["impressions"] == 350
        assert row(comparison, "negative_rate")[label]["count"] == total["negative_rate"]["count"]
        assert row(comparison, "engagements.favorite")[label]["rate"] == pytest.approx(
            total["engagements"]["favorite"]["rate"]
        )
    assert wilson(1, 2)["rate"] == 0.5  # the reference intervals are Wilson's
