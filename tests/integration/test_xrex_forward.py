"""X's own forward beside ours, run as docs/gpu.md ("X's own forward") tells a user to, against
a real checkout of X's release. X's code is not in this repository and its dependencies are
not in the project's venv, so this runs only where they are named:

    PHOENIX_XREX_RELEASE=<x-algorithm>/phoenix PHOENIX_XREX_PYTHON=<python with X's deps> \\
        .venv/bin/python -m pytest tests/integration/test_xrex_forward.py

With X's pinned JAX 0.8.1 in that Python, X's forward must give the stored outputs of
tests/data/production bit for bit (the harness feeds it what X's own script fed it), and ours
must stay within one bfloat16 step of X's wherever it passes the absolute limits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
RELEASE = os.environ.get("PHOENIX_XREX_RELEASE")
X_PYTHON = os.environ.get("PHOENIX_XREX_PYTHON")

pytestmark = pytest.mark.skipif(
    not (RELEASE and X_PYTHON),
    reason="needs PHOENIX_XREX_RELEASE (X's phoenix/ folder) and PHOENIX_XREX_PYTHON",
)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xrex")
    payload = tmp / "payload"
    packed = subprocess.run(
        [sys.executable, "-m", "harness.xrex_release", str(RELEASE),
         "--out", str(payload / "xrex.tar.xz")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert packed.returncode == 0, packed.stdout + packed.stderr
    out = tmp / "xrex.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_xrex", "--payload", str(payload), "--x-python",
         str(X_PYTHON), "--small", "--batches", "1,4", "--repeats", "2",
         "--work", str(tmp / "work"), "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_both_forwards_are_timed_on_every_batch(run):
    result, printed = run
    assert [row["batch"] for row in result["rows"]] == [1, 4]
    for row in result["rows"]:
        assert row["x"]["median_ms"] > 0 and row["ours"]["median_ms"] > 0 and row["x"]["finite"]
    assert "batch 4: X " in printed and "wrote " in printed


def needs_xs_pinned_jax(result: dict) -> None:
    """X's code moves about a bfloat16 step on later JAX (docs/production.md): the exact
    claims hold for the JAX it pins."""
    if result["x"]["jax"] != "0.8.1":
        pytest.skip(f"X ran on JAX {result['x']['jax']}, not its pinned 0.8.1")


def test_ours_is_within_one_bfloat16_step_of_x_past_the_limits(run):
    needs_xs_pinned_jax(run[0])
    for row in run[0]["rows"]:
        assert max(d["over_steps"] for d in row["ours"]["differences"]) <= 1, row["ours"]


def test_x_reproduces_its_stored_outputs_under_its_pinned_jax(run):
    result = run[0]
    needs_xs_pinned_jax(result)
    for difference in result["replay"]["x_here_against_stored"]:
        assert difference["max"] == 0, difference
