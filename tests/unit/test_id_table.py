"""phoenix.stub.id_table: every lookup against a dictionary built from the same ids, over
tables where ids share slots, repeated ids, absent ids, negative ids and small lookups.

The figures in docs/user-state.md ("A hot user's served posts in the retriever") come from
timing ``IdTable.find`` against ``np.searchsorted`` on this machine, not from this test."""

import numpy as np
import pytest

from phoenix.stub.id_table import IdTable, _slot_bits


def oracle(ids: np.ndarray) -> dict[int, int]:
    """Each id's first position."""
    first: dict[int, int] = {}
    for position, post in enumerate(ids.tolist()):
        first.setdefault(post, position)
    return first


def assert_finds_as_oracle(table: IdTable, ids: np.ndarray, queries: np.ndarray) -> None:
    first = oracle(ids)
    positions, found = table.find(queries)
    assert positions.shape == found.shape == queries.shape
    assert positions.dtype == np.int64 and found.dtype == bool
    for query, position, hit in zip(queries.ravel().tolist(), positions.ravel(), found.ravel()):
        assert hit == (query in first), query
        assert position == first.get(query, 0), query


@pytest.mark.parametrize("count", [1, 7, 4_733, 50_000])
@pytest.mark.parametrize("lookup", [5, 63, 64, 4_096])
def test_finds_what_a_dictionary_finds(count, lookup):
    rng = np.random.default_rng(count + lookup)
    ids = rng.integers(-(2**63), 2**63 - 1, count, dtype=np.int64)
    table = IdTable(ids)
    held = ids[rng.integers(0, count, lookup)]
    absent = rng.integers(-(2**63), 2**63 - 1, lookup, dtype=np.int64)
    queries = np.where(rng.random(lookup) < 0.8, held, absent)
    assert_finds_as_oracle(table, ids, queries)


def test_ids_that_share_a_slot_are_all_found():
    """Random ids in a table of 4N slots: about one in eight lands on a slot another took
    first, and the binary search finds it."""
    ids = np.random.default_rng(3).integers(0, 2**63 - 1, 3_000, dtype=np.int64)
    table = IdTable(ids)
    slots = table._slot(ids)
    assert len(ids) - len(np.unique(slots)) > 100  # the case under test happens
    assert_finds_as_oracle(table, ids, np.concatenate([ids, -ids, ids + 1]))


def test_consecutive_ids_are_found():
    """A generator's post ids 1..N: Fibonacci hashing spreads them without a shared slot."""
    ids = np.arange(1, 3_001, dtype=np.int64)
    assert_finds_as_oracle(IdTable(ids), ids, np.arange(-10, 6_000, dtype=np.int64))


def test_repeated_ids_give_their_first_position():
    ids = np.array([9, 4, 9, 4, 4, 2**62, 9] * 20, np.int64)
    assert_finds_as_oracle(IdTable(ids), ids, np.array([9, 4, 2**62, 5] * 30, np.int64))


def test_any_shape_and_an_empty_table():
    ids = np.arange(100, 300, dtype=np.int64)
    queries = np.arange(0, 400, dtype=np.int64).reshape(4, 100)
    assert_finds_as_oracle(IdTable(ids), ids, queries)
    empty = IdTable(np.zeros(0, np.int64))
    for size in (3, 200):
        positions, found = empty.find(np.arange(size, dtype=np.int64))
        assert not found.any() and not positions.any()


def test_the_table_is_at_most_a_quarter_full():
    for count in (0, 1, 2, 3, 1_000, 4_733, 1 << 20):
        slots = 1 << _slot_bits(count)
        assert slots >= 4 * count and (count == 0 or slots < 8 * count)
