"""The corpus store (phoenix/corpus_store): search against a numpy reference, merge order,
tombstones, windows, compaction, the atomic manifest switch, and bad store contents."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import mmap
import os
import sys
import threading
import time
import types

import faiss
import numpy as np
import pytest

from phoenix.corpus_store import (
    FRESH,
    SEALED,
    CorpusStore,
    IndexSpec,
    Posts,
    StoreError,
    StoreFollower,
    choose_index,
)
from phoenix.corpus_store import snapshot as snapshot_module
from phoenix.corpus_store.ann import PROBE_MEAN_WEIGHT, spilled_spec
from phoenix.corpus_store.follow import REQUEST_WAIT_S
from phoenix.corpus_store.manifest import IVF_PQ4FS, IVF_SQ8
from phoenix.corpus_store.snapshot import best_first, first_of_each, rescore_exactly
from phoenix.corpus_store.store import RETIRE_GRACE_S

D = 16


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_posts(rng, n: int, first_id: int, first_ts: int, centers=None) -> Posts:
    if centers is None:
        vectors = rng.normal(size=(n, D))
    else:  # clustered, as trained towers' vectors are
        vectors = centers[rng.integers(0, len(centers), n)] + 0.3 * rng.normal(size=(n, D))
    return Posts(
        np.arange(first_id, first_id + n, dtype=np.int64),
        rng.integers(1, 100, n).astype(np.int64),
        first_ts + np.arange(n, dtype=np.int64),
        unit(vectors),
    )


def reference_top_k(posts: Posts, users: np.ndarray, k: int, excluded=None):
    """Post ids of the exact top k per user (numpy), best first."""
    scores = users @ posts.embeddings.T  # [B, n]
    out = []
    for b in range(len(users)):
        row = scores[b].copy()
        if excluded is not None:
            row[np.isin(posts.post_ids, excluded[b])] = -np.inf
        order = np.argsort(-row, kind="stable")[:k]
        out.append(posts.post_ids[order[np.isfinite(row[order])]])
    return out


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_exact_search_merges_segments_in_score_order(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    parts = [make_posts(rng, 300, 1 + 1000 * i, 1000 * i) for i in range(3)]
    for part in parts:
        store.add(part)
    users = unit(rng.normal(size=(4, D)))
    hits = store.open().search(users, 25)
    expected = reference_top_k(Posts.concat(parts), users, 25)
    for b in range(4):
        np.testing.assert_array_equal(hits.post_ids[b], expected[b])
        assert np.all(np.diff(hits.scores[b]) <= 0)  # sorted, best first
        rows = np.searchsorted(Posts.concat(parts).post_ids, hits.post_ids[b])
        np.testing.assert_array_equal(hits.author_ids[b], Posts.concat(parts).author_ids[rows])


def test_excluded_deleted_and_expired_posts_never_come_back(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D, window_seconds=500)
    old, new = make_posts(rng, 200, 1, 0), make_posts(rng, 200, 1001, 1000)
    store.add(old)
    store.add(new)
    users = unit(rng.normal(size=(2, D)))
    everything = store.open().search(users, 400, now=1100)
    assert not np.isin(everything.post_ids[0], old.post_ids).any()  # older than 1100 - 500
    assert len(everything.post_ids[0]) == 200
    best = everything.post_ids[0][:3]
    store.delete(best[:2])
    seen = [np.zeros(0, np.int64), everything.post_ids[1][:5]]
    after = store.open().search(users, 10, excluded=seen, now=1100)
    assert not np.isin(after.post_ids[0], best[:2]).any()
    assert after.post_ids[0][0] == best[2]
    assert not np.isin(after.post_ids[1], seen[1]).any()
    # later the window covers fewer posts: rows created before now - 500 drop out
    later = store.open().search(users, 400, now=1550)
    alive = new.post_ids[(new.created_at >= 1050) & ~np.isin(new.post_ids, best[:2])]
    assert later.created_at[0].min() >= 1050
    np.testing.assert_array_equal(np.sort(later.post_ids[0]), alive)


def test_sealed_ivf_segment_recall_against_exact(tmp_path, rng):
    centers = rng.normal(size=(32, D))
    posts = make_posts(rng, 20_000, 1, 0, centers)
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(posts, state=SEALED, index=IndexSpec(IVF_SQ8, nlist=64, nprobe=16))
    snapshot = store.open()
    assert snapshot.segments[0].index is not None
    users = unit(centers[:8] + 0.3 * rng.normal(size=(8, D)))
    hits = snapshot.search(users, 100)
    expected = reference_top_k(posts, users, 100)
    recall = np.mean([np.isin(h, e).mean() for h, e in zip(hits.post_ids, expected)])
    assert recall >= 0.95, recall
    for b in range(8):  # scores are the index's (8-bit) estimates, close to exact, sorted
        exact = posts.embeddings[hits.post_ids[b] - 1] @ users[b]
        np.testing.assert_allclose(hits.scores[b], exact, atol=0.03)
        assert np.all(np.diff(hits.scores[b]) <= 0)


@pytest.mark.parametrize("lists_per_post", [1, 2], ids=["one_list", "spilled"])
def test_pq4fs_segment_returns_exact_scores_and_keeps_recall(tmp_path, rng, lists_per_post):
    centers = rng.normal(size=(32, D))
    posts = make_posts(rng, 20_000, 1, 0, centers)
    store = CorpusStore.create(tmp_path / "s", D)
    spec = IndexSpec(IVF_PQ4FS, nlist=64, nprobe=16, rerank=10, pq_m=D)
    if lists_per_post == 2:
        spec = spilled_spec(spec)
    store.add(posts, state=SEALED, index=spec)
    snapshot = store.open()
    assert type(snapshot.segments[0].index).__name__ == "IndexIVFPQFastScan"
    assert snapshot.segments[0].index.ntotal == lists_per_post * len(posts)
    users = unit(centers[:8] + 0.3 * rng.normal(size=(8, D)))
    hits = snapshot.search(users, 100)
    expected = reference_top_k(posts, users, 100)
    recall = np.mean([np.isin(h, e).mean() for h, e in zip(hits.post_ids, expected)])
    assert recall >= 0.95, recall
    for b in range(8):  # the 4-bit estimates re-scored from the float vectors: exact
        exact = posts.embeddings[hits.post_ids[b] - 1] @ users[b]
        np.testing.assert_allclose(hits.scores[b], exact, rtol=1e-5, atol=1e-6)
        assert len(np.unique(hits.post_ids[b])) == 100  # a spilled post found twice: once


def test_an_index_file_of_another_kind_is_refused_naming_it(tmp_path, rng):
    posts = make_posts(rng, 2_000, 1, 0, rng.normal(size=(4, D)))
    store = CorpusStore.create(tmp_path / "s", D)
    entry = store.add(posts, state=SEALED, index=IndexSpec(IVF_SQ8, nlist=8, nprobe=8))
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    manifest["segments"][0]["index"] = {"kind": IVF_PQ4FS, "nlist": 8, "nprobe": 8, "pq_m": D}
    (tmp_path / "s" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StoreError, match=rf"{entry.name}/index.faiss: a IndexIVFScalarQuantizer"):
        store.open()


@pytest.mark.parametrize(
    "spec",
    [
        IndexSpec(IVF_SQ8, nlist=16, nprobe=16),
        IndexSpec(IVF_PQ4FS, nlist=16, nprobe=16, rerank=10, pq_m=D),
        spilled_spec(IndexSpec(IVF_PQ4FS, nlist=16, nprobe=16, rerank=10, pq_m=D), 1.0),
    ],
    ids=["ivf_sq8", "ivf_pq4fs", "ivf_pq4fs_spilled"],
)
def test_ivf_segment_honours_tombstones_window_and_exclusions(tmp_path, rng, spec):
    centers = rng.normal(size=(8, D))
    posts = make_posts(rng, 5_000, 1, 0, centers)
    store = CorpusStore.create(tmp_path / "s", D, window_seconds=4_000)
    store.add(posts, state=SEALED, index=spec)
    users = unit(centers[:2])
    first = store.open().search(users, 50, now=5_000)
    assert first.created_at[0].min() >= 1_000
    store.delete(first.post_ids[0][:10])
    again = store.open().search(users, 50, excluded=[first.post_ids[0][10:20], []], now=5_000)
    assert not np.isin(again.post_ids[0], first.post_ids[0][:20]).any()
    assert len(again.post_ids[0]) == 50 and again.created_at[0].min() >= 1_000


def test_compaction_seals_fresh_segments_and_drops_expired_ones(tmp_path, rng):
    clock = [10_000.0]
    store = CorpusStore(tmp_path / "s", clock=lambda: clock[0])
    CorpusStore.create(tmp_path / "s", D, window_seconds=3_000)
    gone = make_posts(rng, 100, 1, 1_000)  # all created before 10_000 - 3_000
    store.add(gone, state=SEALED)
    parts = [make_posts(rng, 100, 1001 + 1000 * i, 8_000 + 100 * i) for i in range(3)]
    for part in parts:
        store.add(part)
    store.delete(parts[0].post_ids[:5])
    users = unit(rng.normal(size=(3, D)))
    before = store.open().search(users, 50, now=clock[0])
    report = store.compact()
    assert (report.sealed, report.sealed_rows, report.dropped_expired) == (3, 295, 1)
    snapshot = store.open()
    assert [s.entry.state for s in snapshot.segments] == [SEALED]
    assert snapshot.manifest.tombstones is None  # no live segment holds a deleted post
    after = snapshot.search(users, 50, now=clock[0])
    for b in range(3):
        np.testing.assert_array_equal(after.post_ids[b], before.post_ids[b])
    # retired files stay for readers of the old manifest, then go
    old = [tmp_path / "s" / r.path for r in snapshot.manifest.retired]
    assert old and all(p.exists() for p in old)
    clock[0] += RETIRE_GRACE_S + 1
    assert store.compact().removed_files == len(old)
    assert not any(p.exists() for p in old)


def test_a_post_ingested_twice_is_returned_once(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    posts = make_posts(rng, 50, 1, 0)
    store.add(posts)
    store.add(posts.take(np.arange(10)))
    hits = store.open().search(unit(rng.normal(size=(1, D))), 50)
    assert len(hits.post_ids[0]) == 50 and len(np.unique(hits.post_ids[0])) == 50


def test_a_store_wholly_outside_its_window_answers_every_user_with_nothing(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D, window_seconds=100)
    store.add(make_posts(rng, 50, 1, 0))
    hits = store.open().search(unit(rng.normal(size=(3, D))), 10, now=10_000)
    for field, dtype in zip(dataclasses.fields(hits), (np.int64,) * 3 + (np.float32,)):
        rows = getattr(hits, field.name)
        assert len(rows) == 3 and all(r.shape == (0,) and r.dtype == dtype for r in rows)
    assert rows[0] is not rows[1]  # one array per user


def test_a_user_with_no_hits_beside_one_with_hits(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    posts = make_posts(rng, 30, 1, 0)
    store.add(posts)
    users = unit(rng.normal(size=(3, D)))
    hits = store.open().search(users, 10, excluded=[posts.post_ids, [], posts.post_ids[:25]])
    assert [len(ids) for ids in hits.post_ids] == [0, 10, 5]
    assert [len(s) for s in hits.scores] == [0, 10, 5]
    expected = reference_top_k(posts, users, 10, excluded=[posts.post_ids, [], posts.post_ids[:25]])
    for b in range(3):
        np.testing.assert_array_equal(hits.post_ids[b], expected[b])
        np.testing.assert_array_equal(hits.author_ids[b], posts.author_ids[hits.post_ids[b] - 1])
        np.testing.assert_array_equal(hits.created_at[b], posts.created_at[hits.post_ids[b] - 1])


def three_segment_store(tmp_path, rng, nprobe: int):
    """(store, its 16 topic centres, the sealed posts, the fresh posts): 5,000 posts in an
    indexed segment (32 lists, ``nprobe`` probed), 300 in a fresh one, and copies of 40 sealed
    posts in a third."""
    centers = rng.normal(size=(16, D))
    sealed, fresh = make_posts(rng, 5_000, 1, 0, centers), make_posts(rng, 300, 10_001, 9_000)
    store = CorpusStore.create(tmp_path / "s", D)
    spec = IndexSpec(IVF_PQ4FS, nlist=32, nprobe=nprobe, rerank=10, pq_m=D)
    store.add(sealed, state=SEALED, index=spec)
    store.add(fresh)
    store.add(sealed.take(np.arange(40)))
    return store, centers, sealed, fresh


def test_an_indexed_segment_and_a_fresh_one_merge_in_score_order(tmp_path, rng):
    store, centers, sealed, fresh = three_segment_store(tmp_path, rng, nprobe=32)
    users = unit(centers[:4] + 0.3 * rng.normal(size=(4, D)))
    hits = store.open().search(users, 60)
    expected = reference_top_k(Posts.concat([sealed, fresh]), users, 60)  # every list probed
    for b in range(4):
        np.testing.assert_array_equal(hits.post_ids[b], expected[b])
        assert len(np.unique(hits.post_ids[b])) == 60 and np.all(np.diff(hits.scores[b]) <= 0)


@pytest.mark.parametrize("parts", [1, 2])  # one segment: packed keys; several: lexsort
def test_best_first_orders_by_score_then_segment_then_row(rng, parts):
    rows = rng.permutation(60)[: 12 * parts].reshape(parts, 2, 6)  # [parts, B, m']
    scores = rng.choice(np.array([-np.inf, 0.5, 0.25, 0.75], np.float32), size=rows.shape)
    rows[:, 1, :2] = -1  # a user with fewer candidates
    scores[:, 1, :2] = -np.inf
    found = [(3 + p, rows[p], scores[p]) for p in range(parts)]
    segment_of, got_rows, got_scores = best_first(found)
    assert got_rows.shape == got_scores.shape == segment_of.shape == (2, 6 * parts)
    for b in range(2):
        live = [(-scores[p, b, j], 3 + p, rows[p, b, j]) for p in range(parts) for j in range(6)]
        expected = sorted(t for t in live if t[0] < np.inf)  # best first, then segment, row
        got = list(zip(-got_scores[b], segment_of[b], got_rows[b]))
        assert got[: len(expected)] == expected
        assert np.all(got_scores[b][len(expected) :] == -np.inf)  # the dead ones last


def test_a_search_of_no_users_answers_nothing(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 50, 1, 0))  # one exact segment
    hits = store.open().search(np.zeros((0, D), np.float32), 5)
    assert hits.post_ids == [] and hits.scores == []


def test_first_of_each_keeps_the_best_copy_of_every_post():
    post_ids = np.array([[7, 3, 7, 0, 3, 9, 0], [1, 2, 3, 4, 5, 6, 1]])  # rows sorted best first
    first = first_of_each(post_ids)
    assert first.tolist() == [
        [True, True, False, True, False, True, True],  # 0: not a post, never a copy
        [True, True, True, True, True, True, False],
    ]


def test_rescoring_a_spilled_index_keeps_the_best_distinct_rows(rng):
    """Every candidate twice (a post found in both its lists), the best ones included: the
    re-score keeps each user's want best distinct rows, the exact scores, and -1 past them."""
    embeddings = rng.normal(size=(400, D)).astype(np.float32)  # [n, D]
    users = rng.normal(size=(3, D)).astype(np.float32)  # [B, D]
    want = 20
    found = [rng.choice(400, size, replace=False) for size in (60, 35, 12)]  # distinct rows
    rows = np.full((3, 130), -1, np.int64)  # [B, c], -1 where the index found no more
    for b, distinct in enumerate(found):
        rows[b, : 2 * len(distinct)] = rng.permutation(np.repeat(distinct, 2))
    segment = types.SimpleNamespace(embeddings=embeddings)
    scores, kept = rescore_exactly(segment, users, rows, want, repeats=True)
    for b, distinct in enumerate(found):
        exact = embeddings[distinct] @ users[b]  # [r]
        best = distinct[np.argsort(-exact)[:want]]
        held = kept[b] >= 0
        assert sorted(kept[b][held]) == sorted(best)
        np.testing.assert_allclose(scores[b][held], embeddings[kept[b][held]] @ users[b], rtol=1e-5)
        assert np.all(scores[b][~held] == -np.inf) and held.sum() == min(want, len(distinct))


def test_readers_see_whole_generations_while_a_writer_adds(tmp_path, rng):
    """Concurrent readers never see a torn manifest or a half-written segment."""
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 50, 1, 0))
    follower = StoreFollower(tmp_path / "s", D, poll_seconds=0.01).start()
    errors, sizes, stop = [], {}, threading.Event()
    user = unit(rng.normal(size=(1, D)))

    def read():
        seen = sizes.setdefault(threading.get_ident(), [])
        while not stop.is_set():
            try:
                snapshot = follower.current()
                hits = snapshot.search(user, 1000)
                assert len(hits.post_ids[0]) == len(snapshot) == 50 * len(snapshot.segments)
                seen.append(len(snapshot))
                fresh = CorpusStore(tmp_path / "s").open()  # a reader without the follower
                assert len(fresh) == 50 * len(fresh.segments)
            except Exception as error:  # noqa: BLE001 - collected for the assertion below
                errors.append(error)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for thread in readers:
        thread.start()
    for i in range(1, 20):
        store.add(make_posts(rng, 50, 1 + 100 * i, i))
    follower.refresh()
    stop.set()
    for thread in readers:
        thread.join()
    follower.stop()
    assert not errors, errors[:3]
    assert len(follower.current()) == 1000
    assert all(seen == sorted(seen) for seen in sizes.values())  # generations only advance


def slowed_refresh(follower: StoreFollower, seconds: float) -> threading.Thread:
    """A refresh begun on another thread (as the follower's own) that takes ``seconds`` to
    open the new generation; returned once it holds the refresh lock."""
    opening, opened = threading.Event(), follower._opened

    def slow_open(previous=None):
        opening.set()
        time.sleep(seconds)
        return opened(previous)

    follower._opened = slow_open
    thread = threading.Thread(target=follower.refresh)
    thread.start()
    opening.wait(5)
    return thread


def test_a_request_waits_for_a_refresh_under_way(tmp_path, rng):
    """A stub gone idle mid-refresh holds its follower thread, lock and all: the next request
    must get the new generation, not the one before, once the refresh can finish."""
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 1, 0))
    follower = StoreFollower(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 101, 0))
    thread = slowed_refresh(follower, 0.05)
    assert len(follower.current()) == 40
    thread.join()


def test_a_request_sees_a_generation_written_before_it(tmp_path, rng):
    """Not a poll later: two instances answering one user in turn must agree on what was
    deleted once either has shown it."""
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 1, 0))
    follower = StoreFollower(tmp_path / "s", D, poll_seconds=60)
    assert len(follower.current()) == 20
    store.add(make_posts(rng, 20, 101, 0))
    assert len(follower.current()) == 40
    assert follower.current().lookup(np.array([101]))[2].all()
    store.delete([101])
    assert not follower.current().lookup(np.array([101]))[2].any()


def test_a_long_refresh_is_waited_for_by_one_request_only(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 1, 0))
    follower = StoreFollower(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 101, 0))
    thread = slowed_refresh(follower, 1.5)
    waits = []
    for _ in range(3):
        started = time.monotonic()
        assert len(follower.current()) == 20  # the old generation, whole, meanwhile
        waits.append(time.monotonic() - started)
    assert waits[0] >= REQUEST_WAIT_S * 0.9 and max(waits[1:]) < REQUEST_WAIT_S / 2, waits
    thread.join()
    assert len(follower.current()) == 40


def test_the_follower_keeps_serving_when_a_generation_is_broken(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, 20, 1, 0))
    messages = []
    follower = StoreFollower(tmp_path / "s", D, on_error=messages.append)
    assert follower.lag_seconds() == 0.0
    entry = store.add(make_posts(rng, 20, 101, 0))
    written = (tmp_path / "s" / "manifest.json").stat().st_mtime
    embeddings = tmp_path / "s" / "segments" / entry.name / "embeddings.npy"
    saved = embeddings.read_bytes()
    embeddings.unlink()
    assert not follower.refresh()
    assert len(follower.current()) == 20
    assert "embeddings.npy: not found" in messages[0]
    # the broken generation waits from when its manifest was written
    assert (follower.skipped, follower.lag_seconds(now=written + 30)) == (1, pytest.approx(30))
    embeddings.write_bytes(saved)  # repaired, then a generation after it: served, no lag
    store.add(make_posts(rng, 20, 201, 0))
    assert follower.refresh() and len(follower.current()) == 60
    assert (follower.skipped, follower.lag_seconds()) == (1, 0.0)


def manifest_of(root):
    return json.loads((root / "manifest.json").read_text())


def test_bad_store_contents_name_the_file(tmp_path, rng):
    root = tmp_path / "s"
    store = CorpusStore.create(root, D)
    entry = store.add(make_posts(rng, 20, 1, 0))
    with pytest.raises(StoreError, match="emb_size 16, but the model's candidate vectors have 8"):
        StoreFollower(root, 8)
    data = manifest_of(root)
    data["emb_size"] = 8  # a manifest naming a wrong dimension
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(StoreError, match=r"embeddings.npy: float32 \(20, 16\), expected float32"):
        store.open()
    data["emb_size"] = D
    data["segments"].append({**data["segments"][0], "name": "missing-one"})
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(StoreError, match=r"missing-one/post_ids.npy: not found"):
        store.open()
    (root / "manifest.json").write_text("{")
    with pytest.raises(StoreError, match=r"manifest.json: not valid JSON"):
        store.open()
    with pytest.raises(StoreError, match=r"manifest.json: not found"):
        CorpusStore(tmp_path / "nothing").open()
    data["segments"] = [{**data["segments"][0], "index": {"kind": "hnsw"}}]
    (root / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(StoreError, match=f"segment '{entry.name}': index kind 'hnsw'"):
        store.open()


def test_bad_posts_are_refused_before_anything_is_written(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    posts = make_posts(rng, 5, 1, 0)
    twice = Posts(np.array([1, 1, 2, 3, 4]), *posts.columns()[1:])
    with pytest.raises(StoreError, match=r"'post_ids' must be unique, found duplicates \[1\]"):
        store.add(twice)
    with pytest.raises(StoreError, match=r"expected \(5, 16\)"):
        store.add(Posts(*posts.columns()[:3], posts.embeddings[:, :8]))
    assert store.manifest().segments == () and not (tmp_path / "s" / "segments").exists()


def test_index_choice_by_segment_size():
    assert choose_index(10_000, D).kind == "exact"
    one_list = choose_index(999_999, D)
    assert (one_list.kind, one_list.nlist, one_list.nprobe, one_list.pq_m, one_list.rerank) == (
        IVF_PQ4FS, 4096, 128, D, 10,
    )  # fmt: skip
    assert not one_list.spilled
    assert one_list.probe_mean_weight == 0  # the best centroid's score alone
    # spilled: 0.35 of the lists probed at most, from half that, by the best and mean scores
    big = choose_index(1_000_000, D)
    assert (big.nlist, big.nprobe, big.max_nprobe, big.rerank, big.spilled) == (
        4096, 22, 358, 10, True,
    )  # fmt: skip
    assert big.probe_mean_weight == PROBE_MEAN_WEIGHT
    huge = choose_index(10_000_000, D)
    assert (huge.nlist, huge.rerank, huge.spilled) == (8192, 12, True)  # 10x lost recall at 10 M
    assert huge.probe_mean_weight == PROBE_MEAN_WEIGHT
    assert choose_index(1_000_001, D).rerank == 12
    assert FRESH != SEALED


def test_frequent_compactions_keep_one_small_segment_not_hundreds(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    for i in range(6):
        store.add(make_posts(rng, 30, 1 + 100 * i, 10 * i))
        store.compact()
    snapshot = store.open()
    assert len(snapshot.segments) == 1 and len(snapshot) == 180
    assert snapshot.segments[0].created_at.tolist() == sorted(snapshot.segments[0].created_at)


@pytest.mark.parametrize("n", [7, 100, 1_000, 12_800, 12_937])
def test_two_pass_top_k_finds_the_k_largest(n, rng):
    from phoenix.corpus_store.snapshot import top_k_columns

    scores = rng.normal(size=(5, n)).astype(np.float32)
    scores[0, : n // 2] = -np.inf  # masked rows, as deleted posts are
    k = min(100, n)
    found = np.take_along_axis(scores, top_k_columns(scores, k), axis=1)
    np.testing.assert_array_equal(np.sort(found, axis=1), np.sort(scores, axis=1)[:, -k:])


def test_unique_sorted_and_the_is_in_searches_agree_with_numpy():
    from phoenix.corpus_store.segment import is_in_sorted, is_in_unsorted, unique_sorted

    rng = np.random.default_rng(3)
    for size in (0, 1, 2, 4096):
        values = rng.integers(-(2**62), 2**62, size) // 7 * 7  # repeats below
        values = np.concatenate([values, values[: size // 3]])
        np.testing.assert_array_equal(unique_sorted(values), np.unique(values))
        others = rng.integers(-(2**62), 2**62, 100)
        asked = np.concatenate([values[:50], others])[:100].reshape(4, -1)
        held = is_in_sorted(unique_sorted(values), asked)
        assert held.shape == asked.shape
        np.testing.assert_array_equal(held, np.isin(asked, values))
        few = asked.ravel()[::3]  # the few against the many, in any order
        np.testing.assert_array_equal(is_in_unsorted(few, values), np.isin(few, values))
        np.testing.assert_array_equal(is_in_unsorted(values[:0], few), np.zeros(0, bool))


def test_distinct_positions_agree_with_numpy_by_marks_and_by_sorting():
    from phoenix.corpus_store.segment import distinct_positions

    rng = np.random.default_rng(4)
    for size, count in ((1, 0), (1, 3), (50, 4096), (4733, 4096), (10**6, 4096), (10**6, 10)):
        positions = rng.integers(0, size, count)  # repeats: a post both engaged and served
        np.testing.assert_array_equal(
            distinct_positions(positions, size), np.unique(positions).astype(np.int64)
        )


def test_a_search_split_over_threads_equals_the_same_search_whole(tmp_path, rng, monkeypatch):
    """40 users, each with its own exclusions, over an indexed, a fresh and a copied segment
    with tombstones: split in parts on the search threads, the answer of the whole call."""
    store, centers, sealed, _ = three_segment_store(tmp_path, rng, nprobe=8)
    store.delete(sealed.post_ids[100:140])
    users = unit(centers[rng.integers(0, 16, 40)] + 0.5 * rng.normal(size=(40, D)))
    excluded = [sealed.post_ids[rng.integers(0, 5_000, int(n))] for n in rng.integers(0, 50, 40)]
    snapshot = store.open()
    monkeypatch.setattr(snapshot_module, "CORES", 3)  # parts of 8 or more: 3 parts here
    parts = []
    real_search = snapshot._search
    caller = threading.current_thread()

    def search_part(u, *a):
        parts.append((len(u), threading.current_thread() is caller))
        return real_search(u, *a)

    monkeypatch.setattr(snapshot, "_search", search_part)
    own_threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(3)  # not the one Faiss thread a part runs with
    try:
        split = snapshot.search(users, 30, excluded)
        threads_after = faiss.omp_get_max_threads()
    finally:
        faiss.omp_set_num_threads(own_threads)
    # the first part on the calling thread, the others on the search threads (in any order)
    assert sorted(parts) == [(13, False), (13, False), (14, True)]
    assert threads_after == 3  # the caller's Faiss setting as it was
    monkeypatch.setattr(snapshot_module, "CORES", 1)
    whole = snapshot.search(users, 30, excluded)
    for field in ("post_ids", "author_ids", "created_at"):  # the same posts, in the same order
        for a, b in zip(getattr(split, field), getattr(whole, field), strict=True):
            np.testing.assert_array_equal(a, b)
    # The same scores to float32 rounding, not bit for bit: a matrix product's BLAS kernel
    # depends on its shape, and an AVX2-only CPU scored 14 users' rows one ulp apart from 40's
    # (an AVX-512 Xeon's had not).
    for a, b in zip(split.scores, whole.scores, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-7, atol=0)
    assert len(split.post_ids) == 40


def test_search_threads_follow_the_environment_and_refuse_nonsense(monkeypatch):
    monkeypatch.setenv(snapshot_module.SEARCH_THREADS_ENV, "3")
    assert snapshot_module._cores() == 3
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(snapshot_module.SEARCH_THREADS_ENV, bad)
        with pytest.raises(ValueError, match="PHOENIX_SEARCH_THREADS must be a whole number"):
            snapshot_module._cores()
    monkeypatch.delenv(snapshot_module.SEARCH_THREADS_ENV)
    assert snapshot_module._cores() >= 1


# Rows of the warm tests' segments: 9.6 MB of vectors (about 2,300 pages), exact (below
# ann.ANN_MIN_ROWS).
WARM_ROWS = 150_000


def drop_from_page_cache(segment_dir) -> None:
    """Evict a segment's files from the page cache (written back first): as a server finds a
    store it did not just write, or one the kernel reclaimed while it sat unmapped."""
    for path in sorted(segment_dir.glob("*.npy")):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_share(array: np.ndarray) -> float:
    """The share of the pages under a memory-mapped ``array`` that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    address = array.ctypes.data
    start = address - address % page
    length = address + array.nbytes - start
    pages = -(-length // page)
    vector = (ctypes.c_ubyte * pages)()
    if libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vector) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed")
    return sum(byte & 1 for byte in vector) / pages


def segment_dirs(root):
    return sorted((root / "segments").iterdir())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and fadvise: Linux")
def test_a_follower_serves_only_warmed_segments(tmp_path, rng):
    """A follower's segments are in memory before a request reads them (the first generation
    and each one opened later), read back from disk if the page cache had dropped them; a
    plain snapshot's stay out (the control: the measure is able to fail)."""
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, WARM_ROWS, 1, 0))
    (segment_dir,) = segment_dirs(tmp_path / "s")
    drop_from_page_cache(segment_dir)
    cold = store.open().segments[0]
    assert resident_share(cold.embeddings) < 0.5
    follower = StoreFollower(tmp_path / "s", D, poll_seconds=60)
    (first,) = follower.current().segments
    for column in ("embeddings", "post_ids", "author_ids", "created_at", "sorted_ids"):
        assert resident_share(getattr(first, column)) == 1.0, column
    store.add(make_posts(rng, WARM_ROWS, 1_000_001, 0))
    drop_from_page_cache(segment_dirs(tmp_path / "s")[-1])
    later = follower.current().segments
    assert len(later) == 2
    assert resident_share(later[-1].embeddings) == 1.0
    assert resident_share(later[-1].id_order) == 1.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and fadvise: Linux")
def test_a_look_up_follower_warms_only_the_columns_it_reads(tmp_path, rng):
    store = CorpusStore.create(tmp_path / "s", D)
    store.add(make_posts(rng, WARM_ROWS, 1, 0))
    (segment_dir,) = segment_dirs(tmp_path / "s")
    drop_from_page_cache(segment_dir)
    (segment,) = StoreFollower(tmp_path / "s", D, searchable=False).current().segments
    for column in ("author_ids", "created_at", "sorted_ids", "id_order"):
        assert resident_share(getattr(segment, column)) == 1.0, column
    assert resident_share(segment.embeddings) < 0.5  # 9.6 MB it never reads stay on disk
