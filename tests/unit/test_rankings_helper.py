"""The tie-aware ranking comparison the integration tests rely on accepts only near-ties."""

import numpy as np
import pytest

from tests.rankings import assert_same_ranking_up_to_ties

IDS = np.array([7, 9, 3, 1], np.int64)
SCORES = np.array([0.9, 0.5000001, 0.5, 0.1], np.float32)
TOL = 1e-5


def test_accepts_identical_rankings():
    assert_same_ranking_up_to_ties(IDS, SCORES, IDS, SCORES, TOL)


def test_accepts_a_swap_of_near_tied_candidates():
    ids = np.array([7, 3, 9, 1], np.int64)
    scores = np.array([0.9, 0.50000015, 0.5000001, 0.1], np.float32)  # 3 rounded up
    assert_same_ranking_up_to_ties(ids, scores, IDS, SCORES, TOL)


def test_rejects_a_swap_beyond_a_tie():
    ids = np.array([9, 7, 3, 1], np.int64)
    with pytest.raises(AssertionError):  # with its own scores: unsorted
        assert_same_ranking_up_to_ties(ids, SCORES[[1, 0, 2, 3]], IDS, SCORES, TOL)
    with pytest.raises(AssertionError):  # sorted, but not the scores those ids have
        assert_same_ranking_up_to_ties(ids, SCORES, IDS, SCORES, TOL)


def test_rejects_unsorted_scores_and_missing_candidates():
    with pytest.raises(AssertionError, match="sorted"):
        assert_same_ranking_up_to_ties(IDS, SCORES[::-1], IDS, SCORES, TOL)
    with pytest.raises(AssertionError, match="same candidates"):
        assert_same_ranking_up_to_ties(IDS[:3], SCORES[:3], IDS, SCORES, TOL)


def test_rejects_a_swap_of_candidates_further_apart_than_the_tolerance():
    """Each served score within the tolerance of its own, yet the two expected scores are
    1.8 tolerances apart: not a tie, so the swapped order is wrong."""
    expected_ids = np.array([1, 2], np.int64)
    expected = np.array([1e-3 + 1.8e-5, 1e-3])
    served = np.array([1e-3 + 0.95e-5, 1e-3 + 0.9e-5])  # ids 2 then 1, each 0.9e-5 off
    with pytest.raises(AssertionError, match="beyond a near-tie"):
        assert_same_ranking_up_to_ties(expected_ids[::-1], served, expected_ids, expected, TOL)
