"""Positions of int64 ids, found by hashing, numpy only: where a corpus file finds the posts a
user must not get (``corpus.CorpusFile``'s ``index``).

A binary search (``np.searchsorted``) of a hot user's 4,096 served posts in the trained demo's
4,733 costs about twelve unpredictable branches an id (0.08-0.25 ms a user on this machine).
Here an id costs a multiply and two gathers, vectorised over all ids at once: each slot of a
table at most a quarter full holds the first id that hashed to it; an id whose slot holds
another (about one in eight), and every id of a lookup of fewer than 64, is found by the
binary search. Open addressing was tried and lost: linear probing's clusters took eight
vectorised rounds to settle, each costing more than the binary search of the few ids still
probing (docs/user-state.md, "A hot user's served posts in the retriever").

Shape glossary: N ids held, C slots (a power of two, >= 4N), Q ids looked up.
"""

from __future__ import annotations

import numpy as np

from phoenix.corpus_store.segment import find_ids

# Fibonacci hashing: the product's top bits spread ids of any pattern over the slots.
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)
_EMPTY = -1  # a slot no id hashed to
_SLOTS_PER_ID = 4  # at most a quarter of the slots full: 12-24 bytes of table an id
_FEW = 64  # fewer ids than this are found faster by the binary search alone


def _slot_bits(count: int) -> int:
    """log2 of the slots for ``count`` ids."""
    return max(1, int(_SLOTS_PER_ID * max(count, 1) - 1).bit_length())


class IdTable:
    """Positions of int64 ids: ``ids[i]`` at position ``i`` (the first, if repeated)."""

    def __init__(self, ids: np.ndarray):
        ids = np.ascontiguousarray(np.asarray(ids, np.int64).ravel())  # [N]
        self._order = np.argsort(ids, kind="stable")  # [N] positions by id
        self._sorted = ids[self._order]  # [N]
        bits = _slot_bits(len(ids))
        self._shift = np.uint64(64 - bits)
        self._keys = np.zeros(1 << bits, np.int64)  # [C] the id that took each slot
        self._positions = np.full(1 << bits, _EMPTY, np.int32 if len(ids) < 2**31 else np.int64)
        slots = self._slot(ids)  # [N]
        taken, first = np.unique(slots, return_index=True)  # the first id to hash to a slot
        self._keys[taken] = ids[first]
        self._positions[taken] = first

    def _slot(self, ids: np.ndarray) -> np.ndarray:
        """Each id's slot [Q] intp (``ids`` contiguous int64)."""
        return ((ids.view(np.uint64) * _MULTIPLIER) >> self._shift).astype(np.intp)

    def find(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions int64, found bool) of ``ids`` (any shape); a position is 0 where not
        found."""
        ids = np.asarray(ids, np.int64)
        flat = np.ascontiguousarray(ids.ravel())  # [Q]
        if len(flat) < _FEW:
            positions, found = self._searched(flat)
            return positions.reshape(ids.shape), found.reshape(ids.shape)
        slots = self._slot(flat)
        held = self._positions.take(slots).astype(np.int64)  # [Q]
        taken = held != _EMPTY  # a slot no id took: the id is not held
        found = (self._keys.take(slots) == flat) & taken
        clashed = np.flatnonzero(taken & ~found)  # the slot went to another id
        if len(clashed):
            held[clashed], found[clashed] = self._searched(flat[clashed])
        positions = np.where(found, held, 0)
        return positions.reshape(ids.shape), found.reshape(ids.shape)

    def _searched(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(positions, found) of ``ids`` [Q] by binary search of the sorted ids."""
        if len(self._sorted) == 0:
            return np.zeros(len(ids), np.int64), np.zeros(len(ids), bool)
        at, found = find_ids(self._sorted, ids)
        return np.where(found, self._order[at], 0), found
