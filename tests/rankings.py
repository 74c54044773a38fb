"""Comparing a served ranking with an expected one when float rounding may differ.

Why not plain equality: XLA compiles one program per padded batch shape, and programs of
different shapes round differently in the last bits (measured: up to 1.7e-6 between batch
buckets 1 and 8 on the tiny config). A request answers bit-exactly for a given shape, but
the dynamic batcher picks the shape, so two candidates whose scores tie within that noise
may come back in either order. Everything else stays strict.
"""

from __future__ import annotations

import numpy as np


def assert_same_ranking_up_to_ties(
    ids: np.ndarray,
    scores: np.ndarray,
    expected_ids: np.ndarray,
    expected_scores: np.ndarray,
    tol: float,
) -> None:
    """``ids`` ranks the same candidates as ``expected_ids``, sorted by its own ``scores``,
    each id scored as expected, and any place where the orders differ holds candidates
    whose expected scores tie within ``tol``."""
    ids, scores = np.asarray(ids), np.asarray(scores)
    expected_ids, expected_scores = np.asarray(expected_ids), np.asarray(expected_scores)
    assert sorted(ids.tolist()) == sorted(expected_ids.tolist()), "not the same candidates"
    assert (np.diff(scores) <= 0).all(), "served scores are not sorted descending"
    expected_by_id = dict(zip(expected_ids.tolist(), expected_scores.tolist()))
    expected_in_served_order = np.array([expected_by_id[i] for i in ids.tolist()])
    np.testing.assert_allclose(scores, expected_in_served_order, rtol=tol, atol=tol)
    # a swap of candidates that do not tie puts a different score at that position
    np.testing.assert_allclose(
        expected_in_served_order,
        expected_scores,
        rtol=tol,
        atol=tol,
        err_msg="ranked in a different order beyond a near-tie",
    )


def dense_top_k(users: np.ndarray, corpus: np.ndarray, k: int, excluded=None):
    """Reference top-k: indices and scores [B, k] of one float32 matmul over the whole corpus,
    ``excluded`` (index arrays per user) scored -inf, ties by lower index."""
    scores = users @ corpus.T  # [B, M]
    if excluded is not None:
        for r, idx in enumerate(excluded):
            scores[r, idx] = -np.inf
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def assert_same_feed(served: dict, expected: dict, tol: float, row: int = 0) -> None:
    """Two feed outputs (``ranked_post_ids`` and ``scores``) rank ``row`` the same way up to
    near-ties (``assert_same_ranking_up_to_ties``)."""
    assert_same_ranking_up_to_ties(
        served["ranked_post_ids"][row],
        served["scores"][row],
        expected["ranked_post_ids"][row],
        expected["scores"][row],
        tol,
    )
