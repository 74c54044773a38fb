"""Directories the test processes of one checkout build once and share: the pytest-xdist
workers and the `serial` run of `make test` (tests/conftest.py), and the next `make test`.

A directory lives under build/test-cache/, named after what it is built from: the build's
own parameters, every source file of ``phoenix/`` and the numerical libraries' versions, so
edited code or new pins build a new one. One process builds while the others wait on a lock;
a build that failed half way is built again. Builds of other versions are removed once they
are STALE_AFTER_S old, never sooner: a run still going may be reading one.
Read-only for the tests: a test that changes one changes a copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import time
from collections.abc import Callable, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE = REPO_ROOT / "build" / "test-cache"
COMPLETE = ".complete"
LIBRARIES = ("jax", "jaxlib", "numpy", "dm-haiku")
STALE_AFTER_S = 6 * 3600  # far longer than a whole `make test`


def build_digest(name: str, parameters: Mapping[str, Any]) -> str:
    """What a build depends on: its name and parameters, phoenix/**/*.py, library versions."""
    digest = hashlib.sha256(f"{name} {json.dumps(parameters, sort_keys=True)}".encode())
    for library in LIBRARIES:
        digest.update(f"{library}=={version(library)}".encode())
    for path in sorted((REPO_ROOT / "phoenix").rglob("*.py")):
        digest.update(path.relative_to(REPO_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def remove_stale(name: str, keep: Path) -> None:
    """Other versions' builds of ``name`` last touched over STALE_AFTER_S ago."""
    for other in CACHE.glob(f"{name}-*"):
        if other != keep and time.time() - other.stat().st_mtime > STALE_AFTER_S:
            shutil.rmtree(other, ignore_errors=True)


def built_once(name: str, build: Callable[[Path], None], parameters: Mapping[str, Any]) -> Path:
    """``build(directory)`` unless a complete build of this version is there; the directory.
    ``parameters`` are what else the build depends on (preset, seed, sizes): the build reads
    them from the same mapping, so the key cannot drift from what is built."""
    CACHE.mkdir(parents=True, exist_ok=True)
    target = CACHE / f"{name}-{build_digest(name, parameters)}"
    with (CACHE / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (target / COMPLETE).is_file():
            shutil.rmtree(target, ignore_errors=True)  # a build that failed half way
            target.mkdir(parents=True)
            build(target)
            (target / COMPLETE).touch()
        target.touch()  # in use: not stale
        remove_stale(name, target)
    return target
