"""docs/retrieval.md's store commands as a user types them, on the shipped trained demo towers
(embedded in process: no server), each writing a store of its own in a temporary folder
instead of artifacts/trained-demo/store, with 2,000 generator posts instead of millions:
`phoenix-build-corpus --from-generator` (with and without a window), from a posts.csv, then
`phoenix-ingest --create` and `phoenix-compact --window 48h`. The stores' contents and every
option: tests/unit/test_build_corpus_store.py, test_ingest.py, test_compact.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRAINED_DEMO = "artifacts/trained-demo"

pytestmark = pytest.mark.timeout(300)


def typed(*words: str) -> str:
    """An installed command's run, in the checkout; its stdout (exit 0 asserted)."""
    done = subprocess.run([str(BIN / words[0]), *words[1:]], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, " ".join(words) + "\n" + done.stdout + done.stderr
    return done.stdout


def manifest(store: Path) -> dict:
    return json.loads((store / "manifest.json").read_text())


def test_a_store_built_fed_and_compacted_as_typed(tmp_path):
    generated, windowed = tmp_path / "store", tmp_path / "windowed"
    out = typed("phoenix-build-corpus", "--from-generator", "2000", "--in-process",
                "--store", str(generated), "--artifacts", TRAINED_DEMO)  # fmt: skip
    assert f"wrote {generated}: 2,000 posts in 1 sealed segments, window none" in out, out
    out = typed("phoenix-build-corpus", "--from-generator", "2000", "--in-process", "--window",
                "48h", "--store", str(windowed), "--artifacts", TRAINED_DEMO)  # fmt: skip
    assert manifest(windowed)["window_seconds"] == 48 * 3600, out

    posts = tmp_path / "posts.csv"
    posts.write_text(
        "post_id,author_id\n" + "".join(f"{9000 + i},{1 + i % 7}\n" for i in range(50))
    )
    from_file = tmp_path / "v2-store"
    out = typed("phoenix-build-corpus", str(posts), "--in-process", "--artifacts", TRAINED_DEMO,
                "--store", str(from_file))  # fmt: skip
    assert f"wrote {from_file}: 50 posts" in out, out

    now = int(time.time())
    lines = tmp_path / "posts.jsonl"
    lines.write_text(
        f'{{"post_id": 17, "author_id": 4, "created_at": {now - 60}}}\n'
        '{"post_id": 18, "author_id": 5}\n{"delete": 17}\n'
    )
    fed = tmp_path / "fed"
    out = typed("phoenix-ingest", str(lines), "--store", str(fed), "--create",
                "--artifacts", TRAINED_DEMO)  # fmt: skip
    assert f"ingested 3 lines into {fed}: posts 1, deletions 1" in out, out
    out = typed("phoenix-compact", "--store", str(fed), "--window", "48h")
    assert "window set to 2d" in out and "store: generation" in out, out
    assert manifest(fed)["window_seconds"] == 48 * 3600
