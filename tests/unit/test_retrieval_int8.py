"""Exact top-k over an int8 corpus: int8 codes choose candidates, exact float32 scores rank them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine.retrieval import INT8_BIN, int8_rows
from tests.rankings import dense_top_k
from tests.small_models import engine_with_corpus

D = 16


def assert_exact_scores_of_returned_ids(users, corpus, idx, scores):
    """Whatever ids come back, their scores are their float32 scores, best first."""
    exact = np.einsum("bkd,bd->bk", corpus[idx], users)  # [B, k]
    np.testing.assert_allclose(scores, exact, rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 0)


def test_int8_rows_round_each_component_to_its_rows_grid():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, D)).astype(np.float32)
    x[3] = 0.0  # a zero row: no division by zero
    codes, scales = int8_rows(x)
    assert codes.dtype == np.int8 and scales.dtype == np.float32
    assert np.abs(codes).max() == 127
    err = np.abs(codes * scales[:, None] - x)  # [M, D]
    assert np.all(err <= scales[:, None] / 2 + 1e-7)
    assert not codes[3].any()


@pytest.mark.parametrize(
    "size,tile", [(1000, 128), (1000, 4096), (129, 128), (5, 128), (3000, 1024), (1000, 100)]
)
def test_int8_tiles_hold_codes_in_whole_bins(size, tile):
    """The layout the int8 passes rely on (their results: test_retrieval_tiles.py)."""
    corpus = np.random.default_rng(size).normal(size=(size, D)).astype(np.float32)
    engine = engine_with_corpus(corpus, tile, "int8")
    assert engine.corpus.tiles.dtype == jnp.int8
    assert engine.corpus.tiles.shape[1] % INT8_BIN == 0
    assert engine.corpus.scales.shape == engine.corpus.tiles.shape[:2]


def test_int8_and_float_corpora_agree_on_well_separated_data():
    rng = np.random.default_rng(3)
    corpus = rng.normal(size=(5000, D)).astype(np.float32)
    users = rng.normal(size=(6, D)).astype(np.float32)
    int8 = engine_with_corpus(corpus, 1024, "int8")
    plain = engine_with_corpus(corpus, 1024)
    for k in (1, 10, 64, 100):
        idx, scores = int8.top_k(users, k)
        ref_idx, ref_scores = plain.top_k(users, k)
        np.testing.assert_array_equal(idx, ref_idx)
        np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_excluding_more_than_the_candidates_still_gives_the_top_k_of_the_rest():
    """Each user's 400 best entries excluded: more than the k + margin candidates the int8
    pass returns, so the exclusions must act inside it, not after it."""
    rng = np.random.default_rng(11)
    corpus = rng.normal(size=(4000, D)).astype(np.float32)
    users = rng.normal(size=(4, D)).astype(np.float32)
    engine = engine_with_corpus(corpus, 512, "int8", rerank_margin=50)
    ref_best, _ = dense_top_k(users, corpus, 400)
    excluded = list(ref_best)
    idx, scores = engine.top_k(users, 30, exclude_indices=excluded)
    ref_idx, ref_scores = dense_top_k(users, corpus, 30, excluded)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_near_ties_return_exact_scores_within_the_int8_error_of_the_best():
    """Near-duplicates (noise 1e-3 around 8 centres): int8 codes cannot tell them apart, so
    the ids may differ from float32's. What holds whatever the data: every returned score is
    the float32 score of its id, best first, no excluded id comes back, and the i-th score
    is within twice the int8 error bound of the true i-th best (an entry the int8 pass left
    out scores below k + margin candidates in int8, so at most 2 x error above them)."""
    rng = np.random.default_rng(5)
    centres = rng.normal(size=(8, D)).astype(np.float32)
    corpus = centres[rng.integers(0, 8, 20_000)] + 1e-3 * rng.normal(size=(20_000, D))
    corpus = (corpus / np.linalg.norm(corpus, axis=1, keepdims=True)).astype(np.float32)
    users = (centres[:4] + 0.01 * rng.normal(size=(4, D))).astype(np.float32)
    engine = engine_with_corpus(corpus, 4096, "int8", rerank_margin=28)
    ref_best, _ = dense_top_k(users, corpus, 30)
    excluded = [ref_best[r, r::4] for r in range(4)]  # some of each user's very best
    idx, scores = engine.top_k(users, 100, exclude_indices=excluded)
    assert idx.shape == (4, 100)
    assert_exact_scores_of_returned_ids(users, corpus, idx, scores)
    for row, gone in zip(idx, excluded):
        assert not np.isin(row, gone).any()
        assert len(np.unique(row)) == len(row)
    codes, scales = int8_rows(corpus)
    row_error = np.linalg.norm(codes * scales[:, None] - corpus, axis=1).max()
    bound = 2 * np.linalg.norm(users, axis=1, keepdims=True) * row_error  # [B, 1]
    _, ref_scores = dense_top_k(users, corpus, 100, excluded)
    assert np.all(scores <= ref_scores + 1e-5)  # nothing beats the true i-th best
    assert np.all(scores >= ref_scores - bound - 1e-5)
    assert np.any(scores < ref_scores - 1e-6)  # the data does defeat int8 here


def test_int8_warm_up_prepares_every_program_top_k_then_runs():
    rng = np.random.default_rng(2)
    corpus = rng.normal(size=(3000, D)).astype(np.float32)
    engine = engine_with_corpus(corpus, 1024, "int8")
    assert engine.warm_up_top_k() > 0
    compiled = engine._int8_top_k.compiled
    users = rng.normal(size=(3, D)).astype(np.float32)
    for k in (1, 64, 65, 200, 1000, 2048, 2500):
        idx, _ = engine.top_k(users, k)
        assert idx.shape == (3, min(k, 2048))
    assert engine._int8_top_k.compiled == compiled  # no shape left to compile at a call


def test_unknown_corpus_encoding_is_refused():
    with pytest.raises(ValueError, match="corpus_encoding"):
        engine_with_corpus(np.zeros((4, D), np.float32), encoding="int4")
