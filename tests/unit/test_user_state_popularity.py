"""The Zipf draw of requesting users (phoenix/world/popularity.py): reproducible for a
seed, skewed as the exponent says, uniform at 0, only ids of the population."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.world.popularity import ZipfUsers, user_stream, zipf_probabilities

IDS = np.arange(1000, 1100, dtype=np.int64)  # 100 users, rank order


def test_the_same_seed_draws_the_same_users_and_another_seed_others():
    users = ZipfUsers(IDS, s=1.1)
    first = users.draw(user_stream(7, 0), 500)
    assert np.array_equal(first, users.draw(user_stream(7, 0), 500))
    assert not np.array_equal(first, users.draw(user_stream(7, 1), 500))  # another client
    assert not np.array_equal(first, users.draw(user_stream(8, 0), 500))  # another seed
    single = [users.draw(user_stream(7, 0)) for _ in range(1)]
    assert single == [int(first[0])] and isinstance(single[0], int)


def test_draws_follow_the_zipf_law_first_ranks_most():
    users = ZipfUsers(IDS, s=1.1)
    draws = users.draw(user_stream(0, 0), 200_000)
    assert np.isin(draws, IDS).all()
    counts = np.bincount(draws - IDS[0], minlength=len(IDS))
    expected = zipf_probabilities(len(IDS), 1.1)
    assert np.allclose(counts / len(draws), expected, atol=0.005)
    # rank 1 about twice as often as rank 2 (2 ** 1.1 = 2.14), ten times rank 8 or so
    assert 1.9 < counts[0] / counts[1] < 2.4
    top_tenth = counts[:10].sum() / len(draws)
    assert top_tenth > 0.6, top_tenth  # a tenth of the users send most requests


def test_exponent_zero_is_uniform_and_larger_is_more_skewed():
    uniform = ZipfUsers(IDS, s=0.0).draw(user_stream(1, 0), 100_000)
    counts = np.bincount(uniform - IDS[0], minlength=len(IDS))
    assert counts.min() > 800 and counts.max() < 1200  # 1,000 each expected
    share = {
        s: np.mean(ZipfUsers(IDS, s=s).draw(user_stream(1, 0), 20_000) == IDS[0])
        for s in (0.5, 1.0, 2.0)
    }
    assert share[0.5] < share[1.0] < share[2.0]


def test_probabilities_sum_to_one_and_bad_settings_are_refused():
    assert zipf_probabilities(1, 1.1).tolist() == [1.0]
    assert zipf_probabilities(1000, 1.3).sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="at least one user"):
        ZipfUsers([], 1.0)
    with pytest.raises(ValueError, match="exponent"):
        zipf_probabilities(10, -1.0)
