"""The IVF search's own steps (phoenix/corpus_store/ann.py): which lists each user probes, and
the exact re-scoring of the index's candidates, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.corpus_store.ann import PARALLEL_SCORES, best_lists, scores_of_rows


def test_each_user_keeps_exactly_its_count_of_best_lists():
    rng = np.random.default_rng(3)
    every = rng.normal(size=(6, 300)).astype(np.float32)  # centroid scores [B, nlist]
    probes = np.array([5, 40, 5, 17, 1, 40])
    lists, scores = best_lists(every, probes)
    assert lists.shape == scores.shape == (6, 40) and lists.dtype == np.int64
    for b, count in enumerate(probes):
        kept = lists[b][lists[b] >= 0]
        expected = np.argsort(-every[b])[:count]
        assert sorted(kept) == sorted(expected)
        held = lists[b] >= 0
        assert np.array_equal(scores[b][held], every[b][lists[b][held]])


@pytest.mark.parametrize("width", [40, PARALLEL_SCORES // 3 + 1])  # numpy, then Faiss' way
def test_scores_of_rows_are_the_exact_inner_products_and_minus_inf_for_no_row(width):
    rng = np.random.default_rng(4)
    embeddings = rng.normal(size=(500, 16)).astype(np.float32)  # [n, D]
    users = rng.normal(size=(3, 16)).astype(np.float32)  # [B, D]
    rows = rng.integers(0, 500, size=(3, width))  # [B, c]
    rows[1, 30:] = -1  # fewer candidates than asked
    scores = scores_of_rows(embeddings, users, rows)
    expected = np.einsum("bcd,bd->bc", embeddings[np.maximum(rows, 0)], users)
    held = rows >= 0
    np.testing.assert_allclose(scores[held], expected[held], rtol=1e-5, atol=1e-5)
    assert np.all(scores[~held] == -np.inf)
