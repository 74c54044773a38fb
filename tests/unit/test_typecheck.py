"""The type checker catches the mistakes that broke `make loop` and that no test ran: a
function-local import of a name its module no longer has (``trained_world`` moved from
``phoenix.training.pipeline`` to ``phoenix.world.trained``) and an attribute read of a module
that has none by that name (``LOAD_TIMEOUT_S`` moved from ``phoenix.ops.rollout`` to
``phoenix.ops.model_control``). `make typecheck` (in `make test`, before pytest) checks the
product; this checks that pyproject.toml's configuration flags those mistakes, and passes the
same code with the names where they live.

It runs mypy on a module of its own with the project's configuration and cache
(``.mypy_cache``): about 2 CPU-seconds after `make typecheck` has filled it, about 15 without."""

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

STALE = """\
def simulated_users(artifacts):
    from phoenix.training.pipeline import trained_world

    return trained_world(artifacts)


def rollout_timeout():
    from phoenix.ops import rollout

    return rollout.LOAD_TIMEOUT_S
"""
CURRENT = STALE.replace("phoenix.training.pipeline", "phoenix.world.trained").replace(
    "from phoenix.ops import rollout", "from phoenix.ops import model_control as rollout"
)


def mypy_errors(module: Path) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "pyproject.toml", str(module)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy could not run
    return done.returncode, [line for line in done.stdout.splitlines() if ": error:" in line]


def test_mypy_flags_a_missing_name_imported_or_read_inside_a_function(tmp_path):
    module = tmp_path / "stale_names.py"
    module.write_text(STALE)
    code, errors = mypy_errors(module)
    assert code == 1
    assert errors == [
        f'{module}:2: error: Module "phoenix.training.pipeline" has no attribute '
        '"trained_world"  [attr-defined]',
        f'{module}:10: error: Module has no attribute "LOAD_TIMEOUT_S"  [attr-defined]',
    ]
    module.write_text(CURRENT)
    assert mypy_errors(module) == (0, [])
