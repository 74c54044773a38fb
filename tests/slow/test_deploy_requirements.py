"""The image's requirements resolve for the image's Python, to exactly the pinned versions, and
those are the project's own pins. pip resolves against PyPI (network: CI has it); the test is
skipped, saying so, only when PyPI cannot be reached.

`pip install --dry-run --python-version X --only-binary=:all:` resolves as for that Python
without installing anything; --report lists what it would install.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request

import pytest

from tests.deploy_checks import IMAGE_DIR, REPO_ROOT

PYPI = "https://pypi.org/simple/pip/"


def image_python() -> str:
    match = re.search(r"^ARG PYTHON_VERSION=(\S+)", (IMAGE_DIR / "Dockerfile").read_text(), re.M)
    assert match, "the Dockerfile names the image's Python in ARG PYTHON_VERSION"
    return match.group(1)


def pins(path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==")
            found[canonical(name)] = version.strip()
    return found


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.split("[")[0].strip()).lower()


@pytest.fixture(scope="module")
def pypi_reachable():
    try:
        urllib.request.urlopen(PYPI, timeout=15).close()
    except OSError as error:
        pytest.skip(f"PyPI unreachable ({error}): the image's requirements were not resolved")


def resolve(tmp_path, *requirement_files) -> dict[str, str]:
    report = tmp_path / "report.json"
    command = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
        "--python-version", image_python(), "--only-binary=:all:", "--target", str(tmp_path / "t"),
        "--report", str(report), "--no-cache-dir",
    ]  # fmt: skip
    for file in requirement_files:
        command += ["-r", str(file)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"pip could not resolve for Python {image_python()}:\n{result.stderr}"
    )
    installs = json.loads(report.read_text())["install"]
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in installs}


def test_the_cpu_image_requirements_resolve_to_exactly_the_lock(tmp_path, pypi_reachable):
    lock = IMAGE_DIR / "requirements.txt"
    assert resolve(tmp_path, lock) == pins(lock)


def test_the_gpu_image_requirements_resolve_to_exactly_the_lock(tmp_path, pypi_reachable):
    files = (IMAGE_DIR / "requirements.txt", IMAGE_DIR / "requirements-gpu.txt")
    assert resolve(tmp_path, *files) == {**pins(files[0]), **pins(files[1])}


def test_the_lock_has_the_projects_versions():
    """Every package the image shares with the project's venv has the venv's version (the
    server then runs the same numpy, JAX and clients as the tests), and every top-level
    requirement of requirements.in is in the lock."""
    project = {**pins(REPO_ROOT / "constraints.txt"), **pins(REPO_ROOT / "requirements.txt"),
               **pins(REPO_ROOT / "requirements-gpu.txt")}  # fmt: skip
    lock = {**pins(IMAGE_DIR / "requirements.txt"), **pins(IMAGE_DIR / "requirements-gpu.txt")}
    shared = {n: (v, project[n]) for n, v in lock.items() if n in project}
    assert {n: vs for n, vs in shared.items() if vs[0] != vs[1]} == {}
    wanted = [canonical(line) for line in (IMAGE_DIR / "requirements.in").read_text().splitlines()
              if line.strip() and not line.startswith("#")]  # fmt: skip
    assert set(wanted) <= set(lock)
