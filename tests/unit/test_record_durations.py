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
