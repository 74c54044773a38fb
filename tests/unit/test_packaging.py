"""The project installs as a package: pinned dependencies, working scripts, no path hacks."""

import importlib
import re
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("-")]


def test_dependencies_are_the_pinned_requirements():
    dependencies = PYPROJECT["project"]["dependencies"]
    assert dependencies == requirement_lines(REPO_ROOT / "requirements.txt")
    assert all("==" in dependency for dependency in dependencies)


@pytest.mark.parametrize("path", sorted(REPO_ROOT.glob("requirements*.txt")), ids=lambda p: p.name)
def test_every_requirement_is_pinned_to_one_version(path):
    """What `make setup` installs is the same on every machine, the installer included."""
    lines = requirement_lines(path)
    assert lines, path
    unpinned = [line for line in lines if not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+==[\w.]+", line)]
    assert unpinned == [], path.name


@pytest.mark.parametrize("script", sorted(PYPROJECT["project"]["scripts"]))
def test_console_script_names_a_main_function(script):
    module, _, function = PYPROJECT["project"]["scripts"][script].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_no_sys_path_edits_outside_the_tests_conftest():
    offenders = [
        str(path.relative_to(REPO_ROOT))
        for path in REPO_ROOT.rglob("*.py")
        if not {".venv", "build", "artifacts"} & set(path.relative_to(REPO_ROOT).parts)
        and path != REPO_ROOT / "tests" / "conftest.py"
        and re.search(r"sys\.path\.(insert|append)", path.read_text())
    ]
    assert offenders == []
