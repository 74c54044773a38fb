"""Which candidate tower embedded a store (phoenix/checkpoint/tower.py,
phoenix/corpus_store/towers.py): the digest covers the candidate tower and nothing else, a
store records it in every generation, and the retriever, the follower and the writers refuse
another tower's store, naming both."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time

import numpy as np
import pytest

from clients import ingest
from phoenix.checkpoint import (
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    load_config,
    read_npz,
    save_config,
    write_npz,
)
from phoenix.checkpoint.tower import CANDIDATE_TOWER_SCOPE, candidate_tower_digest
from phoenix.config import ArtifactConfig, ArtifactError
from phoenix.corpus_store import SEALED, CorpusStore, Posts, StoreFollower
from phoenix.corpus_store.manifest import write_manifest
from phoenix.corpus_store.towers import TowerMismatch, tower_of
from phoenix.stub.corpus import open_corpus

D = 32  # the tiny preset's emb_size
NOW = int(time.time())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from phoenix.artifacts import generate

    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=3, corpus_size=50)
    return out


def copy_of(tiny, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(tiny, target, ignore=shutil.ignore_patterns("compiled"))
    return target


def scale_arrays(path, name, keys, factor=1.01):
    arrays = read_npz(path, name)
    for key in keys:
        arrays[key] = arrays[key] * factor
    write_npz(path, arrays)


def retrieval_keys(root, inside_tower: bool):
    keys = read_npz(root / RETRIEVAL_PARAMS_FILE, RETRIEVAL_PARAMS_FILE)
    return [k for k in keys if k.startswith(CANDIDATE_TOWER_SCOPE + "/") == inside_tower]


def other_tower(tiny, tmp_path, version=2):
    """A copy whose candidate tower differs (one projection scaled), with a version label."""
    other = copy_of(tiny, tmp_path, "other")
    path = other / RETRIEVAL_PARAMS_FILE
    scale_arrays(path, RETRIEVAL_PARAMS_FILE, retrieval_keys(other, inside_tower=True)[:1])
    save_config(other, dataclasses.replace(load_config(other), version=version))
    return other


def posts(rows=20, seed=0):
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(rows, D)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, rows + 1) + 1000 * seed
    return Posts(ids, ids % 5, np.full(rows, NOW - 60), vectors)


# ----------------------------------------------------------------------------------------
# The digest
# ----------------------------------------------------------------------------------------


def test_the_digest_follows_the_candidate_tower_and_nothing_else(tiny, tmp_path):
    digest = candidate_tower_digest(tiny)
    assert len(digest) == 64 and candidate_tower_digest(copy_of(tiny, tmp_path)) == digest

    untouched = copy_of(tiny, tmp_path, "untouched")  # the user tower, the user table, a label
    path = untouched / RETRIEVAL_PARAMS_FILE
    scale_arrays(path, RETRIEVAL_PARAMS_FILE, retrieval_keys(untouched, inside_tower=False))
    scale_arrays(untouched / TABLES_FILE, TABLES_FILE, ["user_embeddings"])
    save_config(untouched, dataclasses.replace(load_config(untouched), version="2025-06"))
    assert candidate_tower_digest(untouched) == digest

    assert candidate_tower_digest(other_tower(tiny, tmp_path)) != digest
    items = copy_of(tiny, tmp_path, "items")  # the tower's input: the item table
    scale_arrays(items / TABLES_FILE, TABLES_FILE, ["item_embeddings"])
    assert candidate_tower_digest(items) != digest


def test_a_version_is_read_written_and_checked():
    config = dataclasses.replace(load_config_of_demo(), version=3)
    assert ArtifactConfig.from_dict(config.to_dict()).version == 3
    assert "version" not in load_config_of_demo().to_dict()  # unversioned: config.json as before
    with pytest.raises(ArtifactError, match="'version' must be a non-empty string"):
        ArtifactConfig.from_dict({**config.to_dict(), "version": True})


def load_config_of_demo():
    from tests.unit.test_ingest import TRAINED_DEMO

    return load_config(TRAINED_DEMO)


# ----------------------------------------------------------------------------------------
# The store records it; readers and writers check it
# ----------------------------------------------------------------------------------------


def test_every_generation_records_the_tower_that_embedded_the_store(tiny, tmp_path):
    tower = tower_of(tiny)
    store = CorpusStore.create(tmp_path / "s", D, embedded_by=tower)
    store.add(posts(), embedded_by=tower)
    store.delete([3])
    store.compact()
    manifest = CorpusStore(tmp_path / "s").manifest()
    assert manifest.generation == 3 and manifest.embedded_by == tower
    assert '"embedded_by"' in (tmp_path / "s" / "manifest.json").read_text()


def test_another_towers_store_is_refused_at_load_naming_both(tiny, tmp_path):
    other = tower_of(other_tower(tiny, tmp_path))
    store = CorpusStore.create(tmp_path / "s", D, embedded_by=other)
    store.add(posts(), SEALED)
    mine = tower_of(tiny)
    with pytest.raises(TowerMismatch) as refused:
        StoreFollower(tmp_path / "s", D, tower=mine)
    message = str(refused.value)
    assert other.digest[:16] in message and mine.digest[:16] in message
    assert str(tmp_path / "s" / "manifest.json") in message and str(tiny) in message
    assert "version 2" in message and "phoenix-build-corpus --in-process" in message
    StoreFollower(tmp_path / "s", D, tower=other)  # its own tower opens it


def test_a_writer_of_another_tower_adds_nothing(tiny, tmp_path):
    store = CorpusStore.create(tmp_path / "s", D, embedded_by=tower_of(tiny))
    store.add(posts(seed=1), embedded_by=tower_of(tiny))
    before = sorted(p.name for p in (tmp_path / "s" / "segments").iterdir())
    with pytest.raises(TowerMismatch, match="was embedded by candidate tower"):
        store.add(posts(seed=2), embedded_by=tower_of(other_tower(tiny, tmp_path)))
    assert sorted(p.name for p in (tmp_path / "s" / "segments").iterdir()) == before
    assert store.manifest().generation == 1


def test_a_generation_of_another_tower_is_skipped_while_the_old_one_serves(tiny, tmp_path):
    mine, other = tower_of(tiny), tower_of(other_tower(tiny, tmp_path))
    store = CorpusStore.create(tmp_path / "s", D, embedded_by=mine)
    store.add(posts(seed=1), embedded_by=mine)
    messages = []
    follower = StoreFollower(tmp_path / "s", D, tower=mine, on_error=messages.append)
    first = follower.current()
    # another tower's generation lands at the path (a copy of another version's store)
    manifest = store.manifest()
    write_manifest(tmp_path / "s", manifest.next(embedded_by=other))
    assert not follower.refresh()
    assert follower.current() is first and follower.skipped == 1
    assert len(messages) == 1 and "still serving the previous" in messages[0]
    assert other.digest[:16] in messages[0] and mine.digest[:16] in messages[0]
    assert not follower.refresh() and len(messages) == 1  # said once per generation
    # the right tower's next generation is served again
    write_manifest(tmp_path / "s", store.manifest().next(embedded_by=mine))
    time.sleep(0.01)  # a new manifest stamp
    assert follower.refresh() and follower.current().generation == manifest.generation + 2


def test_a_store_that_records_no_tower_is_served_with_a_warning(tiny, tmp_path, caplog):
    store = CorpusStore.create(tmp_path / "s", D)  # as stores were written before
    store.add(posts())
    with caplog.at_level(logging.WARNING, logger="phoenix.corpus_store.follow"):
        follower = StoreFollower(tmp_path / "s", D, tower=tower_of(tiny))
    assert follower.current().manifest.rows == 20
    assert "records no candidate tower" in caplog.text and "phoenix-build-corpus" in caplog.text


def test_the_retriever_refuses_another_towers_store_and_the_policy_dates_from_it(tiny, tmp_path):
    artifacts = copy_of(tiny, tmp_path)
    other = tower_of(other_tower(tiny, tmp_path))
    CorpusStore.create(artifacts / "store", D, embedded_by=other).add(posts(), SEALED)
    config = load_config(artifacts)
    with pytest.raises(TowerMismatch, match=other.digest[:16]):
        open_corpus(artifacts, "store", config, engine_for=lambda rows: None)
    looked_up = open_corpus(artifacts, "store", config)  # ages are the same for any tower
    try:
        assert looked_up.ages(np.array([1]), NOW)[0] == 60
    finally:
        looked_up.close()


def test_ingest_refuses_a_store_embedded_by_another_tower(tiny, tmp_path, capsys):
    other = tower_of(other_tower(tiny, tmp_path))
    CorpusStore.create(tmp_path / "store", D, embedded_by=other).add(posts())
    lines = tmp_path / "in.jsonl"
    lines.write_text('{"post_id": 7, "author_id": 1}\n')
    argv = [str(lines), "--store", str(tmp_path / "store"), "--artifacts", str(tiny)]
    assert ingest.main(argv) == 3
    error = capsys.readouterr().err
    assert other.digest[:16] in error and tower_of(tiny).digest[:16] in error
    assert CorpusStore(tmp_path / "store").manifest().rows == 20  # nothing written
