"""Rewrite tests/durations.json from the output of a `make test` run with pytest's
``--durations=0`` (``make test-durations`` does both): seconds per test file, summed over its
tests' setup, call and teardown, files of at least ``MIN_SECONDS``. The file only orders the
distributed run (tests/conftest.py), so a stale one costs time, never a result.

    python -m tests.record_durations build/test-durations.log
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "durations.json"
MIN_SECONDS = 5
ABOUT = (
    "Seconds each test file took on one worker of make test from a fresh clone (pytest "
    "--durations, summed per file). Only an order: make test hands the longest files out "
    "first. Refresh: make test-durations."
)
# "12.34s call     tests/integration/test_x.py::test_y[a-b]"
DURATION_LINE = re.compile(r"^(\d+(?:\.\d+)?)s (?:setup|call|teardown) +(tests/[^:\s]+)::")


def seconds_per_file(text: str) -> dict[str, int]:
    """Seconds per test file of a pytest log's duration lines, longest first."""
    totals: Counter = Counter()
    for line in text.splitlines():
        found = DURATION_LINE.match(line)
        if found:
            totals[found[2]] += float(found[1])
    return {path: round(s) for path, s in totals.most_common() if s >= MIN_SECONDS}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    log = Path(args[0])
    if not log.is_file():
        print(f"record_durations: no log at {log}", file=sys.stderr)
        return 2
    files = seconds_per_file(log.read_text())
    if not files:
        print(f"record_durations: {log} has no duration lines (run pytest with --durations=0)",
              file=sys.stderr)  # fmt: skip
        return 1
    DURATIONS.write_text(json.dumps({"about": ABOUT, "seconds": files}, indent=1) + "\n")
    print(f"wrote {DURATIONS} ({len(files)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
