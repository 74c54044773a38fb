"""Posts' semantic IDs in the corpus store: written with the posts, read back by post id,
through compaction, deletion, an IVF index and a follower; the width from the manifest; stores
and segments without them as before; phoenix-ingest's semantic_ids field."""

from __future__ import annotations

import io
import json
import threading

import numpy as np
import pytest

from phoenix.corpus_store import (
    MANIFEST_FILE,
    SEALED,
    CorpusStore,
    IndexSpec,
    Posts,
    StoreError,
    StoreFollower,
    ingestion,
)
from phoenix.corpus_store.manifest import IVF_SQ8
from phoenix.corpus_store.semantic_ids import SemanticIdSpec

D = 8


def posts(first_id: int, n: int, codes: bool = True, seed: int = 0) -> Posts:
    rng = np.random.default_rng(seed + first_id)
    vectors = rng.normal(size=(n, D))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    sids = rng.integers(1, 257, (n, 6)).astype(np.int32) if codes else None
    return Posts(ids, ids % 7 + 1, 1000 + ids, vectors.astype(np.float32), sids)


def test_semantic_ids_are_read_back_by_post_id_and_zero_where_unknown(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D)
    with_codes, without = posts(1, 50), posts(101, 20, codes=False)
    store.add(with_codes)
    store.add(without)
    snapshot = store.open()
    ids = np.array([[3, 101], [999, 50]])  # any shape
    codes = snapshot.semantic_ids(ids)
    assert codes.shape == (2, 2, 6) and codes.dtype == np.int32
    assert np.array_equal(codes[0, 0], with_codes.semantic_ids[2])
    assert not codes[0, 1].any() and not codes[1, 0].any()  # stored without; unknown
    assert np.array_equal(codes[1, 1], with_codes.semantic_ids[49])
    # the segment without codes is written as before they existed
    first, second = (s.entry for s in snapshot.segments)
    assert (first.semantic_ids, second.semantic_ids) == (True, False)
    files = sorted(p.name for p in (tmp_path / "s" / "segments" / second.name).iterdir())
    assert "semantic_ids.npy" not in files and len(files) == 6
    manifest = json.loads((tmp_path / "s" / MANIFEST_FILE).read_text())
    assert manifest["semantic_ids"] == {"levels": 6, "codebook_size": 256}
    assert [("semantic_ids" in s) for s in manifest["segments"]] == [True, False]


def test_compaction_keeps_them_deletion_hides_them_and_a_new_copy_answers(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D)
    a, b = posts(1, 30), posts(31, 30, codes=False)
    store.add(a)
    store.add(b)
    again = posts(5, 1, seed=7)  # post 5 ingested again with other codes
    store.add(again)
    assert np.array_equal(store.open().semantic_ids([5])[0], again.semantic_ids[0])
    store.delete([7])
    report = store.compact()
    assert (report.sealed, report.sealed_rows) == (3, 59)
    snapshot = store.open()
    (segment,) = snapshot.segments
    assert segment.entry.state == SEALED and segment.entry.semantic_ids
    ids = np.arange(1, 61)
    codes = snapshot.semantic_ids(ids)
    expected = np.concatenate([a.semantic_ids, np.zeros((30, 6), np.int32)])
    expected[4] = again.semantic_ids[0]  # the newest copy was kept
    expected[6] = 0  # deleted
    assert np.array_equal(codes, expected)


def test_an_indexed_segment_and_a_follower_read_them(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D)
    big = posts(1, 3000)
    store.add(big, state=SEALED, index=IndexSpec(IVF_SQ8, nlist=16, nprobe=4))
    follower = StoreFollower(tmp_path / "s", D, searchable=False, poll_seconds=60)
    assert np.array_equal(follower.current().semantic_ids(big.post_ids), big.semantic_ids)
    searched = store.open()
    assert searched.segments[0].index is not None
    hits = searched.search(big.embeddings[:2], 5)
    assert [ids[0] for ids in hits.post_ids] == [1, 2]
    late = posts(5001, 3)
    store.add(late)  # the follower's next call sees the new generation
    assert np.array_equal(follower.current().semantic_ids(late.post_ids), late.semantic_ids)


def test_the_width_and_codebook_come_from_the_manifest(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D, semantic_ids=SemanticIdSpec(4, 1000))
    four = posts(1, 3, codes=False)
    four = Posts(*four.columns(), semantic_ids=np.array([[1, 2, 3, 1000]] * 3))
    store.add(four)
    assert store.open().semantic_ids([2]).tolist() == [[1, 2, 3, 1000]]
    with pytest.raises(
        StoreError, match=r"semantic_ids int32 \(2, 6\), expected integers \[2, 4\]"
    ):
        store.add(posts(10, 2))
    over = Posts(*posts(20, 1, codes=False).columns(), semantic_ids=np.array([[1, 2, 3, 1001]]))
    with pytest.raises(StoreError, match=r"codes in \[1, 1001\], expected \[0, 1000\]"):
        store.add(over)
    assert len(store.open()) == 3  # nothing refused was written


def test_old_manifests_and_bad_files_are_read_or_named(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(posts(1, 4, codes=False))
    path = tmp_path / "s" / MANIFEST_FILE
    data = json.loads(path.read_text())
    del data["semantic_ids"]  # a manifest written before the field existed
    path.write_text(json.dumps(data))
    snapshot = store.open()
    assert snapshot.manifest.semantic_ids == SemanticIdSpec()
    assert not snapshot.semantic_ids([1, 2]).any()

    store.add(posts(11, 4))
    name = store.manifest().segments[-1].name
    np.save(tmp_path / "s" / "segments" / name / "semantic_ids.npy", np.zeros((4, 5), np.uint16))
    with pytest.raises(StoreError, match=r"semantic_ids.npy: uint16 \(4, 5\), expected uint16"):
        store.open()
    data = json.loads(path.read_text()) | {"semantic_ids": {"levels": 0, "codebook_size": 256}}
    path.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="expected >= 1 level"):
        store.open()


@pytest.mark.parametrize(
    "value, message",
    [
        ([1, 2, 3], "expected a list of 6 integers in [0, 256]"),
        ([1, 2, 3, 4, 5, 257], "'semantic_ids' holds 257, expected"),
        ([1, 2, 3, 4, 5, -1], "'semantic_ids' holds -1, expected"),
        ([1, 2, 3, 4, 5, 6.0], "'semantic_ids' is [1, 2, 3, 4, 5, 6.0], expected"),
        ([1, 2, 3, 4, 5, True], "expected a list of 6 integers"),
        ("1,2,3,4,5,6", "expected a list of 6 integers"),
    ],
)
def test_an_ingested_lines_semantic_ids_are_checked(value, message):
    line = json.dumps({"post_id": 1, "author_id": 2, "semantic_ids": value})
    with pytest.raises(ingestion.BadLine) as error:
        ingestion.parse_line(line, now=1000)
    assert message in str(error.value)


def test_ingested_lines_carry_their_semantic_ids_into_the_store(tmp_path):
    store = CorpusStore.create(tmp_path / "s", D)
    lines = [
        {"post_id": 1, "author_id": 2, "created_at": 900, "semantic_ids": [9, 8, 7, 6, 5, 4]},
        {"post_id": 2, "author_id": 2, "created_at": 900},
        {"post_id": 3, "author_id": 2, "semantic_ids": None},
        {"post_id": 4, "author_id": 2, "semantic_ids": [1, 2]},  # refused: not the width
    ]
    data = io.BytesIO(b"".join(json.dumps(line).encode() + b"\n" for line in lines))

    def embed(post_ids, author_ids):
        return posts(int(post_ids[0]), len(post_ids)).embeddings

    run = ingestion.Ingest(
        ingestion.Pending(100, 60.0),
        write=lambda batch, tally: ingestion.write_batch(store, embed, batch, tally),
        wall_clock=lambda: 1000.0,
        sids=store.manifest().semantic_ids,
    )
    tally = run.consume(data, follow=False, stop=threading.Event())
    assert (tally.posts, tally.bad_lines) == (3, 1)
    codes = store.open().semantic_ids([1, 2, 3, 4])
    assert codes.tolist() == [[9, 8, 7, 6, 5, 4], [0] * 6, [0] * 6, [0] * 6]
