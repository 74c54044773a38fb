"""The production ranker with its prefix cache (phoenix/engine/production_prefix.py) against the
same ranker without it: the key covers every field the prefix reads and no candidate field,
ragged batches mixing hits and misses answer as the uncached ranker (float32 and bfloat16), a
history changed by an event is a miss, a prefix two rows share is computed once, padding rows
are never kept, the byte accounting is exact and the budget holds with more users than fit.

A small config of the nano ranker (tests/unit/test_production_model.py's TINY), random
parameters; one batch size (4) and one miss bucket (4), so that each ranker compiles one
program of each kind.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from phoenix.engine.prefix_cache import PrefixCache
from phoenix.engine.production_prefix import (
    CANDIDATE_ONLY,
    HISTORY_FIELDS,
    USER_FIELDS,
    entry_bytes,
    entry_bytes_of,
)
from phoenix.engine.production_ranking import ProductionRanker
from phoenix.production import PostSequence, RankingInputs, init_params
from phoenix.production.config import ComputeDtype
from phoenix.production.examples import example_inputs
from phoenix.production.reference import bfloat16_step
from tests.unit.test_production_model import TINY

BATCH = 4
ENTRY = entry_bytes_of(TINY)  # float32: 2 x 2 layers x 256 x 1 x 64 x 4 + 256 bytes
# The engine's own rounding between programs of other batch sizes: float32 as the split's
# test (test_production_model.py); bfloat16 one step of each value (0 measured: bit-equal).
FLOAT32_TOL = 1e-5


def config_of(dtype: ComputeDtype):
    return dataclasses.replace(TINY, compute_dtype=dtype)


@pytest.fixture(scope="module")
def params():
    return init_params(TINY, seed=3, table_rows=TINY.hashes.num_rows)


@pytest.fixture(scope="module")
def plain(params):
    return {dtype: ProductionRanker(config_of(dtype), params) for dtype in ("float32", "bfloat16")}


def cached(params, dtype: ComputeDtype = "float32", budget: int = 2**30) -> ProductionRanker:
    store = PrefixCache(budget, ttl_s=600)
    return ProductionRanker(config_of(dtype), params, prefix_cache=store, miss_buckets=(BATCH,))


def requests(seed: int, history_lens, candidate_lens) -> RankingInputs:
    return example_inputs(TINY, len(history_lens), seed, history_lens, candidate_lens)


def rows_of(inputs: RankingInputs, picks) -> RankingInputs:
    """Requests ``picks`` of ``inputs`` (any order, repeats allowed)."""
    picked = np.asarray(picks)
    return jax.tree.map(lambda a: np.asarray(a)[picked], inputs)


def with_candidates(inputs: RankingInputs, seed: int) -> RankingInputs:
    """The same users and histories with other candidates (a next page)."""
    lens = np.random.default_rng(seed).integers(
        1, TINY.candidate_seq_len + 1, len(inputs.user.hashes)
    )
    other = requests(seed, [0] * len(lens), lens)
    return inputs._replace(candidates=other.candidates)


def assert_same_outputs(ours, theirs, inputs: RankingInputs, users: int, dtype: str) -> None:
    """Equal on every real candidate of the first ``users`` requests (padding's outputs are
    meaningless): float32 within 1e-5, bfloat16 within one step of each value."""
    real = np.asarray(inputs.candidates.post_hashes)[:users, :, 0] != 0  # [users, C]
    for name in ("log_probs", "logits", "continuous"):
        a = np.asarray(getattr(ours, name))[:users][real]
        b = np.asarray(getattr(theirs, name))[:users][real]
        if dtype == "float32":
            np.testing.assert_allclose(a, b, rtol=FLOAT32_TOL, atol=FLOAT32_TOL, err_msg=name)
        else:
            assert (np.abs(a - b) <= bfloat16_step(b)).all(), (name, np.abs(a - b).max())
    assert np.abs(np.asarray(ours.logits)[:users][real]).max() > 0.1  # not trivially small


def engaged(inputs: RankingInputs, user: int, seed: int) -> RankingInputs:
    """``inputs`` after ``user`` engaged with a new post: it enters the front of their
    history and the oldest post falls out."""
    post = requests(seed, [1], [0]).history  # one post, [1, H, ...]

    def push(old, new):
        rows = np.asarray(old).copy()
        rows[user] = np.concatenate([np.asarray(new)[0, :1], rows[user, :-1]])
        return rows

    return inputs._replace(history=jax.tree.map(push, inputs.history, post))


def test_the_key_covers_every_prefix_field_and_no_candidate_field(params):
    """A change to any one field the prefix reads changes that request's key and its prefix;
    a change to a candidate field, or to a history field only candidates read, changes
    neither. (Each changed field takes another request's value: the prefixes of all those
    variants come from one call of the prefix program.)"""
    ranker = cached(params)
    assert ranker.cached is not None
    base = requests(5, [254, 100], [8, 5])
    donors = requests(6, [254] * 6, [8] * 6)

    def changed(side: str, name: str) -> RankingInputs:
        """``base`` with field ``name`` of ``side`` of request 0 taken from a donor whose
        value differs (moved by one where none does)."""
        ours = np.asarray(getattr(getattr(base, side), name))
        theirs = np.asarray(getattr(getattr(donors, side), name))
        values = ours.copy()
        donor = [d for d in range(len(theirs)) if not np.array_equal(theirs[d], ours[0])]
        if donor:
            values[0] = theirs[donor[0]]
        else:  # every donor has our value (candidates' impression times): move it
            values[0] = ~ours[0] if ours.dtype == bool else ours[0] + 1
        part = getattr(base, side)._replace(**{name: values})
        return base._replace(**{side: part})

    key_of = lambda inputs: ranker.cached.keys(inputs, 2)  # noqa: E731
    before = key_of(base)
    assert before[0] != before[1]
    prefix_side = [("user", n) for n in USER_FIELDS] + [("history", n) for n in HISTORY_FIELDS]
    assert len(prefix_side) == 12 + 13  # every user field, every history field but stale
    variants = []
    for side, name in prefix_side:
        inputs = changed(side, name)
        after = key_of(inputs)
        assert after[0] != before[0] and after[1] == before[1], f"{side}.{name}"
        variants.append(inputs)
    for side, name in [("candidates", n) for n in PostSequence._fields] + [
        ("history", n) for n in CANDIDATE_ONLY
    ]:
        inputs = changed(side, name)
        assert key_of(inputs) == before, f"{side}.{name}"
        if side == "history":
            variants.append(inputs)
    # the prefixes: base's request 0, then each variant's, in one call
    batch = jax.tree.map(
        lambda *arrays: np.concatenate([np.asarray(a)[:1] for a in arrays]), base, *variants
    )
    entries = ranker.prefix(batch, ranker.programs.gather(ranker.table, batch))
    keys = np.asarray(entries.keys, np.float32)  # [L, 1 + variants, P, K, d]
    moved = [not np.array_equal(keys[:, 0], keys[:, 1 + i]) for i in range(len(variants))]
    assert moved == [True] * len(prefix_side) + [False] * len(CANDIDATE_ONLY)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_ragged_batches_mixing_hits_and_misses_answer_as_without_the_cache(params, plain, dtype):
    """First page: users a, b, c (ragged histories: full, across a block, empty) and a
    padding row. Next call: b's and a's next pages (hits), d (a miss), a again (one prefix
    for both rows). Every real candidate scores as the uncached ranker scores it."""
    ranker = cached(params, dtype)
    store, family = ranker.prefix_cache, ranker.cached
    assert store is not None and family is not None
    people = requests(7, [254, 131, 0, 37], [8, 3, 8, 1])  # a, b, c, d
    first = rows_of(people, [0, 1, 2, 0])  # the last row: padding (users=3)
    ours = ranker.rank_ids(first, users=3)
    assert_same_outputs(ours, plain[dtype].rank_ids(first), first, 3, dtype)
    assert (store.stats().misses, store.stats().hits, family.prefixes_computed) == (3, 0, 3)
    second = with_candidates(rows_of(people, [1, 0, 3, 0]), seed=8)
    ours = ranker.rank_ids(second)
    assert_same_outputs(ours, plain[dtype].rank_ids(second), second, BATCH, dtype)
    stats = store.stats()
    # b, a, a hit; d missed, computed once; nothing of the padding row kept
    assert (stats.hits, stats.misses, family.prefixes_computed) == (3, 3 + 1, 4)
    assert stats.entries == 4 and stats.bytes == 4 * entry_bytes_of(config_of(dtype))


def test_a_history_changed_by_an_event_is_a_miss_with_the_new_history_s_scores(params, plain):
    """The user engages with a post: it enters the front of the history (the oldest falls
    out), and the next request misses and scores as the uncached ranker does on the new
    history; the user's old prefix is never served for it."""
    ranker = cached(params)
    family = ranker.cached
    assert family is not None
    people = requests(9, [254, 60, 254, 10], [8, 8, 6, 2])
    ranker.rank_ids(people)
    assert ranker.prefix_cache is not None and ranker.prefix_cache.stats().misses == BATCH
    after = with_candidates(engaged(people, 0, seed=10), seed=11)
    ours = ranker.rank_ids(after)
    stats = ranker.prefix_cache.stats()
    assert (stats.misses, stats.hits, family.prefixes_computed) == (BATCH + 1, 3, BATCH + 1)
    assert_same_outputs(ours, plain["float32"].rank_ids(after), after, BATCH, "float32")
    stale = plain["float32"].rank_ids(after._replace(history=people.history))
    assert np.abs(np.asarray(ours.logits)[0] - np.asarray(stale.logits)[0]).max() > 1e-3


def test_more_users_than_fit_keep_the_budget_and_the_bytes_are_exact(params, plain):
    """A budget of 2.5 entries holds the 2 most recently used users; the others are evicted
    and, when they come back, miss and score as without the cache. Each entry holds exactly
    the bytes of its arrays, the formula's."""
    ranker = cached(params, budget=int(2.5 * ENTRY))
    store, family = ranker.prefix_cache, ranker.cached
    assert store is not None and family is not None
    people = requests(12, [254, 200, 3, 131, 90], [8, 2, 8, 8, 4])
    for user in range(5):  # one user a call, the rest of the batch padding
        ranker.rank_ids(rows_of(people, [user] * BATCH), users=1)
        stats = store.stats()
        assert stats.bytes <= store.budget and stats.entries == min(user + 1, 2)
    assert stats.evicted["budget"] == 3 and stats.bytes == 2 * ENTRY
    for key in store.keys():
        entry = store.peek(key)
        assert entry is not None
        assert entry_bytes(entry) == ENTRY == sum(a.size * a.dtype.itemsize for a in entry)
    again = rows_of(people, [0, 4, 0, 0])  # user 0 evicted (a miss), user 4 held (a hit)
    ours = ranker.rank_ids(again, users=2)
    assert_same_outputs(ours, plain["float32"].rank_ids(again), again, 2, "float32")
    stats = store.stats()
    assert (stats.misses, stats.hits, stats.entries, family.prefixes_computed) == (6, 1, 2, 6)


def test_bad_calls_are_refused_before_the_cache_changes(params):
    ranker = cached(params)
    people = requests(13, [10] * BATCH, [2] * BATCH)
    with pytest.raises(ValueError, match=r"users must be in 1\.\.4, got 5"):
        ranker.rank_ids(people, users=5)
    outside = np.asarray(people.history.post_hashes).copy()
    outside[2, 0, 0] = TINY.hashes.num_rows
    bad = people._replace(history=people.history._replace(post_hashes=outside))
    with pytest.raises(ValueError, match="history.post_hashes: rows must lie"):
        ranker.rank_ids(bad)
    assert ranker.prefix_cache is not None
    assert (ranker.prefix_cache.stats().misses, ranker.prefix_cache.stats().entries) == (0, 0)
    no_table = {k: v for k, v in params.items() if k != "emb_table"}
    with pytest.raises(ValueError, match="emb_table"):
        ProductionRanker(TINY, no_table, prefix_cache=PrefixCache(2**20, 60))


def test_warm_up_compiles_without_touching_the_cache(params):
    """Warm-up runs the prefix program per miss bucket and the candidates' per batch size on
    all-padding batches: nothing is looked up or kept, and a first call compiles nothing."""
    ranker = cached(params)
    assert ranker.cached is not None and ranker.prefix_cache is not None
    assert ranker.cached.warm_up([BATCH], candidates=TINY.candidate_seq_len) == 2
    stats = ranker.prefix_cache.stats()
    assert (stats.hits, stats.misses, stats.entries, ranker.cached.prefixes_computed) == (
        0,
        0,
        0,
        0,
    )
    programs = ranker.cached.programs
    sizes = [programs.prefix_entries._cache_size(), programs.candidates._cache_size()]
    ranker.rank_ids(requests(14, [254, 1, 0, 30], [8, 8, 1, 2]))
    assert [programs.prefix_entries._cache_size(), programs.candidates._cache_size()] == sizes
