"""The prefix cache's store (phoenix/engine/prefix_cache.py), whatever the model family: keys
exact by construction, the byte budget with the least recently used out, the time to live on
an injected clock, a version change dropping every entry."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.engine.prefix_cache import MIB, PrefixCache, PrefixKey, row_digests


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_least_recently_used_goes_first_and_the_budget_holds():
    cache = PrefixCache(100, ttl_s=60)
    for name in "abc":
        assert cache.put(name, name.upper(), 30)
    assert cache.get("a") == "A"  # a is now the most recently used
    assert cache.put("d", "D", 30)  # 120 > 100: b, the least recently used, goes
    assert cache.keys() == ["c", "a", "d"]
    assert cache.get("b") is None
    stats = cache.stats()
    assert (stats.bytes, stats.entries, stats.evicted["budget"]) == (90, 3, 1)
    assert (stats.hits, stats.misses) == (1, 1)
    assert cache.put("e", "E", 70)  # c and a go: 30 + 70 <= 100
    assert cache.keys() == ["d", "e"]
    assert cache.stats().evicted["budget"] == 3


def test_more_users_than_fit_never_hold_more_than_the_budget():
    rng = np.random.default_rng(0)
    budget = 10_000
    cache = PrefixCache(budget, ttl_s=60)
    sizes: dict[int, int] = {}
    for user in range(2_000):
        size = int(rng.integers(100, 3_000))
        sizes[user] = size
        cache.put(user, user, size)
        held = cache.keys()
        stats = cache.stats()
        assert stats.bytes == sum(sizes[k] for k in held) <= budget
        assert stats.entries == len(held)
        assert held[-1] == user  # the newest is kept
    stats = cache.stats()
    assert stats.evicted["budget"] == 2_000 - stats.entries > 1_900


def test_an_entry_larger_than_the_budget_is_not_kept():
    cache = PrefixCache(100, ttl_s=60)
    cache.put("small", 1, 60)
    assert not cache.put("big", 2, 101)
    assert cache.keys() == ["small"]  # nothing was evicted for it
    assert cache.stats().too_large == 1


def test_entries_expire_their_time_to_live_after_they_were_made_used_or_not():
    clock = Clock()
    cache = PrefixCache(1_000, ttl_s=10, clock=clock)
    cache.put("a", "A", 10)
    clock.now = 5
    cache.put("b", "B", 10)
    clock.now = 9.9
    assert cache.get("a") == "A"  # a hit does not make it younger
    clock.now = 10
    assert cache.get("a") is None
    assert cache.keys() == ["b"]
    stats = cache.stats()
    assert (stats.bytes, stats.evicted["expired"]) == (10, 1)
    clock.now = 15
    assert cache.stats().entries == 0  # expired without being asked for
    assert cache.stats().evicted["expired"] == 2
    cache.put("a", "A2", 10)  # asked for again: a new entry with a new life
    clock.now = 24.9
    assert cache.get("a") == "A2"


def test_another_version_drops_every_entry_and_keys_carry_the_version():
    cache = PrefixCache(1_000, ttl_s=60, version="v1")
    old = cache.key(7, b"digest")
    assert old == PrefixKey("v1", 7, b"digest")
    cache.put(old, "prefix", 10)
    cache.bind("v1")  # the same version: nothing changes
    assert cache.get(old) == "prefix"
    cache.bind("v2")
    stats = cache.stats()
    assert (stats.entries, stats.bytes, stats.evicted["version"]) == (0, 0, 1)
    new = cache.key(7, b"digest")
    assert new != old and new.version == "v2"
    assert cache.get(old) is None and cache.get(new) is None


def test_row_digests_differ_in_any_byte_of_any_array_and_agree_on_equal_rows():
    rng = np.random.default_rng(1)
    ids = rng.integers(1, 2**62, (3, 5))
    actions = (rng.random((3, 5, 4)) > 0.5).astype(np.float32)
    surfaces = np.zeros((3, 5), np.int32)
    ids[2], actions[2] = ids[0], actions[0]  # row 2 equals row 0
    first, second, third = row_digests([ids, actions, surfaces], 3)
    assert first == third != second
    for array, index in ((ids, (0, 4)), (actions, (0, 3, 1)), (surfaces, (0, 0))):
        changed = array.copy()
        changed[index] += 1
        arrays = [changed if a is array else a for a in (ids, actions, surfaces)]
        assert row_digests(arrays, 1)[0] != first
    # the same bytes read as another dtype are another prefix
    assert row_digests([ids.view(np.float64), actions, surfaces], 1)[0] != first
    assert len(first) == 16


def test_sizes_in_mib_and_the_off_switch():
    assert PrefixCache.of_mib(0, 60) is None
    cache = PrefixCache.of_mib(2, 60)
    assert cache is not None and cache.budget == 2 * MIB
    with pytest.raises(ValueError, match="budget"):
        PrefixCache(-1, 60)
    with pytest.raises(ValueError, match="time to live"):
        PrefixCache(10, 0)
