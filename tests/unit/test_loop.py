"""The loop's parts that need no servers (phoenix.loop): Locust's counts, the report
with its outcome, table and plot (v2 rolled out, or refused by its gate), the rollout decision,
the exit status, the options and `make loop`. The statistics: test_loop_compare.py."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.loop.cli import add_arguments, main_from_args, options_from_args
from phoenix.loop.options import LoopError, LoopOptions, Progress
from phoenix.loop.processes import locust_counts
from phoenix.loop.report import (
    assemble_report,
    in_repository_terms,
    markdown_report,
    plot_report,
)
from phoenix.loop.run import rollout_decision
from phoenix.training.online_metrics import OnlineMetrics

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


def loop_parser() -> argparse.ArgumentParser:
    """``python -m phoenix.loop``'s options."""
    parser = argparse.ArgumentParser(prog="python -m phoenix.loop")
    add_arguments(parser)
    return parser


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


def feeds(metrics: OnlineMetrics, label: str, favorite_rate: float, rng, users: int = 8,
          per_user: int = 25) -> None:  # fmt: skip
    """``per_user`` feeds of 10 views for each of ``users`` users."""
    for user in range(users):
        for i in range(per_user):
            actions = np.zeros((10, len(ACTION_NAMES)), np.int8)
            actions[:, FAVORITE] = rng.random(10) < favorite_rate
            actions[0, NOT_INTERESTED] = i % 10 == 0
            ts = 1000.0 + i
            metrics.record_request(label, ts, 0.02 + 0.01 * (label != "v1"), ok=True)
            metrics.record_views(label, ts, actions, np.zeros(10, bool), user_id=user)


def summaries(second: str = "v2", second_rate: float = 0.15) -> dict:
    metrics, rng = OnlineMetrics(), np.random.default_rng(0)
    feeds(metrics, "v1", 0.05, rng)
    feeds(metrics, second, second_rate, rng)
    feeds(metrics, "rollout", 0.05, rng, users=2, per_user=3)
    return metrics.summary()


GATE = {
    "passed": True,
    "rule": "candidate ndcg@20 >= baseline ndcg@20 - 0.01",
    "held_out": {"rows": 40, "users": 8, "from": 1, "to": 2},
    "candidate": {"ndcg@20": 0.34, "recall@100": 0.03, "auc": {"favorite": 0.7}, "other": 1},
    "baseline": {"ndcg@20": 0.28, "recall@100": 0.01, "auc": {"favorite": 0.6}},
}
FAILED_GATE = GATE | {"passed": False, "candidate": GATE["candidate"] | {"ndcg@20": 0.22}}
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
LOCUST = {"requests": 1620, "failures": 0, "by_name": {}}


def a_report(tmp_path: Path, rolled_out: bool = True) -> dict:
    options = LoopOptions(out=tmp_path / "out", work=tmp_path / "work", minutes=0.5)
    steps = [{"step": "v1", "what": "train", "start_s": 0.0, "seconds": 60.0}]
    if rolled_out:
        metrics = summaries()
        rollout = {"state": "done", "reason": "its offline gate passed", "report": ROLLOUT,
                   "locust": LOCUST}  # fmt: skip
    else:
        metrics = summaries("v1-again", 0.05)
        rollout = {"state": "refused", "reason": "its offline gate failed",
                   "report": None, "locust": None}  # fmt: skip
    return assemble_report(options, metrics, gate=GATE if rolled_out else FAILED_GATE,
                           rollout=rollout, export={"requests": 9}, steps=steps,
                           phases={"v1": LOCUST})  # fmt: skip


def test_the_report_holds_the_outcome_the_comparison_the_rollout_and_the_gate(tmp_path):
    report = a_report(tmp_path)
    json.dumps(report)  # all of it JSON
    outcome = report["outcome"]
    assert outcome["gate"] == "passed" and outcome["rolled_out"] is True
    assert outcome["online_verdict_of_v2"] == "better" == report["comparison"]["verdict"]
    assert (
        "v2's offline gate: passed (ndcg@20 v1 0.2800 -> v2 0.3400 on 8 held-out users"
        in (outcome["headline"])
    )
    assert "rolled out under load: 0 failed of 1,620 requests" in outcome["headline"]
    assert "Online, v2 against v1 (8 users, 95% per-user bootstrap" in outcome["headline"]
    assert report["comparison"]["labels"] == ["v1", "v2"]
    assert report["rollout_window"]["locust_failures"] == 0
    assert report["rollout_window"]["feed_requests"] == 6  # the "rollout" label's feeds
    assert "previous_configs" not in report["rollout"]  # large, and in the rollout's own file
    assert report["rollout"]["state"] == "done"
    assert report["rollout"]["timeline"][1]["event"] == "switched"
    assert report["gate"]["candidate"] == {"ndcg@20": 0.34, "recall@100": 0.03,
                                           "auc": {"favorite": 0.7}}  # fmt: skip
    assert report["settings"]["minutes"] == 0.5 and report["settings"]["out"].endswith("out")

    table = markdown_report(report)
    assert table.startswith(outcome["headline"])
    assert "| metric | v1 (95% interval) | v2 (95% interval) | v2 - v1 (95% interval) |" in table
    favorite = next(line for line in table.splitlines() if line.startswith("| engagements.fav"))
    assert favorite.endswith("| better |") and "[+0.0" in favorite
    assert "- first half of each phase (1,600 and 1,600 impressions): better;" in table
    assert "0 failed of 1,620 Locust requests" in table
    assert "| 4.50 | switched model=recommend |" in table
    assert "- ndcg@20: v1 0.2800 -> v2 0.3400" in table
    assert plot_report(report, tmp_path / "loop.png").stat().st_size > 10_000

    without_v2 = summaries()
    del without_v2["versions"]["v2"]
    with pytest.raises(LoopError, match="no version 'v2'"):
        assemble_report(LoopOptions(), without_v2, gate=GATE, rollout={"state": "done"},
                        export={}, steps=[], phases={})  # fmt: skip


def test_a_v2_refused_by_its_gate_is_reported_plainly_with_v1_served_again(tmp_path):
    report = a_report(tmp_path, rolled_out=False)
    outcome = report["outcome"]
    assert outcome["gate"] == "failed" and outcome["rolled_out"] is False
    assert outcome["online_verdict_of_v2"] is None  # v2 never served
    assert outcome["second_phase"] == "v1-again"
    assert "v2's offline gate: FAILED (ndcg@20 v1 0.2800 -> v2 0.2200" in outcome["headline"]
    assert (
        "v2 was not rolled out: its offline gate failed. v1 kept serving." in (outcome["headline"])
    )
    assert "Online, v1-again against v1" in outcome["headline"] and "A/A" in outcome["headline"]
    assert "With fewer than 16 users a bootstrap over users is rough" in outcome["headline"]
    assert report["rollout_window"] is None and report["rollout"]["state"] == "refused"
    table = markdown_report(report)
    assert "| metric | v1 (95% interval) | v1-again (95% interval) |" in table
    assert "No rollout: its offline gate failed." in table
    assert plot_report(report, tmp_path / "loop.png").stat().st_size > 10_000


def test_a_gate_failure_stops_the_rollout_unless_forced():
    assert rollout_decision(GATE, force=False) == (True, "its offline gate passed")
    assert rollout_decision(FAILED_GATE, force=False) == (False, "its offline gate failed")
    roll, why = rollout_decision(FAILED_GATE, force=True)
    assert roll is True and "--force" in why


def test_the_exit_status_is_0_for_any_verdict_and_1_when_a_step_broke(tmp_path, capsys):
    from phoenix.training.retrain import RetrainError

    args = loop_parser().parse_args(["--out", str(tmp_path / "out")])
    for rolled_out in (True, False):  # a refused v2 is an outcome, not an error
        report = a_report(tmp_path, rolled_out)
        assert main_from_args(args, run=lambda options, r=report: r) == 0
        assert report["outcome"]["headline"] in capsys.readouterr().out

    def broken(error):
        def run(options):
            raise error

        return run

    for error in (LoopError("serve exited (1) before it was ready; its log x.log"),
                  RetrainError("no training.json")):  # fmt: skip
        assert main_from_args(args, run=broken(error)) == 1
        assert f"error: the loop broke: {error}" in capsys.readouterr().err
    bad = loop_parser().parse_args(["--users", "0"])
    assert main_from_args(bad, run=broken(AssertionError("not run"))) == 2
    assert "--users must be >= 1" in capsys.readouterr().err


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
    args = loop_parser().parse_args(["--minutes", "3", "--users", "4", "--force"])
    options = options_from_args(args)
    assert (options.minutes, options.users, options.force) == (3.0, 4, True)
    assert options.out == Path("bench/results/loop") and options.v2_ranker_steps is None
    assert LoopOptions().users == 64  # the default the runs in docs/loop.md measured
    for bad in (["--minutes", "0"], ["--users", "0"], ["--top-n", "60"]):
        with pytest.raises(ValueError):
            options_from_args(loop_parser().parse_args([*bad]))


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_make_loop_runs_the_loop_with_loop_args():
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(REPO_ROOT), "loop",
         "LOOP_ARGS=--minutes 1"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "-m phoenix.loop --minutes 1" in done.stdout
    helped = subprocess.run(["make", "--no-print-directory", "-C", str(REPO_ROOT), "help"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert any(line.strip().startswith("loop ") for line in helped.stdout.splitlines())


def test_forgetting_served_posts_unmarks_only_the_simulated_users(redis_server):
    from phoenix.loop.processes import forget_served
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
    from phoenix.loop.report import strict_json

    value = {"tau": float("nan"), "rows": [np.float32(0.5), np.int64(3), float("inf")], "k": "x"}
    assert json.dumps(strict_json(value), allow_nan=False) == (
        '{"tau": null, "rows": [0.5, 3, null], "k": "x"}'
    )


def test_results_name_paths_inside_the_checkout_relative_to_it():
    root = Path(__file__).resolve().parents[2]  # the checkout
    report = {"timeline": [f"start artifact_dir={root}/build/loop/v1", 3], "out": (f"{root}/x",)}
    assert in_repository_terms(report) == {
        "timeline": ["start artifact_dir=build/loop/v1", 3],
        "out": ["x"],
    }


def test_the_loop_is_its_own_command_and_refuses_bad_options_with_exit_2():
    """``python -m phoenix.loop`` as a user types it: --help shows the options and the exit
    status; a bad option exits 2 with argparse's message; the training CLI has no loop."""
    command = [sys.executable, "-m", "phoenix.loop"]
    helped = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.returncode == 0, helped.stderr
    assert "--minutes" in helped.stdout and "Exit status: 0" in helped.stdout
    bad = subprocess.run([*command, "--users", "zero"], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "--users" in bad.stderr
    training = subprocess.run([sys.executable, "-m", "phoenix.training", "loop"],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert training.returncode == 2 and "invalid choice: 'loop'" in training.stderr


def test_the_rollouts_users_are_waited_for_until_locust_has_started(tmp_path):
    """The settle time before a rollout counts from Locust's start: on a busy machine a
    Locust stopped while still starting left no statistics, and the loop broke."""
    from phoenix.loop.processes import ReactingUsers

    prefix = tmp_path / "rollout"
    history = f"{prefix}_stats_history.csv"
    starts_late = f"import pathlib, time; time.sleep(0.5); pathlib.Path({history!r}).touch(); "
    starts_late += "time.sleep(30)"
    users = ReactingUsers("rollout", subprocess.Popen([sys.executable, "-c", starts_late]),
                          prefix, tmp_path / "rollout.log")  # fmt: skip
    try:
        users.wait_started(20)
        assert Path(history).exists() and users.process.poll() is None
    finally:
        users.process.kill()
        users.process.wait()
    exits = ReactingUsers("gone", subprocess.Popen([sys.executable, "-c", "pass"]),
                          tmp_path / "gone", tmp_path / "gone.log")  # fmt: skip
    exits.wait_started(20)  # returns: its exit is what the caller reports next
    never = ReactingUsers("never", subprocess.Popen(["sleep", "30"]), tmp_path / "never",
                          tmp_path / "never.log")  # fmt: skip
    try:
        with pytest.raises(LoopError, match=r"Locust \(never\) did not start within 0.5 s"):
            never.wait_started(0.5)
    finally:
        never.process.kill()
        never.process.wait()


def test_a_rollout_that_breaks_is_reported_as_it_broke(tmp_path, monkeypatch):
    """Its users are stopped on the way out, and their statistics (none: they had barely
    started) do not stand in for the rollout's own error."""
    import contextlib

    from phoenix.loop import run
    from phoenix.loop.processes import ReactingUsers

    prefix = tmp_path / "rollout"
    started = f"import pathlib, time; pathlib.Path('{prefix}_stats_history.csv').touch(); "
    process = subprocess.Popen([sys.executable, "-c", started + "time.sleep(30)"])
    users = ReactingUsers("rollout", process, prefix, tmp_path / "r.log")
    monkeypatch.setattr(run, "start_reacting_users", lambda *args: users)

    def broken(*args):
        raise LoopError("rollout of v2: the server refused the load")

    monkeypatch.setattr(run, "roll_out", broken)
    options = LoopOptions(settle_seconds=0.0, work=tmp_path)
    with contextlib.ExitStack() as running, pytest.raises(LoopError, match="refused the load"):
        run.rollout_under_load(options, None, "", tmp_path, tmp_path, [], tmp_path / "m.json",
                               running, Progress(lambda line: None))  # fmt: skip
    assert users.process.poll() is not None  # stopped with the stack
