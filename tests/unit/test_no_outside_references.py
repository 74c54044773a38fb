"""No file in the repository points outside it.

A reader of the repository has only the repository: a doc citing notes kept beside the
checkout, or a script relying on folders of the machine it was written on, cannot be followed.
Two kinds of pointer are caught, both without naming anything outside:

- a relative path that climbs out of the repository, read from the file's folder and from the
  repository root (docs write paths either way);
- an absolute path into the folder that holds this checkout, other than the checkout itself.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# Relative paths that are values, not pointers, and why.
VALUES = {
    "../../etc/passwd": "the attack SECURITY.md says is refused",
    "../../artifacts/demo": "the configs' artifact_dir, relative to a model's folder",
    "../x.npz": "a corpus_file outside the artifacts, which docs/reliability.md says is refused",
    "../outside.npz": "the same attack, sent by tests/integration/test_faults.py",
}
THIS_FILE = Path(__file__).resolve().relative_to(REPO_ROOT).as_posix()  # its text is examples
CLIMBING_PATH = re.compile(r"(?<![\w./-])(?:\.\./)+[\w.-][\w./-]*")


def repository_files() -> list[str]:
    """Tracked files and new ones git does not ignore (what a commit would hold)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO_ROOT, capture_output=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    return [name for name in listed.decode().split("\0") if name and name != THIS_FILE]


def leaves_repository(reference: str, folder: Path, root: Path) -> bool:
    """A relative path that names nothing inside ``root``: read from ``folder`` and from
    ``root``, it lands outside, or inside on nothing that exists."""
    for base in (folder, root):
        target = (base / reference).resolve()
        if target.is_relative_to(root.resolve()) and target.exists():
            return False
    return True


def outside_references(text: str, folder: Path, root: Path = REPO_ROOT) -> list[tuple[int, str]]:
    """(line, pointer) of every pointer in ``text`` (a file in ``folder``) that leaves ``root``."""
    beside = re.compile(
        re.escape(str(root.resolve().parent)) + r"/(?!" + re.escape(root.resolve().name) + r"\b)"
    )
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [
            (number, m.group(0))
            for m in CLIMBING_PATH.finditer(line)
            if m.group(0) not in VALUES and leaves_repository(m.group(0), folder, root)
        ]
        found += [(number, m.group(0)) for m in beside.finditer(line)]
    return found


def test_pointers_out_of_the_repository_are_caught_and_pointers_inside_are_not(tmp_path):
    root = tmp_path / "checkout"
    folder = root / "docs"
    folder.mkdir(parents=True)
    (root / "artifacts" / "demo").mkdir(parents=True)
    out = "../" * 2 + "notes/README.md"  # docs/ -> checkout/ -> its parent
    nothing = "../notes/README.md"  # read from the root: beside the checkout
    inside = "../artifacts/demo"  # docs/ -> checkout/artifacts
    machine = f"{tmp_path}/tools/bin"  # beside the checkout
    text = f"see {out}\nserved from {inside}\nrun {machine}\nlog {root}/build/x.log\n{nothing}"
    expected = [(1, out), (3, f"{tmp_path}/"), (5, nothing)]
    assert outside_references(text, folder, root) == expected


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
        found += [f"{name}:{n}: {hit}" for n, hit in outside_references(text, path.parent)]
    assert not found, "references outside the repository:\n" + "\n".join(found)
