"""Packed (score, row) keys (phoenix/corpus_store/score_keys.py): exact round trips, their
order, and the choice of each user's best distinct keys, against plain numpy."""

from __future__ import annotations

import numpy as np

from phoenix.corpus_store.score_keys import (
    FILL_KEY,
    MAX_ROWS,
    best_distinct_keys,
    best_keys,
    pack,
    unpack,
)

AWKWARD = [-np.inf, -3.5, -1e-38, -0.0, 0.0, 1e-45, 0.25, 3.4e38, np.inf]


def test_unpack_gives_back_every_score_bit_for_bit_and_every_row():
    scores = np.array([AWKWARD * 2], np.float32)  # [1, 18]
    rows = np.array([[-1, 0, 1, 7, 2**31, MAX_ROWS - 1, 3, 4, 5] * 2])
    back_scores, back_rows = unpack(pack(scores, rows))
    assert np.array_equal(back_scores.view(np.int32), scores.view(np.int32))  # -0.0 stays
    assert np.array_equal(back_rows, rows) and back_rows.dtype == np.int64


def test_keys_order_as_the_scores_then_the_rows():
    rng = np.random.default_rng(0)
    scores = rng.choice(np.array(AWKWARD, np.float32), size=(1, 400))
    scores[0, :200] = rng.normal(size=200).astype(np.float32)
    rows = rng.integers(-1, 50, size=(1, 400))  # many equal scores: rows break the ties
    order = np.argsort(pack(scores, rows)[0], kind="stable")
    by_row = np.where(rows[0] < 0, MAX_ROWS, rows[0])  # -1 packs as the largest row
    expected = np.lexsort((by_row, scores[0].astype(np.float64) + 0.0))  # -0.0 == 0.0 here
    assert np.array_equal(scores[0][order], scores[0][expected])
    same_score = scores[0][order][1:] == scores[0][order][:-1]
    signs_alike = np.signbit(scores[0][order][1:]) == np.signbit(scores[0][order][:-1])
    assert np.all(
        by_row[order][1:][same_score & signs_alike] >= by_row[order][:-1][same_score & signs_alike]
    )


def test_best_keys_are_each_rows_largest():
    rng = np.random.default_rng(1)
    keys = rng.integers(-(2**62), 2**62, size=(5, 300))
    best = best_keys(keys, 20)
    assert best.shape == (5, 20)
    assert np.array_equal(np.sort(best, axis=1), np.sort(keys, axis=1)[:, -20:])
    assert np.array_equal(best_keys(keys[:, :10], 20), keys[:, :10])  # fewer than wanted: all


def test_best_distinct_keys_keep_each_row_once_and_fill_where_too_few():
    rng = np.random.default_rng(2)
    want, batch = 30, 6
    scores = np.full((batch, 200), -np.inf, np.float32)
    rows = np.full((batch, 200), -1)
    for b, distinct in enumerate([100, 60, 31, 30, 12, 0]):
        found = rng.choice(10_000, distinct, replace=False)
        twice = rng.permutation(np.repeat(found, 2))  # a spilled post comes twice
        rows[b, : len(twice)] = twice
        scores[b, : len(twice)] = np.sin(twice).astype(np.float32)  # a row scores alike
    kept_scores, kept_rows = unpack(best_distinct_keys(pack(scores, rows), want))
    assert kept_rows.shape == (batch, want)
    for b in range(batch):
        held = kept_rows[b] >= 0
        distinct = np.unique(rows[b][rows[b] >= 0])
        best = distinct[np.argsort(-np.sin(distinct).astype(np.float32), kind="stable")][:want]
        assert sorted(kept_rows[b][held]) == sorted(best)  # each once, the best ones
        assert held.sum() == min(want, len(distinct))
        assert np.all(kept_scores[b][~held] == -np.inf)
        np.testing.assert_array_equal(
            kept_scores[b][held], np.sin(kept_rows[b][held]).astype(np.float32)
        )
    assert unpack(np.array([[FILL_KEY]]))[1][0, 0] == -1


def test_a_rows_copies_scored_apart_still_come_once_with_the_better_score():
    scores = np.array(
        [[0.5, 0.9, np.nextafter(np.float32(0.9), np.float32(0)), 0.1, 0.5]], np.float32
    )
    rows = np.array([[4, 7, 7, 2, 4]])  # row 7's copies one bit apart, row 4's alike
    kept_scores, kept_rows = unpack(best_distinct_keys(pack(scores, rows), 2))
    assert sorted(kept_rows[0]) == [4, 7]
    assert kept_scores[0][list(kept_rows[0]).index(7)] == np.float32(0.9)


def test_keys_swapped_to_row_first_and_back_are_unchanged():
    from phoenix.corpus_store.score_keys import by_row, by_score

    rng = np.random.default_rng(3)
    scores = rng.choice(np.array(AWKWARD, np.float32), size=(3, 50))
    rows = rng.integers(-1, 2**32 - 1, size=(3, 50))
    keys = pack(scores, rows)
    swapped = by_row(keys)
    assert np.array_equal(by_score(swapped), keys)
    order = np.argsort(swapped[0], kind="stable")  # row first, then score
    by = np.where(rows[0] < 0, MAX_ROWS, rows[0])
    assert np.all(np.diff(by[order]) >= 0)
