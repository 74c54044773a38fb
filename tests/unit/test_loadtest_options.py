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
