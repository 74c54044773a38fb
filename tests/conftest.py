"""Shared test setup: repo root on sys.path, markers, and unit tests before integration tests."""

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
INTEGRATION_DIR = REPO_ROOT / "tests" / "integration"

# `pytest` (unlike `python -m pytest`) does not put the repo root on sys.path.
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: needs a real tritonserver (slower)")


def is_integration(item) -> bool:
    return INTEGRATION_DIR in Path(str(item.path)).parents


def pytest_collection_modifyitems(config, items):
    """Mark everything under tests/integration, and run it after the fast unit tests."""
    for item in items:
        if is_integration(item):
            item.add_marker(pytest.mark.integration)
    items.sort(key=lambda item: item.get_closest_marker("integration") is not None)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT
