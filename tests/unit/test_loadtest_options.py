"""The load test's own options that need no server: the users' think time."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.workload import THINK_TIME_S, think_time_arg, think_time_text

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_think_time_is_low_and_high_seconds():
    assert think_time_arg("0.2,0.4") == (0.2, 0.4)
    assert think_time_arg("0,0") == (0.0, 0.0)
    assert think_time_arg(think_time_text(THINK_TIME_S)) == THINK_TIME_S
    assert think_time_text((0.2, 0.4)) == "0.2,0.4"
    assert think_time_arg(think_time_text((1 / 3, 2 / 3))) == (1 / 3, 2 / 3)  # no rounding


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.1", "expected LOW,HIGH"),
        ("a,b", "expected LOW,HIGH"),
        ("0.1,0.2,0.3", "expected LOW,HIGH"),
        ("0.5,0.1", "0 <= LOW <= HIGH"),
        ("-1,1", "0 <= LOW <= HIGH"),
        ("0,inf", "finite"),
        ("nan,1", "0 <= LOW <= HIGH"),
    ],
)
def test_a_bad_think_time_is_refused_naming_what_was_expected(text, expected):
    with pytest.raises(argparse.ArgumentTypeError, match=expected) as refused:
        think_time_arg(text)
    assert repr(text) in str(refused.value)


def test_the_make_loadtest_runner_hands_the_think_time_to_locust():
    """In a process of its own: importing Locust monkey-patches the process with gevent."""
    script = (
        "from loadtest.runner import locust_command, parse_runner_args\n"
        "args = parse_runner_args(['--think-time', '0.2,0.4'])\n"
        "command = locust_command(args, 'h:1', 'h:2')\n"
        "print(command[command.index('--think-time') + 1])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0.2,0.4"]


def test_the_run_time_counts_from_the_end_of_the_workloads_build():
    """Building the workload blocks gevent's loop, whose clock then lags: Locust's -t timer,
    set right after, fired at once when the build took longer than -t (a loaded machine, 0
    requests). After the build the loop's clock is the wall clock's again. In a process of its
    own (Locust patches the process with gevent); the build is made to lag by 2 s of work
    that never yields."""
    script = (
        "import time, types, gevent\n"
        "from locust.env import Environment\n"
        "import importlib.util\n"
        "from loadtest.workload import BY_ID_TAG\n"
        "spec = importlib.util.spec_from_file_location('locustfile', 'loadtest/locustfile.py')\n"
        "locustfile = importlib.util.module_from_spec(spec); spec.loader.exec_module(locustfile)\n"
        "hub = gevent.get_hub(); hub.loop.update_now()\n"
        "end = time.perf_counter() + 2.0\n"
        "while time.perf_counter() < end: pass\n"
        "lag = time.time() - hub.loop.now()\n"
        "options = types.SimpleNamespace(artifacts='artifacts/trained-demo', pool_size=4,\n"
        "                                workload_seed=0, num_users=1, max_requests=0,\n"
        "                                exclude_tags=[BY_ID_TAG])  # no store here\n"
        "locustfile.build_workload(types.SimpleNamespace(parsed_options=options))\n"
        "print(round(lag, 1), round(time.time() - hub.loop.now(), 1))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    before, after = (float(x) for x in done.stdout.split()[-2:])
    assert before >= 1.5 and after < 0.5, done.stdout
