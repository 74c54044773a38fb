"""Online metrics per model version and time bucket, with Wilson intervals."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.training.online_metrics import OnlineMetrics, plot, wilson

T0 = 1_800_000_000.0


def views(*rows: tuple[str, ...]) -> np.ndarray:
    """Action rows [V, 19] from the names each view fired."""
    out = np.zeros((len(rows), len(ACTION_NAMES)), np.uint8)
    for i, names in enumerate(rows):
        for name in names:
            out[i, ACTION_NAMES.index(name)] = 1
    return out


def test_wilson_interval_matches_known_values():
    half = wilson(5, 10)
    assert half["rate"] == 0.5
    assert half["low"] == pytest.approx(0.2366, abs=1e-4)
    assert half["high"] == pytest.approx(0.7634, abs=1e-4)
    none = wilson(0, 10)  # the normal approximation would say [0, 0]
    assert none["low"] == 0.0 and none["high"] == pytest.approx(0.2775, abs=1e-4)
    assert wilson(0, 0)["rate"] is None


def test_counts_per_version_and_bucket():
    metrics = OnlineMetrics(bucket_s=10)
    metrics.record_views("v1", T0, views(("favorite", "dwell"), ()), np.array([True, False]), 1)
    metrics.record_views("v1", T0 + 5, views(("not_interested",), ("report", "block_author")))
    metrics.record_views("v1", T0 + 12, views(("favorite",)), np.array([True]))
    for i, ms in enumerate((10, 20, 30, 40)):
        metrics.record_request("v1", T0 + i, ms / 1e3, ok=True)
    metrics.record_request("v1", T0 + 4, 5.0, ok=False)
    metrics.record_views("v2", T0 + 100, views(("click",)))
    summary = metrics.summary()

    first, second = summary["versions"]["v1"]["buckets"]
    assert (first["start_s"], second["start_s"]) == (0, 10)
    assert first["impressions"] == 4 and first["unknown_posts"] == 1
    assert first["engagements"]["favorite"]["rate"] == 0.25
    assert first["negative_rate"]["rate"] == 0.5  # two views had a negative action
    assert first["in_network_share"]["rate"] == 0.5  # of the two flagged views
    assert first["requests"] == 5 and first["failures"] == 1
    assert first["latency_ms"]["p50"] == pytest.approx(25.0)  # the failure's time is left out
    assert second["in_network_share"]["rate"] == 1.0 and second["latency_ms"] is None
    total = summary["versions"]["v1"]["total"]
    assert total["impressions"] == 5 and total["engagements"]["favorite"]["count"] == 2
    v2 = summary["versions"]["v2"]
    assert v2["start_ts"] == T0 + 100 and v2["buckets"][0]["start_s"] == 0
    assert v2["total"]["in_network_share"] is None  # no feed carried the flag


def test_write_keeps_other_versions_and_plot_draws_them(tmp_path):
    path = tmp_path / "online.json"
    first = OnlineMetrics(bucket_s=10)
    first.record_views("v1", T0, views(("favorite",), ()))
    first.record_request("v1", T0, 0.02, ok=True)
    first.write(path)
    second = OnlineMetrics(bucket_s=10)
    second.record_views("v2", T0, views(("click",)))
    written = second.write(path, extra={"seed": 3})
    saved = json.loads(path.read_text())
    assert saved == written and set(saved["versions"]) == {"v1", "v2"} and saved["seed"] == 3
    png = plot(saved, tmp_path / "online.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bucket_width_must_be_positive():
    with pytest.raises(ValueError, match="bucket_s"):
        OnlineMetrics(bucket_s=0)


def test_views_with_a_user_id_are_also_counted_per_user_and_bucket(tmp_path):
    metrics = OnlineMetrics(bucket_s=10)
    metrics.record_views("v1", T0, views(("favorite", "dwell"), ("report",)), None, user_id=7)
    metrics.record_views("v1", T0 + 3, views(("favorite",)), np.array([True]), user_id=7)
    metrics.record_views("v1", T0 + 12, views((), ()), user_id=5)
    metrics.record_views("v1", T0 + 13, views(("click",)))  # no user: totals only
    table = metrics.summary()["versions"]["v1"]["per_user"]
    columns = table["columns"]
    assert columns[:6] == ["user_id", "bucket", "impressions", "negative", "flagged", "in_network"]
    rows = {(r[0], r[1]): dict(zip(columns, r)) for r in table["rows"]}
    assert set(rows) == {(5, 1), (7, 0)}
    seven = rows[7, 0]
    assert (seven["impressions"], seven["negative"], seven["flagged"], seven["in_network"]) == (
        3, 1, 1, 1)  # fmt: skip
    assert (seven["favorite"], seven["dwell"], seven["report"], seven["click"]) == (2, 1, 1, 0)
    assert rows[5, 1]["impressions"] == 2
    assert metrics.summary()["versions"]["v1"]["total"]["impressions"] == 6

    path = tmp_path / "online.json"
    metrics.write(path)
    text = path.read_text()
    assert json.loads(text)["versions"]["v1"]["per_user"] == table
    assert f"[{', '.join(map(str, table['rows'][0]))}]" in text  # a row a line
