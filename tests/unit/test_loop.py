"""The loop's pure parts (phoenix.training.loop): Locust's counts, the v1/v2 comparison with
its interval rule, the report, its table and plot, the options and `make loop`."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.training.cli import build_parser
from phoenix.training.loop import (
    LoopError,
    LoopOptions,
    Progress,
    assemble_report,
    compare_versions,
    in_repository_terms,
    interval_verdict,
    locust_counts,
    markdown_report,
    options_from_args,
    plot_report,
)
from phoenix.training.online_metrics import OnlineMetrics, wilson

REPO_ROOT = Path(__file__).resolve().parents[2]
FAVORITE = ACTION_NAMES.index("favorite")
NOT_INTERESTED = ACTION_NAMES.index("not_interested")

# Locust's --csv stats file, as Locust 2 writes it (the loop reads three columns of it)
STATS_CSV = """\
Type,Name,Request Count,Failure Count,Median Response Time,Average Response Time
redis,engagements,79,1,1,1.41
grpc,recommend,83,2,36,56.46
,Aggregated,162,3,27,29.61
"""


def test_locusts_counts_are_its_aggregated_row_and_one_per_request_name(tmp_path):
    path = tmp_path / "rollout_stats.csv"
    path.write_text(STATS_CSV)
    counts = locust_counts(path)
    assert (counts["requests"], counts["failures"]) == (162, 3)
    assert counts["by_name"] == {
        "redis engagements": {"requests": 79, "failures": 1},
        "grpc recommend": {"requests": 83, "failures": 2},
    }
    with pytest.raises(LoopError, match="missing.csv: Locust's stats are missing"):
        locust_counts(tmp_path / "missing.csv")


def test_a_verdict_needs_intervals_that_do_not_overlap():
    low, high = wilson(100, 1000), wilson(200, 1000)  # 0.10 vs 0.20: far apart
    close = wilson(105, 1000)  # 0.105: inside 0.10's interval
    assert interval_verdict(low, high, higher_is_better=True) == "better"
    assert interval_verdict(high, low, higher_is_better=True) == "worse"
    assert interval_verdict(low, high, higher_is_better=False) == "worse"
    assert interval_verdict(low, close, higher_is_better=True) == "overlap"
    assert interval_verdict(low, wilson(0, 0), higher_is_better=True) == "n/a"
    assert interval_verdict(None, low, higher_is_better=True) == "n/a"


def feeds(metrics: OnlineMetrics, label: str, feeds: int, favorites: int, negatives: int, rng):
    """``feeds`` feeds of 10 views: ``favorites`` and ``negatives`` spread over them."""
    actions = np.zeros((feeds * 10, len(ACTION_NAMES)), np.int8)
    actions[rng.choice(len(actions), favorites, replace=False), FAVORITE] = 1
    actions[rng.choice(len(actions), negatives, replace=False), NOT_INTERESTED] = 1
    for i in range(feeds):
        ts = 1000.0 + i
        metrics.record_request(label, ts, 0.02 + 0.01 * (label == "v2"), ok=True)
        metrics.record_views(label, ts, actions[10 * i : 10 * i + 10], np.zeros(10, bool))


def summaries(v1: tuple[int, int], v2: tuple[int, int]) -> dict:
    metrics, rng = OnlineMetrics(), np.random.default_rng(0)
    feeds(metrics, "v1", 200, *v1, rng)
    feeds(metrics, "v2", 200, *v2, rng)
    return metrics.summary()


def test_v2_beats_v1_only_outside_the_intervals_and_worse_on_nothing():
    versions = summaries((100, 20), (300, 20))["versions"]  # favorites 5% -> 15% of 2,000
    comparison = compare_versions(versions["v1"]["total"], versions["v2"]["total"])
    assert comparison["beats"] is True
    assert comparison["better_outside_interval"] == ["engagements.favorite"]
    row = next(r for r in comparison["rows"] if r["metric"] == "engagements.favorite")
    assert row["difference"] == pytest.approx(0.10) and row["better_when"] == "higher"
    metrics = {r["metric"] for r in comparison["rows"]}
    # actions neither version saw are left out; the rates every report has are there
    assert metrics == {"engagements.favorite", "engagements.not_interested", "negative_rate",
                       "in_network_share"}  # fmt: skip
    assert comparison["latency_ms"]["v2"]["p50"] > comparison["latency_ms"]["v1"]["p50"]

    overlapping = summaries((100, 20), (110, 20))["versions"]
    comparison = compare_versions(overlapping["v1"]["total"], overlapping["v2"]["total"])
    assert comparison["beats"] is False and comparison["better_outside_interval"] == []


def test_more_negative_actions_keep_v2_from_beating_v1():
    versions = summaries((100, 20), (300, 200))["versions"]
    comparison = compare_versions(versions["v1"]["total"], versions["v2"]["total"])
    assert comparison["better_outside_interval"] == ["engagements.favorite"]
    assert set(comparison["worse_outside_interval"]) == {
        "engagements.not_interested",
        "negative_rate",
    }
    assert comparison["beats"] is False


GATE = {
    "passed": True,
    "rule": "candidate ndcg@20 >= baseline ndcg@20 - 0.01",
    "held_out": {"rows": 40, "from": 1, "to": 2},
    "candidate": {"ndcg@20": 0.34, "recall@100": 0.03, "auc": {"favorite": 0.7}, "other": 1},
    "baseline": {"ndcg@20": 0.28, "recall@100": 0.01, "auc": {"favorite": 0.6}},
}
ROLLOUT = {
    "previous": {"version": "1"},
    "target": {"version": "2"},
    "shadow": {"recommend": {"requests": 5, "spearman": 0.5}, "ranker": None},
    "timeline": [
        {"t_s": 0.0, "event": "start"},
        {"t_s": 4.5, "event": "switched", "model": "recommend"},
        {"t_s": 9.0, "event": "done"},
    ],  # fmt: skip
    "previous_configs": {"recommend": {"name": "recommend"}},
}


def a_report(tmp_path: Path) -> dict:
    metrics = summaries((100, 20), (300, 20))
    options = LoopOptions(out=tmp_path / "out", work=tmp_path / "work", minutes=0.5)
    locust = {"requests": 162, "failures": 0, "by_name": {}}
    steps = [{"step": "v1", "what": "train", "start_s": 0.0, "seconds": 60.0}]
    return assemble_report(options, metrics, locust, ROLLOUT, GATE, {"requests": 9}, steps,
                           {"v1": locust})  # fmt: skip


def test_the_report_holds_the_comparison_the_rollout_window_and_the_gate(tmp_path):
    report = a_report(tmp_path)
    json.dumps(report)  # all of it JSON
    assert report["comparison"]["beats"] is True
    assert report["rollout_window"]["locust_failures"] == 0
    assert report["rollout_window"]["feed_requests"] is None  # no "rollout" version recorded
    assert "previous_configs" not in report["rollout"]  # large, and in the rollout's own file
    assert report["rollout"]["timeline"][1]["event"] == "switched"
    assert report["gate"]["candidate"] == {"ndcg@20": 0.34, "recall@100": 0.03,
                                           "auc": {"favorite": 0.7}}  # fmt: skip
    assert report["settings"]["minutes"] == 0.5 and report["settings"]["out"].endswith("out")

    table = markdown_report(report)
    assert "| engagements.favorite | 0.0500 [" in table and "| +0.1000 | better |" in table
    assert "v2 beats v1 outside the 95% intervals: **yes**" in table
    assert "0 failed of 162 Locust requests" in table
    assert "- first half of each phase (200 and 200 impressions): v2 better on" in table
    assert "| 4.50 | switched model=recommend |" in table
    assert "- ndcg@20: v1 0.2800 -> v2 0.3400" in table
    assert plot_report(report, tmp_path / "loop.png").stat().st_size > 10_000

    without_v2 = summaries((100, 20), (300, 20))
    del without_v2["versions"]["v2"]
    with pytest.raises(LoopError, match="no version 'v2'"):
        assemble_report(LoopOptions(), without_v2, {}, ROLLOUT, GATE, {}, [], {})


def test_progress_lines_carry_the_time_and_each_step_is_timed():
    lines = []
    progress = Progress(lines.append)
    with progress.step("v1", "train"):
        progress("inside")
    assert [line.split("] ", 1)[1] for line in lines] == ["v1: train", "inside",
                                                           lines[-1].split("] ", 1)[1]]  # fmt: skip
    assert lines[0].startswith("[") and " s] " in lines[0]
    assert progress.steps[0]["step"] == "v1" and progress.steps[0]["seconds"] >= 0


def test_the_command_line_gives_the_loops_options_and_refuses_bad_ones():
    args = build_parser().parse_args(["loop", "--minutes", "3", "--users", "4", "--force"])
    options = options_from_args(args)
    assert (options.minutes, options.users, options.force) == (3.0, 4, True)
    assert options.out == Path("bench/results/loop") and options.v2_ranker_steps is None
    for bad in (["--minutes", "0"], ["--users", "0"], ["--top-n", "60"]):
        with pytest.raises(ValueError):
            options_from_args(build_parser().parse_args(["loop", *bad]))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_loop_runs_the_loop_with_loop_args():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO_ROOT), "loop",
         "LOOP_ARGS=--minutes 1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "-m phoenix.training loop --minutes 1" in done.stdout
    helped = subprocess.run(["make", "--no-print-directory", "-C", str(REPO_ROOT), "help"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert any(line.strip().startswith("loop ") for line in helped.stdout.splitlines())


def test_forgetting_served_posts_unmarks_only_the_simulated_users(redis_server):
    from phoenix.training.loop import forget_served
    from phoenix.user_state import UserStateStore, connect

    store = UserStateStore(connect(redis_server.url))
    now = time.time()
    for user in (1, 2, 3):
        store.mark_served(user, [10 * user, 10 * user + 1], now)
    assert forget_served(redis_server.url, [1, 2, 99]) == 2  # 99 had nothing served
    served = store.served([1, 2, 3], now)
    assert [len(s) for s in served] == [0, 0, 2]
    assert store.served([3], now)[0].tolist() == [31, 30]  # newest first, untouched


def test_the_report_is_standard_json_without_nan():
    from phoenix.training.loop import strict_json

    value = {"tau": float("nan"), "rows": [np.float32(0.5), np.int64(3), float("inf")], "k": "x"}
    assert json.dumps(strict_json(value), allow_nan=False) == (
        '{"tau": null, "rows": [0.5, 3, null], "k": "x"}'
    )


def test_each_half_of_the_phases_is_compared_on_its_own():
    from phoenix.training.loop import compare_halves

    metrics = OnlineMetrics(bucket_s=10.0)
    for label, early in (("v1", 1), ("v2", 5)):  # favorites of 10 views before 60 s; 1 after
        for i in range(100):
            ts = 1.2 * i  # 0 .. 119 s
            actions = np.zeros((10, len(ACTION_NAMES)), np.int8)
            actions[: early if ts < 60 else 1, FAVORITE] = 1
            metrics.record_request(label, ts, 0.02, ok=True)
            metrics.record_views(label, ts, actions)
    halves = compare_halves(metrics.summary(), phase_s=120.0)
    assert halves["half_s"] == 60.0
    assert halves["first"]["impressions"] == {"v1": 500, "v2": 500}
    assert halves["first"]["better_outside_interval"] == ["engagements.favorite"]
    favorite = next(r for r in halves["second"]["rows"] if r["metric"] == "engagements.favorite")
    assert favorite["v1"]["rate"] == favorite["v2"]["rate"] == 0.1
    assert favorite["verdict"] == "overlap" and halves["second"]["beats"] is False


def test_results_name_paths_inside_the_checkout_relative_to_it():
    root = Path(__file__).resolve().parents[2]  # the checkout
    report = {"timeline": [f"start artifact_dir={root}/build/loop/v1", 3], "out": (f"{root}/x",)}
    assert in_repository_terms(report) == {
        "timeline": ["start artifact_dir=build/loop/v1", 3],
        "out": ["x"],
    }
