"""Fixtures several unit-test files share: one tiny artifact folder for the whole run (the
services only read it; generating it is the slow part) and a real redis-server per test."""

import pytest

from phoenix.user_state.server import RedisServer


@pytest.fixture(scope="session")
def tiny_artifacts(tmp_path_factory):
    """Tiny towers over a 200-post corpus (seed 1), read by the service and adapter tests."""
    from phoenix.artifacts import generate

    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=1, corpus_size=200)
    return out


@pytest.fixture
def redis_server():
    """An empty redis-server of this test's own, stopped after it."""
    with RedisServer() as server:
        yield server
