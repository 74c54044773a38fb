"""Recall of the store's indexed search for every kind of user: users whose histories mix
topics (their vectors lie between the index's clusters) and new users with 0-3 posts must keep
recall@100 against exact search (mean >= 0.95, worst decile >= 0.9). A small real index over
posts of the synthetic world embedded by the trained demo towers (not random vectors: those
have no clusters to miss)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from harness.recall import exact_top_k, recall_per_user, recall_summary
from phoenix.corpus_store import SEALED, CorpusStore
from phoenix.corpus_store.ann import ANN_MIN_ROWS
from phoenix.corpus_store.segment import Posts

TRAINED = Path(__file__).resolve().parents[2] / "artifacts" / "trained-demo"
POSTS = ANN_MIN_ROWS  # the smallest segment that gets an index
USERS = 48  # per kind
TOP_K = 100

pytest.importorskip("faiss")
pytestmark = pytest.mark.skipif(not TRAINED.is_dir(), reason="needs artifacts/trained-demo")


@pytest.fixture(scope="module")
def indexed_store(tmp_path_factory):
    """(snapshot of a one-segment IVF store, the world, its posts' vectors)."""
    from phoenix.engine import CandidateTower
    from phoenix.world.trained import trained_world

    world = trained_world(TRAINED, POSTS)
    authors = world.author_ids[world.post_author]
    vectors = CandidateTower.from_artifacts(TRAINED, rows_per_call=8192)(world.post_ids, authors)
    created = (world.post_created_ts - world.post_created_ts.max() + int(time.time())).astype(
        np.int64
    )
    store = CorpusStore.create(tmp_path_factory.mktemp("store"), vectors.shape[1])
    store.add(Posts(world.post_ids, authors, created, vectors), SEALED)  # choose_index's
    return store.open(), world, vectors


def store_recall(snapshot, vectors, users) -> dict:
    expected = exact_top_k(vectors, users, TOP_K)  # rows == positions in creation order
    found = []
    for start in range(0, len(users), 16):
        hits = snapshot.search(users[start : start + 16], TOP_K)
        found += [snapshot.segments[0].rows_of(ids) for ids in hits.post_ids]
    return recall_summary(recall_per_user(found, expected))


@pytest.mark.parametrize("kind", ["two_three_topics", "whole_corpus", "new"])
def test_indexed_search_keeps_recall_for_every_kind_of_user(indexed_store, kind):
    from harness.user_kinds import encode_histories, kind_histories

    snapshot, world, vectors = indexed_store
    assert snapshot.segments[0].index is not None  # the index is what is judged
    user_ids, history = kind_histories(world, kind, USERS, 16)
    if kind == "new":
        assert ((history >= 0).sum(axis=1) <= 3).all()
    users = encode_histories(TRAINED, world, user_ids, history)
    recall = store_recall(snapshot, vectors, users)
    assert recall["mean"] >= 0.95, recall
    assert recall["worst_decile"] >= 0.9, recall
