"""The documented commands that take minutes to hours (benchmarks, training, the GPU
machine's set-up), run as typed with `--help` only: each parses its options and names itself.
What each measures is in its doc; tests/unit/test_documented_commands.py says which command
is covered where. A `make` target runs through make (its set-up is done: `make test` did it),
with `--help` in the variable it passes on; a target that first builds `make artifacts` (the
mini preset's programs: minutes) runs the command its recipe runs instead.

The cheap ones run for real: the GPU section's `--check`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# (command as run, what its usage line starts with)
HELP = [
    ("make bench-engine BENCH_ARGS=--help", "usage: python -m bench.bench_engine"),
    ("make bench-retrieval BENCH_ARGS=--help", "usage: python -m bench.bench_retrieval"),
    ("make bench-store-serving BENCH_ARGS=--help", "usage: python -m bench.bench_store_serving"),
    ("make bench-training BENCH_ARGS=--help", "usage: "),
    ("make bench-service-host BENCH_ARGS=--help", "usage: "),
    ("make bench-recommend-host BENCH_ARGS=--help", "usage: "),
    (".venv/bin/python bench/bench_serving.py --help", "usage: phoenix-bench-serving"),
    ("python -m bench.bench_startup --help", "usage: python -m bench."),  # make bench-startup
    ("python -m bench.bench_user_state --help", "usage: "),  # make bench-user-state
    ("python bench/soak.py --help", "usage: python bench/soak.py"),  # make soak
    ("python -m bench.bench_replicas --help", "usage: "),  # make bench-replicas
    ("python -m bench.bench_reliability --help", "usage: "),  # make bench-reliability
    ("python -m bench.compare_ann --help", "usage: python -m bench.compare_ann"),
    ("PYTHONPATH=$PWD .venv/bin/python -m bench.user_state_memory --help", "usage: "),
    ("python -m phoenix.loop --help", "usage: python -m phoenix.loop"),
    ("python -m phoenix.training --help", "usage: python -m phoenix.training"),
    ("python -m harness.gpu_payload --help", "usage: python -m harness.gpu_payload"),
    ("python3 -m harness.gpu_machine --help", "usage: python -m harness.gpu_machine"),
    ("python -m phoenix.user_state.served --help", "usage: python -m phoenix.user_state.served"),
    ("make bench-prefix-cache BENCH_ARGS=--help", "usage: "),
    ("make bench-production BENCH_ARGS=--help", "usage: "),
    ("PYTHONPATH=$PWD .venv/bin/python -m bench.bench_store_persistence --help", "usage: "),
    ("python -m harness.xrex_release --help", "usage: python -m harness.xrex_release"),
    ("python -m bench.bench_xrex --help", "usage: python -m bench.bench_xrex"),
]


def run(command: str) -> subprocess.CompletedProcess:
    """``command`` by bash in the checkout, the venv's bin first on PATH (an active venv)."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(["bash", "-c", command], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize("command, usage", HELP, ids=[command for command, _ in HELP])
def test_a_long_commands_help(command, usage):
    done = run(command)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    if command.startswith("make "):  # make echoes the recipe's command first
        assert "--help" in lines[0], lines[0]
        lines = lines[1:]
    assert lines and lines[0].startswith(usage), done.stdout[:300]


def test_the_gpu_sections_check_runs_as_typed():
    """docs/gpu.md: `python -m harness.gpu_bench.report --check` exits 0 on the checked-in
    results (the rewrite itself: tests/unit/test_gpu_report.py)."""
    done = run("python -m harness.gpu_bench.report --check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the GPU section of" in done.stdout and "is what" in done.stdout
