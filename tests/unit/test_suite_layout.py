"""The suite's own layout: pytest imports test files by basename (the test folders are not
packages), so two test files with one name in different folders stop `make test` at
collection, although each folder alone runs (found when tests/unit and tests/integration
both gained a test_rollout.py)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert [name for name, count in names.items() if count > 1] == []
