"""The README's samples, and whether a command's output is what a sample shows.

The README shows what `make demo` prints and a tritonclient call, each between
``<!-- NAME:start -->`` and ``<!-- NAME:end -->``; integration tests run them against real
servers. A sample line matches an output line when the words are the same and the numbers are
numbers (timings and scores vary by machine; the digits of a name such as `@sports_10` are
words), with any run of spaces for any other; a line
``...`` stands for any number of output lines. The lines between two ``...`` must be
consecutive lines of the output, in the sample's order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

README = Path(__file__).resolve().parents[1] / "README.md"
GAP = "..."
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
# a number standing alone: not the digits of a name such as @sports_10, which stay as written
_TOKENS = re.compile(rf"(\s+|(?<![\w.]){NUMBER})")


def readme_block(name: str, readme: Path = README) -> str:
    """The text between the README's ``<!-- name:start -->`` and ``<!-- name:end -->``."""
    text = readme.read_text()
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if text.count(start) != 1 or text.count(end) != 1:
        raise AssertionError(f"{readme}: expected one {start} ... {end} block")
    return text.split(start)[1].split(end)[0]


def fenced_lines(block: str) -> list[str]:
    """The lines of the first fenced code block in ``block``."""
    found = re.search(r"^```[\w-]*\n(.*?)^```", block, re.M | re.S)
    if found is None:
        raise AssertionError("no fenced code block")
    return found[1].splitlines()


def line_pattern(line: str) -> re.Pattern:
    parts = []
    for token in _TOKENS.split(line):
        if not token:
            continue
        if token.isspace():
            parts.append(r"\s+")
        elif re.fullmatch(NUMBER, token):
            parts.append(NUMBER)
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts) + r"\s*")


def chunks(sample: Sequence[str]) -> list[list[str]]:
    """The sample's runs of consecutive lines, split at its ``...`` lines."""
    runs: list[list[str]] = [[]]
    for line in sample:
        if line.strip() == GAP:
            runs.append([])
        else:
            runs[-1].append(line)
    return [run for run in runs if run]


def unmatched(sample: Sequence[str], output: Sequence[str]) -> Optional[str]:
    """The first run of sample lines the output does not hold (in order, after the runs
    before it), or None when the output shows every line of the sample."""
    position = 0
    for run in chunks(sample):
        patterns = [line_pattern(line) for line in run]
        for start in range(position, len(output) - len(run) + 1):
            if all(p.fullmatch(output[start + i]) for i, p in enumerate(patterns)):
                position = start + len(run)
                break
        else:
            return "\n".join(run)
    return None
