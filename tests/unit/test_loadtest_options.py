"""The load test's own options that need no server: the users' think time."""

from __future__ import annotations

import argparse

import pytest

from loadtest.workload import THINK_TIME_S, think_time_arg, think_time_text


def test_think_time_is_low_and_high_seconds():
    assert think_time_arg("0.2,0.4") == (0.2, 0.4)
    assert think_time_arg("0,0") == (0.0, 0.0)
    assert think_time_arg(think_time_text(THINK_TIME_S)) == THINK_TIME_S
    assert think_time_text((0.2, 0.4)) == "0.2,0.4"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.1", "expected LOW,HIGH"),
        ("a,b", "expected LOW,HIGH"),
        ("0.1,0.2,0.3", "expected LOW,HIGH"),
        ("0.5,0.1", "0 <= LOW <= HIGH"),
        ("-1,1", "0 <= LOW <= HIGH"),
    ],
)
def test_a_bad_think_time_is_refused_naming_what_was_expected(text, expected):
    with pytest.raises(argparse.ArgumentTypeError, match=expected) as refused:
        think_time_arg(text)
    assert repr(text) in str(refused.value)
