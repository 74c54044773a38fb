"""Tiled exact top-k over a device-resident corpus, float or int8 codes + exact re-ranking:
equal to one top-k over the whole corpus (on well-separated random scores, int8 errors of
~1e-2 never move an entry across its margin)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.rankings import dense_top_k
from tests.small_models import engine_with_corpus

D = 16


ENCODINGS = ("float", "int8")  # int8: codes choose candidates, float32 scores rank them


@pytest.mark.parametrize(
    "size,tile", [(1000, 128), (1000, 4096), (129, 128), (5, 128), (3000, 1024), (1000, 100)]
)
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_tiles_give_the_dense_top_k(size, tile, encoding):
    rng = np.random.default_rng(size)
    corpus = rng.normal(size=(size, D)).astype(np.float32)
    users = rng.normal(size=(3, D)).astype(np.float32)
    engine = engine_with_corpus(corpus, tile, encoding)
    k = min(50, size)
    idx, scores = engine.top_k(users, k)
    ref_idx, ref_scores = dense_top_k(users, corpus, k)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 0)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_excluded_indices_in_any_tile_never_come_back(encoding):
    rng = np.random.default_rng(7)
    corpus = rng.normal(size=(1000, D)).astype(np.float32)
    users = rng.normal(size=(3, D)).astype(np.float32)
    engine = engine_with_corpus(corpus, 128, encoding)
    best, _ = engine.top_k(users, 20)
    excluded = [best[0, :5], np.array([], np.int64), np.concatenate([best[2], [999, 0, 128]])]
    idx, scores = engine.top_k(users, 20, exclude_indices=excluded)
    ref_idx, ref_scores = dense_top_k(users, corpus, 20, excluded)
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)
    for row, gone in zip(idx, excluded):
        assert not np.isin(row, gone).any()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ties_keep_the_lower_index_across_tiles(encoding):
    corpus = np.zeros((600, D), np.float32)
    corpus[[5, 300, 450], 0] = 1.0  # three equal best entries in three tiles
    engine = engine_with_corpus(corpus, 128, encoding)
    idx, _ = engine.top_k(np.eye(1, D, dtype=np.float32), 3)
    assert idx.tolist() == [[5, 300, 450]]


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_ties_keep_the_lower_index_whatever_else_their_bins_hold(encoding):
    """Top-k's second pass sees whole bins of 128 entries: an equal score in a bin with a
    higher maximum must not overtake the lower index."""
    corpus = np.zeros((1000, D), np.float32)
    corpus[700, 0] = 2.0  # bin 5's maximum
    corpus[[10, 701], 0] = 1.0  # equal scores: bin 0 (max 1.0) and bin 5 (max 2.0)
    engine = engine_with_corpus(corpus, 1024, encoding)
    idx, scores = engine.top_k(np.eye(1, D, dtype=np.float32), 3)
    assert idx.tolist() == [[700, 10, 701]]
    assert scores.tolist() == [[2.0, 1.0, 1.0]]


# ---- default tile sizes: whole corpora on a GPU while the scores fit ----


def test_small_corpora_are_one_tile_on_every_backend():
    from phoenix.engine.retrieval import default_corpus_tile

    for backend in ("cpu", "gpu"):
        assert default_corpus_tile(1000, 64, backend) == 1024  # whole bins of 128
        assert default_corpus_tile(262_144, 64, backend) == 262_144


def test_large_corpora_are_cache_sized_tiles_on_cpus():
    from phoenix.engine.retrieval import default_corpus_tile

    assert default_corpus_tile(10_000_000, 64, "cpu") == 16_384


def test_a_gpu_scores_the_whole_corpus_at_once_while_the_largest_batch_fits():
    from phoenix.engine.retrieval import DEVICE_SCORE_BYTES, default_corpus_tile

    assert default_corpus_tile(10_000_000, 64, "gpu") == 10_000_000  # 64 x 10 M x 4 B = 2.6 GB
    assert default_corpus_tile(10_000_001, 64, "gpu") == 10_000_128  # whole bins
    fits = DEVICE_SCORE_BYTES // (4 * 64)
    assert default_corpus_tile(fits, 64, "gpu") == fits  # exactly one tile's worth


@pytest.mark.parametrize("size", [17_000_000, 33_554_433, 100_000_000, 123_456_789])
@pytest.mark.parametrize("max_batch", [16, 64, 1 << 20])
def test_gpu_tiles_are_as_few_as_fit_and_pad_less_than_a_bin_each(size, max_batch):
    from phoenix.engine.retrieval import (
        DEVICE_SCORE_BYTES,
        ONE_TILE_ROWS,
        SCORE_BIN,
        default_corpus_tile,
    )

    tile = default_corpus_tile(size, max_batch, "gpu")
    count = -(-size // tile)
    fits = max(ONE_TILE_ROWS, DEVICE_SCORE_BYTES // (4 * max_batch))
    assert tile % SCORE_BIN == 0 and tile <= fits  # the scores of a tile fit
    assert count == -(-size // (fits // SCORE_BIN * SCORE_BIN))  # no more tiles than needed
    assert count * tile - size < count * SCORE_BIN  # each tile pads under a bin


def test_the_engine_sizes_tiles_for_its_largest_batch_bucket(monkeypatch):
    from phoenix.engine import retrieval
    from tests.small_models import small_retriever, small_transformer

    seen = []
    monkeypatch.setattr(
        retrieval, "default_corpus_tile", lambda size, batch: seen.append(batch) or 128
    )
    config = small_retriever(small_transformer(4, 8, 2, 2, 1, 0.125), 4, 2)
    engine = retrieval.RetrievalEngine(config, {}, batch_buckets=(8, 1, 64))
    engine.set_corpus(np.ones((300, 4), np.float32))
    assert seen == [64] and engine.corpus.tiles.shape[1] == 128
