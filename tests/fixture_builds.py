"""The suite's shared builds (tests/built_once.py) by name, and a command that makes them all
before the tests ask for them.

    python -m tests.fixture_builds [NAME ...]

`make test` starts it before mypy (`make typecheck`, one core) and the tests marked `serial`:
those run alone because they assert time bounds, and keep about one of two cores busy for their
couple of minutes. The first build, the tiny artifacts, is what they wait for, so it runs at
normal priority; the rest at the lowest (nice 19), on what mypy and the serial tests leave
idle, and the parallel run that follows finds them made. A build already made is found in a
moment; one that fails here is reported and built again by the first test that needs it, which
then fails with the reason.
Each build is also a fixture's body (tests/integration/conftest.py and the test files that
use them): the tests never depend on this command having run.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from tests.built_once import CACHE, REPO_ROOT, built_once
from tests.training_helpers import trained_tiny

DEVICE = "cpu"
LOWEST_PRIORITY = 19  # niceness
TRAINED_DEMO = REPO_ROOT / "artifacts" / "trained-demo"  # shipped; `make demo` serves it


def tiny_artifacts() -> Path:
    """Tiny ranker/retriever artifacts (500-item corpus) and their CPU programs."""
    made = {"preset": "tiny", "seed": 0, "corpus_size": 500}

    def build(out_dir: Path) -> None:
        from phoenix.artifacts import generate
        from phoenix.ops.compile import ensure_programs

        generate(out_dir=out_dir, **made)
        ensure_programs(out_dir, DEVICE)  # as serve does

    return built_once("tiny-artifacts", build, {**made, "device": DEVICE})


def production_tiny_artifacts() -> Path:
    """The tiny production preset (history 30, 16 candidates a chunk) made by the command of
    docs/production.md (a smaller corpus), and its CPU programs."""
    made = {"preset": "tiny", "seed": 0, "corpus_size": 200}

    def build(out_dir: Path) -> None:
        from phoenix.ops.compile import ensure_programs

        command = [
            sys.executable, "-m", "phoenix.artifacts", "--ranker", "production", "--preset",
            made["preset"], "--seed", str(made["seed"]), "--corpus-size",
            str(made["corpus_size"]), "--out", str(out_dir),
        ]  # fmt: skip
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
        ensure_programs(out_dir, DEVICE)

    return built_once("production-tiny-artifacts", build, {**made, "device": DEVICE})


def trained_demo() -> Path:
    """artifacts/trained-demo (shipped) with its CPU programs, compiled by one process while
    the others wait: `make demo` and `make serve` then find them there, as a second `make demo`
    does."""
    from phoenix.ops.compile import ensure_programs

    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "trained-demo-programs.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        ensure_programs(TRAINED_DEMO, DEVICE)
    return TRAINED_DEMO


def trained_tiny_artifacts() -> Path:
    return trained_tiny()[0]


# In the order the tests need them first: the `serial` tests serve the tiny artifacts.
URGENT = "tiny-artifacts"  # built at the priority given; the others at nice 19
BUILDS: dict[str, Callable[[], Path]] = {
    "tiny-artifacts": tiny_artifacts,
    "trained-tiny": trained_tiny_artifacts,
    "trained-demo": trained_demo,
    "production-tiny-artifacts": production_tiny_artifacts,
}


def main(argv: list[str]) -> int:
    names = argv or list(BUILDS)
    unknown = [name for name in names if name not in BUILDS]
    if unknown:
        print(f"unknown builds {unknown}; known: {', '.join(BUILDS)}", file=sys.stderr)
        return 2
    # Started in the background by make, this process ignores SIGINT; its compiles must not
    # (they inherit the disposition): Ctrl-C stops them with make.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    failed = []
    for name in names:
        if name != URGENT:  # from here on; at 19 already, this adds nothing
            os.nice(LOWEST_PRIORITY - os.nice(0))
        started = time.monotonic()
        try:
            where = BUILDS[name]()
        except Exception:  # reported; the test that needs it builds it again and fails there
            traceback.print_exc()
            failed.append(name)
            print(f"{name}: FAILED after {time.monotonic() - started:.1f} s", flush=True)
            continue
        print(f"{name}: ready in {time.monotonic() - started:.1f} s ({where})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
