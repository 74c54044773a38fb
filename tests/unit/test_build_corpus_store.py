"""phoenix-build-corpus --store DIR --in-process --from-generator (no server): a store of the
trained demo world's posts, embedded by its own towers, that Snapshot.search answers from.
The tests copy the files the candidate tower needs into a tmp dir, and build stores inside it
(where --reload wants them) or beside it; `--store` is a path in phoenix-build-corpus,
phoenix-ingest and phoenix-compact alike."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from clients import build_corpus, compact, ingest
from phoenix.corpus_store import SEALED, CorpusStore, IndexSpec, Posts, building, is_store
from phoenix.world import trained

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINED_DEMO = REPO_ROOT / "artifacts" / "trained-demo"
TOWER_FILES = ("config.json", "embedding_tables.npz", "retrieval", "training.json")


@pytest.fixture
def artifacts(tmp_path) -> Path:
    out = tmp_path / "artifacts"
    out.mkdir()
    for name in TOWER_FILES:
        source = TRAINED_DEMO / name
        copy = shutil.copytree if source.is_dir() else shutil.copy
        copy(source, out / name)
    return out


def test_a_store_of_generator_posts_embedded_in_process(artifacts, capsys):
    argv = ["--from-generator", "3000", "--in-process", "--store", str(artifacts / "store")]
    argv += ["--segment-rows", "1000", "--window", "2d", "--artifacts", str(artifacts)]
    assert build_corpus.main(argv) == 0
    out = capsys.readouterr().out
    assert "segment 1/3: 1,000 posts, index exact (every post scored)" in out
    assert f"wrote {artifacts / 'store'}: 3,000 posts in 3 sealed segments, window 2d" in out
    assert sorted(p.name for p in artifacts.iterdir()) == sorted([*TOWER_FILES, "store"])

    snapshot = CorpusStore(artifacts / "store").open()
    manifest = snapshot.manifest
    assert (manifest.emb_size, manifest.window_seconds, manifest.rows) == (64, 2 * 86400, 3000)
    entries = [s.entry for s in snapshot.segments]
    assert [(e.state, e.rows) for e in entries] == [(SEALED, 1000)] * 3
    assert all(a.max_created_at <= b.min_created_at for a, b in zip(entries, entries[1:]))
    assert abs(entries[-1].max_created_at - time.time()) < 60  # the newest post is now

    # the world's posts and authors, by the towers: a post's own vector finds it first, among
    # the posts of the last two days only (the world spans ten)
    segment, now = snapshot.segments[-1], time.time()
    users = np.asarray(segment.embeddings[[-1, -500]])
    hits = snapshot.search(users, k=20, now=now)
    assert [ids[0] for ids in hits.post_ids] == segment.post_ids[[-1, -500]].tolist()
    assert hits.scores[0][0] == pytest.approx(1.0, abs=1e-4)
    for ids, scores, created in zip(hits.post_ids, hits.scores, hits.created_at):
        assert len(ids) == 20 and np.all(np.diff(scores) <= 0)
        assert created.min() >= now - 2 * 86400
    old = snapshot.segments[0]
    assert old.created_at.max() < now - 2 * 86400  # expired: its own post is not served
    assert old.post_ids[0] not in snapshot.search(old.embeddings[[0]], k=20, now=now).post_ids[0]
    world = trained.world_posts(artifacts, 3000, None, now=0)
    author_of = dict(zip(world.post_ids.tolist(), world.author_ids.tolist()))
    assert all(author_of[p] == a for p, a in zip(hits.post_ids[0], hits.author_ids[0]))
    # every post with the world's semantic IDs, read back by id (expired ones too)
    assert out.rstrip().endswith("semantic IDs kept")
    assert manifest.semantic_ids.levels == 6
    assert np.array_equal(snapshot.semantic_ids(world.post_ids), world.semantic_ids)
    assert world.semantic_ids.min() >= 1

    assert build_corpus.main(argv) == 3  # built whole once: an existing store is not touched
    assert "store: exists already" in capsys.readouterr().err


def test_a_world_needs_the_training_summary(artifacts, capsys):
    (artifacts / "training.json").unlink()
    store = artifacts / "s"
    argv = ["--from-generator", "10", "--in-process", "--store", str(store)]
    assert build_corpus.main([*argv, "--artifacts", str(artifacts)]) == 3
    assert "training.json: not found (--from-generator needs trained artifacts" in (
        capsys.readouterr().err
    )
    assert not is_store(artifacts / "s")


def test_a_failed_build_leaves_nothing_behind(artifacts, monkeypatch, capsys):
    def broken(store, posts, label, report):
        raise OSError("disk full")

    monkeypatch.setattr(building, "add_sealed", broken)
    argv = ["--from-generator", "50", "--in-process", "--store", str(artifacts / "s")]
    argv += ["--artifacts", str(artifacts)]
    with pytest.raises(OSError, match="disk full"):
        build_corpus.main(argv)
    assert sorted(p.name for p in artifacts.iterdir()) == sorted(TOWER_FILES)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--generate", "5", "--window", "2d"], "--window applies to a store"),
        (["--generate", "5", "--in-process", "--check"], "--check compares the server's"),
        (["--generate", "5", "--store", "s", "--out", "c.npz"], "not allowed with argument"),
        (["--from-generator", "0"], "expected an integer >= 1"),
        (["--generate", "5", "--store", "s", "--segment-rows", "0"], "an integer >= 1"),
    ],
)
def test_bad_combinations_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        build_corpus.parse_args(argv)
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def test_store_is_a_path_in_every_command(artifacts, tmp_path, capsys):
    """The same --store value, a directory path outside ARTIFACTS, serves all three commands:
    build-corpus builds the store there, ingest adds to it, compact merges it."""
    store = tmp_path / "elsewhere" / "store"
    argv = ["--from-generator", "40", "--in-process", "--store", str(store)]
    assert build_corpus.main([*argv, "--artifacts", str(artifacts)]) == 0
    assert is_store(store) and not is_store(artifacts / "store")
    assert f"wrote {store}: 40 posts in 1 sealed segments" in capsys.readouterr().out

    lines = tmp_path / "posts.jsonl"
    lines.write_text('{"post_id": 123456789, "author_id": 7}\n{"delete": 123456789}\n')
    ingest_argv = [str(lines), "--store", str(store), "--artifacts", str(artifacts)]
    ingest_argv += ["--flush-posts", "1"]  # the post in a segment, the deletion after
    assert ingest.main(ingest_argv) == 0
    assert CorpusStore(store).manifest().rows == 41

    assert compact.main(["--store", str(store)]) == 0
    assert "posts left out 1 (deleted, expired or repeated)" in capsys.readouterr().out
    assert CorpusStore(store).manifest().rows == 40


def test_reload_needs_the_store_inside_the_artifacts(artifacts, tmp_path, capsys):
    argv = ["--generate", "5", "--in-process", "--store", str(tmp_path / "s"), "--reload"]
    assert build_corpus.main([*argv, "--artifacts", str(artifacts)]) == 3
    assert "--reload needs the store inside --artifacts" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def test_index_builds_report_their_progress(tmp_path):
    """The hook behind the index progress bars (CorpusStore.add's progress)."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3000, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, 3001)
    store = CorpusStore.create(tmp_path / "store", 16)
    added = []
    spec = IndexSpec("ivf_sq8", nlist=16, nprobe=16)
    store.add(Posts(ids, ids, ids, vectors), state=SEALED, index=spec, progress=added.append)
    assert added == [3000]
    snapshot = store.open()
    assert snapshot.segments[0].index is not None
    assert snapshot.search(vectors[[42]], k=5).post_ids[0][0] == 43
