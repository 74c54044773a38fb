"""No file in the repository points outside it, wherever the checkout lives.

A reader of the repository has only the repository: a doc citing notes kept beside the
checkout, or a script relying on folders of the machine it was written on, cannot be followed.
The verdict must not depend on where the clone sits (``/tmp/x``, ``~/x``, CI's folder): a path
such as ``/tmp/phoenix-wheels`` in the Dockerfile is a value inside the image, whatever folder
holds the checkout. Two kinds of pointer are caught:

- a relative path that climbs out of the repository, read from the file's folder and from the
  repository root (docs write paths either way);
- an absolute path into a person's or a workspace's folders (``/root/``, ``/home/<name>/``,
  ``/Users/``, ``/work/``, ``/workspace/``), or into the checkout itself: what a writer's
  machine has and a reader's does not.

Result files are held to more (``bench/results``, the figures a reader compares with their
own): no absolute path of the measuring machine at all, in the temporary folder, an installed
Python or a system folder included (``phoenix.util.machine_paths`` writes them portably).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

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
# Where an absolute path starts, not after a word, a dot, a slash or a URL's host.
ABSOLUTE = r"(?<![\w.~/:<>-])/"
PERSONAL_PATH = re.compile(ABSOLUTE + r"(?:root|home/[\w.-]+|Users|work|workspace)/[\w./-]*")
MACHINE_ROOTS = "tmp|root|home|work|workspace|Users|opt|usr|var|mnt|srv"
MACHINE_PATH = re.compile(ABSOLUTE + f"(?:{MACHINE_ROOTS})/" + r"[\w./-]*")
RESULTS = "bench/results/"
SCRIPTS = (".sh", ".py")  # a result folder's script names the paths it uses: values


def repository_files(root: Path = REPO_ROOT) -> list[str]:
    """Tracked files and new ones git does not ignore (what a commit would hold)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root, capture_output=True, check=True, timeout=60,
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


def outside_references(
    text: str, folder: Path, root: Path = REPO_ROOT, *, result: bool = False
) -> list[tuple[int, str]]:
    """(line, pointer) of every pointer in ``text`` (a file in ``folder``) that leaves ``root``;
    ``result``: the file is a result, held to no machine path at all."""
    checkout = re.compile(re.escape(str(root.resolve())) + r"\b")
    absolute = MACHINE_PATH if result else PERSONAL_PATH
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [
            (number, m.group(0))
            for m in CLIMBING_PATH.finditer(line)
            if m.group(0) not in VALUES and leaves_repository(m.group(0), folder, root)
        ]
        found += [(number, m.group(0)) for m in checkout.finditer(line)]
        found += [(number, m.group(0)) for m in absolute.finditer(line)]
    return sorted(set(found))


def references_in(root: Path, names: list[str]) -> list[str]:
    """'name:line: pointer' for every pointer out of ``root`` in the files ``names``."""
    found = []
    for name in names:
        path = root / name
        if not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary (images, archives): no prose to cite anything
        result = name.startswith(RESULTS) and not name.endswith(SCRIPTS)
        hits = outside_references(text, path.parent, root, result=result)
        found += [f"{name}:{n}: {hit}" for n, hit in hits]
    return found


def test_pointers_out_of_the_repository_are_caught_and_pointers_inside_are_not(tmp_path):
    root = tmp_path / "checkout"
    folder = root / "docs"
    folder.mkdir(parents=True)
    (root / "artifacts" / "demo").mkdir(parents=True)
    out = "../" * 2 + "notes/README.md"  # docs/ -> checkout/ -> its parent
    nothing = "../notes/README.md"  # read from the root: beside the checkout
    inside = "../artifacts/demo"  # docs/ -> checkout/artifacts
    notes = "/" + "work/notes/NOTES.md"  # a workspace's notes (split: this file is scanned too)
    home = "/" + "home/ana/phoenix/x.log"
    text = (
        f"see {out}\nserved from {inside}\nread {notes}\nlog {root}/build/x.log\n{nothing}\n"
        f"COPY wheels /tmp/wheels\nmount /mnt/models\n{home}\nhttp://example.org/work/x\n"
    )
    expected = [(1, out), (3, notes), (4, str(root)), (5, nothing), (8, home)]
    assert outside_references(text, folder, root) == expected
    # a result file may not even name the temporary or a system folder (line 4 may match
    # twice there: the checkout's path, and a machine path if pytest's folder is one)
    in_result = outside_references(text, folder, root, result=True)
    assert [hit for hit in in_result if hit[0] != 4] == sorted(
        [hit for hit in expected if hit[0] != 4] + [(6, "/tmp/wheels"), (7, "/mnt/models")]
    )
    assert (4, str(root)) in in_result


def test_no_file_refers_to_anything_outside_the_repository():
    found = references_in(REPO_ROOT, repository_files())
    assert not found, "references outside the repository:\n" + "\n".join(found)


@pytest.fixture
def copy_in_tmp():
    """The repository's files copied to a checkout whose parent folder is /tmp itself, a name
    the repository holds (the Dockerfile's /tmp/ paths): where the old check failed."""
    parent = Path("/tmp")
    if not parent.is_dir():
        pytest.skip("no /tmp on this machine")
    copy = Path(tempfile.mkdtemp(prefix="phoenix-copy-", dir=parent))
    names = repository_files()
    for name in names:
        source = REPO_ROOT / name
        if source.is_file() and not source.is_symlink():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, copy / name)
    yield copy, names
    shutil.rmtree(copy, ignore_errors=True)


def test_the_verdict_does_not_depend_on_where_the_checkout_lives(copy_in_tmp):
    copy, names = copy_in_tmp
    assert references_in(copy, names) == []
    # ...while a real pointer out of that copy is still caught
    (copy / "docs" / "notes.md").write_text(f"see {'../' * 2}notes/NOTES.md and {copy}/x\n")
    (copy / RESULTS / "new.json").write_text('{"artifacts": "/tmp/mini"}\n')
    found = references_in(copy, [*names, "docs/notes.md", f"{RESULTS}new.json"])
    assert found == [
        "docs/notes.md:1: ../../notes/NOTES.md",
        f"docs/notes.md:1: {copy}",
        f"{RESULTS}new.json:1: /tmp/mini",
    ]
