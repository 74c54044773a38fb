"""No file in the repository refers to notes, folders or tools outside it.

A reader of the repository has only the repository: a doc citing notes kept elsewhere, or a
script relying on the tooling of the machine it was written on, cannot be followed.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
THIS_FILE = Path(__file__).resolve().relative_to(REPO_ROOT).as_posix()

# what each pattern catches: notes and folders beside the checkout, the tooling of the
# machines this was developed on
OUTSIDE = {
    "notes kept beside the repository": r"SERVING-NOTES|\.\./shared\b",
    "the development machines' tooling": r"device tool|\$OUT\b|\.library\b|\bfarm-",
    "machines lent for a task": r"\blent\b",
}
PATTERN = re.compile("|".join(f"(?:{p})" for p in OUTSIDE.values()), re.IGNORECASE)


def repository_files() -> list[str]:
    """Tracked files and new ones git does not ignore (what a commit would hold)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
            cwd=REPO_ROOT, capture_output=True, check=True, timeout=60,
        ).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"not a git checkout, cannot list the repository's files: {error}")
    return [name for name in listed.decode().split("\0") if name and name != THIS_FILE]


def outside_references(text: str) -> list[tuple[int, str]]:
    return [
        (number, match.group(0))
        for number, line in enumerate(text.splitlines(), 1)
        for match in PATTERN.finditer(line)
    ]


def test_the_patterns_catch_what_they_are_for():
    text = (
        "see ../shared/SERVING-NOTES.md\ncopied to $OUT by the device tool\n"
        "the lent H100\n/work/.library/device\nfarm-7\n"
    )
    found = [hit for _, hit in outside_references(text)]
    assert found == [
        "../shared", "SERVING-NOTES", "$OUT", "device tool", "lent", ".library", "farm-"
    ]  # fmt: skip
    assert outside_references("a silent, equivalent, excellent $OUTPUT; farm yields") == []


def test_no_file_refers_to_anything_outside_the_repository():
    found = []
    for name in repository_files():
        path = REPO_ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images, archives): no prose to cite anything
        found += [f"{name}:{line}: {hit}" for line, hit in outside_references(text)]
    assert not found, "references outside the repository:\n" + "\n".join(found)
