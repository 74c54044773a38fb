"""Which users send requests, and how often: a Zipf law over a population of user ids.

A few users request their feed far more often than most (the load test's by-id traffic and the
user-state benchmarks draw users this way, so the store sees hot and cold keys as in
production). The user of rank ``r`` (1-based, the order of the ids given) is drawn with
probability proportional to ``r ** -s``: ``s = 0`` is uniform, ``s`` around 1 is the usual
web-traffic skew. Draws come from a generator the caller seeds, so a run is reproducible.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

DEFAULT_ZIPF_S = 1.1


def zipf_probabilities(count: int, s: float) -> np.ndarray:
    """[count] probabilities of ranks 1..count, proportional to rank ** -s (they sum to 1)."""
    if count < 1:
        raise ValueError(f"a Zipf population needs at least one user, got {count}")
    if not np.isfinite(s) or s < 0:
        raise ValueError(f"the Zipf exponent must be a finite number >= 0, got {s}")
    weights = np.arange(1, count + 1, dtype=np.float64) ** -float(s)
    return weights / weights.sum()


class ZipfUsers:
    """Draw user ids of ``user_ids`` (rank order: the first is the most requested) by Zipf's
    law with exponent ``s``."""

    def __init__(self, user_ids, s: float = DEFAULT_ZIPF_S):
        self.user_ids = np.asarray(user_ids, np.int64)
        self.s = float(s)
        self.probabilities = zipf_probabilities(len(self.user_ids), self.s)
        # inverse transform sampling: one uniform draw and a binary search per user
        self._cumulative = np.cumsum(self.probabilities)
        self._cumulative[-1] = 1.0  # rounding must not leave a gap above the last user

    def __len__(self) -> int:
        return len(self.user_ids)

    def draw(self, rng: np.random.Generator, size: Optional[int] = None):
        """One user id (an int) or ``size`` of them (an int64 array), drawn with ``rng``."""
        uniform = rng.random(size)
        ranks = np.searchsorted(self._cumulative, uniform, side="right")
        ranks = np.minimum(ranks, len(self.user_ids) - 1)
        if size is None:
            return int(self.user_ids[int(ranks)])
        return self.user_ids[ranks]


def user_stream(seed: int, number: int) -> np.random.Generator:
    """The generator of the ``number``-th simulated client of a run seeded ``seed``: each
    client's draws are reproducible and independent of the others'."""
    return np.random.default_rng([int(seed), int(number)])
