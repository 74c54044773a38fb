"""tests/durations.json and the script that rewrites it: the order of the distributed run."""

import json
import subprocess
import sys

from tests.conftest import REPO_ROOT, file_seconds
from tests.record_durations import seconds_per_file

LOG = """\
============================= slowest durations ==============================
12.50s setup    tests/integration/test_a.py::test_one[http]
3.00s call     tests/integration/test_a.py::test_two
7.20s call     tests/slow/test_b.py::test_three
2.10s teardown tests/unit/test_c.py::test_four
1311 passed in 740.50s (0:12:20)
"""


def test_seconds_are_summed_per_file_longest_first_short_files_left_out():
    assert seconds_per_file(LOG) == {"tests/integration/test_a.py": 16, "tests/slow/test_b.py": 7}


def test_the_committed_file_names_existing_test_files():
    seconds = file_seconds()
    assert seconds and all(value > 0 for value in seconds.values())
    missing = [path for path in seconds if not (REPO_ROOT / path).is_file()]
    assert missing == []


def test_a_log_without_durations_is_refused_and_the_file_kept(tmp_path):
    log = tmp_path / "test.log"
    log.write_text("1311 passed in 740.50s\n")
    before = (REPO_ROOT / "tests" / "durations.json").read_text()
    done = subprocess.run([sys.executable, "-m", "tests.record_durations", str(log)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "no duration lines" in done.stderr
    assert (REPO_ROOT / "tests" / "durations.json").read_text() == before
    assert json.loads(before)["seconds"]


class Item:
    """What the ordering reads of a collected test: its file and markers."""

    def __init__(self, path: str):
        self.path = REPO_ROOT / path
        self.markers: set[str] = set()

    def add_marker(self, marker) -> None:
        self.markers.add(marker.name)

    def get_closest_marker(self, name: str):
        return name if name in self.markers else None


class Config:
    """A pytest config: an xdist worker's has a ``workerinput``, the controller's not."""


def collected_order(on_a_worker: bool, monkeypatch, longest_first: bool = True) -> list[str]:
    from tests import conftest

    monkeypatch.setenv(conftest.LONGEST_FIRST_ENV, "1" if longest_first else "0")
    longest, shorter = list(file_seconds())[:2]
    paths = [shorter, longest, "tests/unit/test_record_durations.py"]  # neither order
    items = [Item(path) for path in paths]
    config = Config()
    if on_a_worker:
        config.workerinput = {"workerid": "gw0"}  # type: ignore[attr-defined]
    conftest.pytest_collection_modifyitems(config, items)
    return [item.path.relative_to(REPO_ROOT).as_posix() for item in items]


def test_xdist_workers_collect_the_longest_files_first_when_asked(monkeypatch):
    """xdist collects on its workers (where --dist reads "no"): they order by durations.json."""
    longest, shorter = list(file_seconds())[:2]
    assert collected_order(True, monkeypatch)[:2] == [longest, shorter]
    unit_first = "tests/unit/test_record_durations.py"
    assert collected_order(True, monkeypatch, longest_first=False)[0] == unit_first


def test_one_process_runs_the_tiers_in_order(monkeypatch):
    order = collected_order(False, monkeypatch)
    assert order[0] == "tests/unit/test_record_durations.py"  # the unit tier first
