"""Shared test setup: repo root on sys.path, reference data, markers, the tiers' order and the
test workers' ports.

Tiers, in the order one pytest process runs them: tests/unit (fast, in process;
`make test-unit`), tests/slow (in process, but whole runs: training, the GPU payload build, the
engine against the plain model), tests/integration (real tritonservers). `make test` first
runs the tests marked `serial` alone (the shared builds of tests/fixture_builds.py made beside
them, at the lowest CPU priority once the serial tests have theirs), then the others on
pytest-xdist workers (in that order, or the longest files first when asked).
"""

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SLOW_DIR = REPO_ROOT / "tests" / "slow"
INTEGRATION_DIR = REPO_ROOT / "tests" / "integration"
# Reference data of the original implementation, copied into the repository (see its README) so
# that a fresh clone with nothing beside it runs every test.
DATA_DIR = REPO_ROOT / "tests" / "data"

# `pytest` (unlike `python -m pytest`) does not put the repo root on sys.path.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# The suite's servers make each stored program live on its first batch: most of its ~500 model
# instances serve a few shapes of the 40-65 each would make at start-up (with the weights'
# shapes kept in the store, the model stubs cost about 455 CPU-s a run where they cost 690:
# docs/serving.md). Tests of that choice itself:
# tests/unit/test_programs.py; `make serve` is tested in the default (test_make_serve), and
# PHOENIX_PROGRAM_LOADING=start in the environment runs the whole suite in it.
os.environ.setdefault("PHOENIX_PROGRAM_LOADING", "first-use")


def reference_file(name: str) -> Path:
    """tests/data/<name>, or a FileNotFoundError: a test against the reference never skips."""
    path = DATA_DIR / name
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; it comes with the repository (see tests/data/README.md)"
        )
    return path


def is_under(item, directory: Path) -> bool:
    return directory in Path(str(item.path)).parents


def tier_rank(item) -> int:
    """0 unit, 1 slow, 2 integration: the quick failures come first."""
    if item.get_closest_marker("integration") is not None:
        return 2
    return 1 if item.get_closest_marker("slow") is not None else 0


# Each xdist worker picks server ports from its own range (below the kernel's ephemeral ports,
# 32768 up, and with room for Redis cluster bus ports at +10000): two workers never pick a
# port the other picked but has not bound yet. Workers past the fourth use the kernel's.
WORKER_PORTS = 2500
FIRST_WORKER_PORT = 20_000
RANGED_WORKERS = 4


def pytest_configure(config):
    worker = getattr(config, "workerinput", {}).get("workerid", "")  # "gw0" on xdist workers
    index = int(worker[2:]) if worker.startswith("gw") else -1
    if 0 <= index < RANGED_WORKERS:
        from phoenix.util.processes import PORT_RANGE_ENV

        low = FIRST_WORKER_PORT + index * WORKER_PORTS
        os.environ[PORT_RANGE_ENV] = f"{low}-{low + WORKER_PORTS - 1}"


# How long each test file took on one worker (tests/durations.json). With
# PHOENIX_TEST_LONGEST_FIRST=1 in the environment of `make test`, xdist's workers hand the
# longest files out first, the files that mostly wait on servers and Locust running beside the
# builds. From fresh clones on 2 cores, each pair minutes apart: 791 s against 961 s in tier
# order for the parallel part, then 865 s against 879 s, within what runs of one order differ
# by. It is not the default: two of three fresh-clone runs with it failed on a start under that
# heavier overlap (Triton's /v2/health/ready once over the 3 s a rollout test allows; a server
# whose two retriever instances both said ready, but Triton never reported the model loaded).
DURATIONS = REPO_ROOT / "tests" / "durations.json"
LONGEST_FIRST_ENV = "PHOENIX_TEST_LONGEST_FIRST"


def file_seconds() -> dict[str, float]:
    import json

    return json.loads(DURATIONS.read_text())["seconds"]


def pytest_collection_modifyitems(config, items):
    """Mark tests/slow and tests/integration by folder, and run the tiers in order (stable).

    Distributed with $PHOENIX_TEST_LONGEST_FIRST=1 (xdist hands out whole files, in the order
    its workers collected with ``--no-loadscope-reorder``) the longest files of
    tests/durations.json come first, then the tiers in order.
    """
    for item in items:
        if is_under(item, SLOW_DIR):
            item.add_marker(pytest.mark.slow)
        if is_under(item, INTEGRATION_DIR):
            item.add_marker(pytest.mark.integration)
    items.sort(key=tier_rank)
    # xdist collects on its workers, where it has set --dist to "no": a worker knows itself by
    # its workerinput. The controller hands the files out in the order its workers collected.
    if hasattr(config, "workerinput") and os.environ.get(LONGEST_FIRST_ENV) == "1":
        seconds = file_seconds()
        items.sort(
            key=lambda item: -seconds.get(Path(str(item.path)).relative_to(REPO_ROOT).as_posix(), 0)
        )


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
