"""Directories the test processes of one checkout build once and share: the pytest-xdist
workers and the `serial` run of `make test` (tests/conftest.py), and the next `make test`.

A directory lives under build/test-cache/, named after what it is built from (every source
file of ``phoenix/``): edited code builds a new one and removes the old. One process builds
while the others wait on a lock; a build that failed half way is built again.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / "build" / "test-cache"
COMPLETE = ".complete"


def source_digest() -> str:
    """Every phoenix/*.py, names and contents: what generated artifacts and programs depend on."""
    digest = hashlib.sha256()
    for path in sorted((REPO_ROOT / "phoenix").rglob("*.py")):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def built_once(name: str, build: Callable[[Path], None]) -> Path:
    """``build(directory)`` unless a complete build of this code is there; the directory."""
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"{name}-{source_digest()}"
    with (CACHE / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (target / COMPLETE).is_file():
            for stale in CACHE.glob(f"{name}-*"):
                shutil.rmtree(stale, ignore_errors=True)
            target.mkdir(parents=True)
            build(target)
            (target / COMPLETE).touch()
    return target
