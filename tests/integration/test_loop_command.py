"""`make loop` as a user types it, in a short mode: every step of the loop for real (v1
trained, served with a redis-server, reacting Locust users, served logs exported, v2 trained
and gated, rolled out under load or not, the second phase, the report), with the tiny preset,
4 users, seconds instead of minutes and a handful of training steps (LOOP_ARGS: the shortened
command of docs/loop.md, which takes about 190 s on 2 cores, a minute of it serve compiling
v1's programs: here v1 loads those of the suite's trained tiny artifacts, of the same config,
through $PHOENIX_PROGRAM_STORE). Its defaults take about 9 minutes; what they measure is in
docs/loop.md, not asserted here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from phoenix.engine.programs import STORE_DIR, STORE_ENV
from tests.training_helpers import trained_tiny

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
REPO_ROOT = Path(__file__).resolve().parents[2]
# docs/loop.md's shortened command (its --work and --out in a temporary folder): phases of
# 18 s, so that even on a loaded machine the users' feeds leave served logs to train on
SHORT = (
    "--preset tiny --minutes 0.3 --users 4 --v1-retrieval-steps 20 --v1-ranker-steps 20 "
    "--v2-retrieval-steps 10 --v2-ranker-steps 10 --shadow-seconds 3 --settle-seconds 3"
)


def test_make_loop_in_a_short_mode_runs_every_step_and_reports(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make on PATH")
    work, out = tmp_path / "work", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    # The programs compiled for the suite's trained tiny artifacts (a copy): v1 is trained
    # with the same preset, so its config and its programs are theirs, and serve loads them
    # where it would compile them for most of a minute (phoenix-compile itself: test_compile*).
    programs = tmp_path / "programs"
    shutil.copytree(trained_tiny()[0] / STORE_DIR, programs)
    env[STORE_ENV] = str(programs)
    done = subprocess.run(
        ["make", "--no-print-directory", "loop", f"LOOP_ARGS={SHORT} --work {work} --out {out}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert f"-m phoenix.loop {SHORT}" in done.stdout  # make's echo: the command as typed
    report = json.loads((out / "loop.json").read_text())
    for name in ("loop.md", "loop.png", "online-metrics.json", "online-metrics.png"):
        assert (out / name).is_file(), name
    steps = [step["step"] for step in report["steps"]]
    assert steps[:4] == ["v1", "serve v1", "users on v1", "v2"], steps
    outcome = report["outcome"]
    assert outcome["gate"] in ("passed", "failed")  # either way an outcome, exit 0
    second = "v2" if outcome["rolled_out"] else "v1-again"
    assert steps[-1] == f"users on {second}" and report["comparison"]["labels"] == ["v1", second]
    if outcome["rolled_out"]:  # under load, as a rollout must: no failed request
        assert report["rollout_window"]["locust_failures"] == 0, report["rollout_window"]
    served = (work / "serve" / "serve.log").read_text()
    assert "programs up to date" in served, "v1 compiled programs: not the suite's tiny config?"
    assert outcome["headline"].split(". ")[0] in done.stdout  # loop.md is printed too
