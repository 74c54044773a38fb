"""Fixtures that run a real tritonserver (from the nvidia-pytriton wheel) on free loopback ports.

- `tiny_artifacts`: tiny model artifacts and their CPU programs, built once for every test
  process of this code (tests/built_once.py); read-only.
- `triton`: one server over the project's model_repository/ with those artifacts (session).
- `trained_demo`: artifacts/trained-demo (shipped) with its CPU programs, compiled once.
- `redis_server`: an empty redis-server for a test module (the user-state store).
- `launch_with_store(artifacts, store_url, log_dir)`: a ready server reading that user-state store.
- `start_server(repo_dir, artifacts_dir=None, **flags)`: a ready server of a test's own; flags
  become tritonserver options (`exit_timeout_secs=2` -> `--exit-timeout-secs=2`); every server
  it started is killed when the test ends.

Servers whose stop is not what a test checks are killed when their tests end
(`TritonServer.kill`: the process group, the shared memory, the temporary folders), not
stopped: a clean stop waits for the Python backend to finalize the instances of each model one
after the other (docs/serving.md, "What keeps it affordable"). Stopping is tested where it is
the property: test_server_harness, test_faults, test_deploy_serve, test_rollout_command.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import pytest

from harness.triton import start_triton
from phoenix.ops.triton_server import DEFAULT_READY_TIMEOUT_S, TritonServer
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state.server import RedisServer
from tests import fixture_builds

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
READY_TIMEOUT_S = float(os.environ.get("PHOENIX_TEST_READY_TIMEOUT", DEFAULT_READY_TIMEOUT_S))


def launch_server(repo_dir, artifacts_dir=None, **options) -> TritonServer:
    """A ready TritonServer over `repo_dir` on free ports (harness.triton), waiting at
    most READY_TIMEOUT_S unless `ready_timeout` is given."""
    options.setdefault("ready_timeout", READY_TIMEOUT_S)
    return start_triton(repo_dir, artifacts_dir, **options)


def launch_with_store(
    artifacts_dir, store_url: str, log_dir: Path, env: Optional[dict] = None, **options
) -> TritonServer:
    """A ready server over model_repository/ whose user_state model reads the store at
    `store_url` (requests by user id); its log in `log_dir`; `env` adds to its environment."""
    env = {**(env or {}), USER_STATE_URL_ENV: store_url}
    log_path = log_dir / "tritonserver.log"
    return launch_server(
        MODEL_REPOSITORY, artifacts_dir, log_path=log_path, exit_timeout_secs=5, env=env, **options
    )


@pytest.fixture
def start_server(tmp_path):
    """Factory: `start_server(repo_dir, artifacts_dir=None, **flags)` -> ready TritonServer."""
    started: list[TritonServer] = []

    def start(repo_dir, artifacts_dir=None, **kwargs) -> TritonServer:
        kwargs.setdefault("log_path", tmp_path / f"tritonserver-{len(started)}.log")
        server = launch_server(repo_dir, artifacts_dir, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture(scope="session")
def tiny_artifacts() -> Path:
    """Tiny ranker/retriever artifacts (500-item corpus) and their CPU programs, built once for
    all the test processes of this code (tests/built_once.py): the suite's servers only load.
    Read-only: a test that changes artifacts changes a copy."""
    return fixture_builds.tiny_artifacts()


@pytest.fixture(scope="session")
def trained_demo() -> Path:
    """artifacts/trained-demo with its CPU programs, compiled by one test process while the
    others wait (`make demo` and `make serve` run in different files): its own commands then
    find them there, as a second `make demo` does."""
    return fixture_builds.trained_demo()


@pytest.fixture(scope="session")
def triton(tiny_artifacts, tmp_path_factory):
    """A ready TritonServer over model_repository/ serving `tiny_artifacts`."""
    if not MODEL_REPOSITORY.is_dir():
        pytest.fail(f"the `triton` fixture needs {MODEL_REPOSITORY}, which does not exist")
    log_path = tmp_path_factory.mktemp("triton-logs") / "tritonserver.log"
    server = launch_server(MODEL_REPOSITORY, tiny_artifacts, log_path=log_path, exit_timeout_secs=5)
    yield server
    server.kill()


@pytest.fixture(scope="module")
def redis_server():
    """An empty redis-server shared by one test module's tests."""
    with RedisServer() as server:
        yield server
