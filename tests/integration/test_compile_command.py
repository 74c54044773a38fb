"""`phoenix-compile --artifacts DIR` (docs/rollout.md) and `python -m phoenix.ops.compile
--artifacts DIR` (docs/serving.md) as typed, on the suite's tiny artifacts, whose programs are
built: both find every program in the store and compile none. Building, loading and --force:
tests/unit/test_compile.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["phoenix-compile"], ["python", "-m", "phoenix.ops.compile"]])
def test_compile_of_a_complete_store_only_loads(tiny_artifacts, command):
    program = [str(Path(sys.executable).with_name(command[0])), *command[1:]]
    done = subprocess.run([*program, "--artifacts", str(tiny_artifacts)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "programs up to date" in done.stdout, done.stdout
