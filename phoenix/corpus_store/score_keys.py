"""(score, row) pairs packed into one int64 key each, so that choosing the best of them is one
``np.partition`` or ``np.sort`` of plain integers.

numpy 2.4 partitions plain int64 and float32 arrays far faster than it argpartitions them: on
this project's 2-core machine (AVX2) an ``argpartition`` of 8 users' 1,000 scores took 66 µs,
a ``partition`` of their packed keys 25, and the keys need no gather of rows after. A key
orders as its score, then its row; unpacking gives both back bit for bit.

Shape glossary
  B  users   c  candidates a user   w  kept a user
"""

from __future__ import annotations

import numpy as np

ROW_BITS = 32
ROW_MASK = (1 << ROW_BITS) - 1
NO_ROW = ROW_MASK  # a row of -1 (no candidate) packs as the largest row
MAX_ROWS = NO_ROW  # rows must be below this to pack


def score_order(scores: np.ndarray) -> np.ndarray:
    """int32 [...] ordered as the float32 ``scores`` are (-inf lowest): a float's bits as a
    signed integer order the non-negative floats; below zero the magnitude bits are flipped,
    so that a larger magnitude orders lower. Its own inverse (``order_scores``). -0.0 orders
    just below +0.0 (a float comparison calls them equal; exact zeros need zero vectors)."""
    bits = np.ascontiguousarray(scores, np.float32).view(np.int32)
    return bits ^ ((bits >> 31) & np.int32(0x7FFFFFFF))


def order_scores(order: np.ndarray) -> np.ndarray:
    """The float32 scores [...] of their ``score_order`` values (int32)."""
    order = np.asarray(order, np.int32)
    return (order ^ ((order >> 31) & np.int32(0x7FFFFFFF))).view(np.float32)


def pack(scores: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """int64 keys [B, c] of ``scores`` (float32) and their ``rows`` (int64, -1: none, else
    below MAX_ROWS): score in the high 32 bits, row in the low, so keys order as the scores
    and, at equal scores, as the rows (-1 as the largest)."""
    high = score_order(scores).astype(np.int64) << ROW_BITS
    return high | (np.asarray(rows, np.int64) & ROW_MASK)


def unpack(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32, rows int64, -1 where none) [...] of packed ``keys``."""
    scores = order_scores((keys >> ROW_BITS).astype(np.int32))
    rows = keys & ROW_MASK
    return scores, np.where(rows == NO_ROW, -1, rows)


def best_keys(keys: np.ndarray, want: int) -> np.ndarray:
    """The ``want`` largest keys of each row of ``keys`` [B, c] (all of them where c <= want),
    in no order."""
    width = keys.shape[1]
    if width <= want:
        return keys
    return np.partition(keys, width - want, axis=1)[:, width - want :]


def best_distinct_keys(keys: np.ndarray, want: int) -> np.ndarray:
    """The ``want`` largest keys [B, <= w] of each row of ``keys`` [B, c], each candidate row
    once (its best key), in no order; FILL_KEY (no candidate) where a row has fewer. A row may
    come twice (a post in two lists).

    The 2 x ``want`` largest hold the ``want`` best distinct rows (a row comes at most twice).
    Re-packed row first (``by_row``), one sort puts a row's copies side by side, its lower copy
    first; that one becomes FILL_KEY, and the ``want`` largest are kept. By row, not by equal
    keys: a copy scored a bit apart (a summation order that depends on where a row lies in
    memory) still goes."""
    top = np.sort(by_row(best_keys(keys, 2 * want)), axis=1)  # [B, <= 2 w] uint64, by row
    rows = top >> np.uint64(ROW_BITS)
    copy = np.zeros(top.shape, bool)
    copy[:, :-1] = (rows[:, :-1] == rows[:, 1:]) & (rows[:, :-1] != NO_ROW)
    kept = by_score(top)
    kept[copy] = FILL_KEY
    return best_keys(kept, want)


def by_row(keys: np.ndarray) -> np.ndarray:
    """uint64 [...] of score ``keys`` with their halves swapped: the row high, the score's
    order low (its sign bit flipped, so that it orders as an unsigned number)."""
    unsigned = keys.view(np.uint64)
    return (unsigned << np.uint64(ROW_BITS)) | ((unsigned >> np.uint64(ROW_BITS)) ^ SIGN_BIT)


def by_score(swapped: np.ndarray) -> np.ndarray:
    """The score keys (int64) of ``by_row`` keys."""
    low, high = swapped & np.uint64(ROW_MASK), swapped >> np.uint64(ROW_BITS)
    return (((low ^ SIGN_BIT) << np.uint64(ROW_BITS)) | high).view(np.int64)


SIGN_BIT = np.uint64(1 << 31)
# The key of no candidate: score -inf, row -1
FILL_KEY = int(pack(np.full((1, 1), -np.inf, np.float32), np.full((1, 1), -1))[0, 0])
