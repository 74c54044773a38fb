"""The production ranker with a prefix cache across requests: the production family's part of
the cache (the store is ``prefix_cache``, the original family's part ``prefix_ranking``).

The production prefix is the user token, the user-features token and the history (P = 2 + H
tokens); the candidate pass reads, of it, each layer's keys and values and which prefix keys
a candidate may attend to (``production_passes.PrefixCache``). An entry is one user's rows of
those arrays (``PrefixEntry``), and its key covers everything the prefix reads:

- the user's hashes and IP hashes and every profile feature (every field of
  ``UserFeatures``);
- every field of the history (``PostSequence``) the prefix reads: post and author hashes,
  surfaces, impression and creation times, timezone, hour, both follow flags, engagement
  counts, semantic ids, actions, dwell; all but ``stale``, which only candidates read
  (``CANDIDATE_ONLY``);
- the hashed embedding rows through the table: a function of the hashes and the served
  artifact, which the store's version label names.

The key is (the store's version label, the user's first hash row, the sha256 of the row's
bytes of every field above: ``prefix_cache.row_digests``); tests/unit/test_production_prefix.py
checks that a change to any one of these fields changes the key and a change to a candidate
field does not, and that the fields left out leave the prefix as it is.

``ProductionPrefixRanker.rank_ids`` takes ``ProductionRanker.rank_ids``'s batch and per call
runs:

1. on the host: a key per real row, and a lookup (a prefix two rows of the batch share is
   computed once);
2. the misses only, padded to a batch bucket (``miss_buckets``): the ``prefix_entries``
   program (the user and history rows gathered from the table, the prefix pass) returns one
   entry per user, stored;
3. the whole batch: the ``candidates`` program stacks the rows' entries (hits and fresh
   misses; padding rows borrow row 0's) into a ``PrefixCache`` and runs the candidate pass
   against it, the candidates' rows gathered from the table.

Each program gets only its side of the batch: the prefix programs the candidates cut to width
0, the candidates' program the history cut to width 0, so neither is compiled per width of the
other and a hit never gathers history rows. The entries stay on the device. Outputs equal
``ProductionRanker.rank_ids``'s within the engine's float rounding (the prefix runs in
programs of another batch size).

Shapes: L layers, B requests, m misses (a bucket), P prefix tokens, C candidates, K key/value
heads, d key size.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine.batching import DEFAULT_BATCH_BUCKETS, batch_slices, pad_axis
from phoenix.engine.prefix_cache import PrefixCache as PrefixStore
from phoenix.engine.prefix_cache import PrefixKey, entries_of_rows, row_digests
from phoenix.engine.production_passes import PrefixCache, prefix, score_candidates
from phoenix.production.config import ProductionConfig
from phoenix.production.examples import example_inputs
from phoenix.production.hashing import check_rows_in_table, gather_rows
from phoenix.production.inputs import PostSequence, RankingInputs, UserFeatures
from phoenix.production.model import RankingOutputs, compiler_options

# The history fields only candidates read: left out of the key (a change to them leaves the
# prefix as it is: a key that covered them would only miss more).
CANDIDATE_ONLY = ("stale",)
USER_FIELDS = UserFeatures._fields
HISTORY_FIELDS = tuple(name for name in PostSequence._fields if name not in CANDIDATE_ONLY)


class PrefixEntry(NamedTuple):
    """One user's rows of ``production_passes.PrefixCache``."""

    keys: jax.Array  # [L, P, K, d] compute dtype
    values: jax.Array  # [L, P, K, d]
    key_ok: jax.Array  # [P] bool


def entry_bytes(entry: PrefixEntry) -> int:
    """The memory an entry holds (on the device it lives on)."""
    return sum(int(array.nbytes) for array in entry)


def entry_bytes_of(config: ProductionConfig) -> int:
    """The bytes an entry of ``config`` holds: keys and values of P tokens per layer, and P
    flags."""
    c = config
    width = jnp.dtype(c.compute_dtype).itemsize
    return 2 * c.num_layers * c.prefix_len * c.num_kv_heads * c.key_size * width + c.prefix_len


def prefix_arrays(inputs: RankingInputs) -> list[np.ndarray]:
    """Every array the prefix reads, [B, ...] each, in a fixed order (the key's digest)."""
    user = [np.asarray(getattr(inputs.user, name)) for name in USER_FIELDS]
    return user + [np.asarray(getattr(inputs.history, name)) for name in HISTORY_FIELDS]


def cut(sequence: PostSequence, rows: Optional[int] = None) -> PostSequence:
    """``sequence`` of width 0 (``rows`` requests: its own by default): its dtypes and
    trailing shapes, no post."""
    shape = lambda a: (len(a) if rows is None else rows, 0) + np.shape(a)[2:]  # noqa: E731
    return PostSequence._make(np.zeros(shape(a), a.dtype) for a in sequence)


def take_rows(inputs: RankingInputs, rows: Sequence[int], size: int) -> RankingInputs:
    """The user and history of ``rows`` zero-padded to ``size`` requests; no candidates."""
    picked = np.asarray(rows, np.intp)
    take = lambda a: pad_axis(np.asarray(a)[picked], 0, size)  # noqa: E731
    user = UserFeatures._make(take(a) for a in inputs.user)
    history = PostSequence._make(take(a) for a in inputs.history)
    return RankingInputs(user, history, cut(inputs.candidates, size))


def _prefix_entries(weights, table, inputs: RankingInputs, config) -> tuple[PrefixEntry, ...]:
    """One entry per request of ``inputs`` (candidates of width 0)."""
    cache = prefix(weights, inputs, gather_rows(table, inputs), config)  # [L, m, P, K, d]
    return tuple(
        PrefixEntry(cache.keys[:, i], cache.values[:, i], cache.key_ok[i])
        for i in range(cache.key_ok.shape[0])
    )


def _candidates(weights, table, entries: tuple[PrefixEntry, ...], inputs: RankingInputs, config):
    """The candidates of ``inputs`` (history of width 0) against the entries, one a request."""
    cache = PrefixCache(
        jnp.stack([e.keys for e in entries], axis=1),  # [L, B, P, K, d]
        jnp.stack([e.values for e in entries], axis=1),  # [L, B, P, K, d]
        jnp.stack([e.key_ok for e in entries]),  # [B, P]
    )
    return score_candidates(weights, cache, inputs, gather_rows(table, inputs), config)


class CachedPrograms(NamedTuple):
    prefix_entries: Callable  # (weights, table, inputs) -> tuple[PrefixEntry, ...]
    candidates: Callable  # (weights, table, entries, inputs) -> RankingOutputs


@functools.lru_cache(maxsize=8)
def cached_programs(config: ProductionConfig) -> CachedPrograms:
    """The jitted programs of ``config``, compiled to round as X's program does (shared by
    every ranker of that config)."""
    options = compiler_options()
    jit = lambda f: jax.jit(functools.partial(f, config=config), compiler_options=options)  # noqa: E731
    return CachedPrograms(jit(_prefix_entries), jit(_candidates))


class CachedProductionRanker(Protocol):
    """What the cache needs of the ranker it serves (``production_ranking.ProductionRanker``,
    which builds this class: imports go one way)."""

    config: ProductionConfig
    weights: Any
    table: Any


class ProductionPrefixRanker:
    """``ProductionRanker.rank_ids`` with the users' prefixes kept in ``cache`` across calls."""

    def __init__(
        self,
        ranker: CachedProductionRanker,
        cache: PrefixStore,
        miss_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    ):
        if ranker.table is None:
            raise ValueError("a prefix cache needs the parameters' 'emb_table' (rank_ids)")
        if not miss_buckets or min(miss_buckets) < 1:
            raise ValueError(f"miss_buckets: batch sizes >= 1 expected, got {miss_buckets}")
        self.ranker = ranker
        self.cache = cache
        self.miss_buckets = tuple(sorted(set(miss_buckets)))
        self.programs = cached_programs(ranker.config)
        self.prefixes_computed = 0  # users whose prefix a call computed (misses, once each)
        self.bookkeeping_s = 0.0  # host time spent on keys, lookups, the misses' rows, stores

    def keys(self, inputs: RankingInputs, users: int) -> list[PrefixKey]:
        """The cache keys of the first ``users`` requests of a batch."""
        digests = row_digests(prefix_arrays(inputs), users)
        first_hashes = np.asarray(inputs.user.hashes)[:users, 0]
        return [self.cache.key(int(h), digest) for h, digest in zip(first_hashes, digests)]

    def rank_ids(self, inputs: RankingInputs, users: Optional[int] = None) -> RankingOutputs:
        """``ProductionRanker.rank_ids`` of a batch whose first ``users`` requests (None: all)
        are users; the rest are padding, never looked up nor kept (their outputs are
        meaningless)."""
        table = self.ranker.table
        assert table is not None  # checked in __init__
        batch = int(np.shape(inputs.user.hashes)[0])
        users = batch if users is None else users
        if not 0 < users <= batch:
            raise ValueError(f"rank_ids: users must be in 1..{batch}, got {users}")
        check_rows_in_table(inputs, table.shape[0])
        started = time.perf_counter()
        keys = self.keys(inputs, users)
        self.bookkeeping_s += time.perf_counter() - started
        stacked, spent = entries_of_rows(
            self.cache,
            keys,
            lambda missing: self._compute_prefixes(inputs, missing),
            entry_bytes,
            batch,
        )
        self.bookkeeping_s += spent
        candidates_only = inputs._replace(history=cut(inputs.history))
        return self.programs.candidates(self.ranker.weights, table, stacked, candidates_only)

    def _compute_prefixes(self, inputs: RankingInputs, rows: list[int]) -> list[PrefixEntry]:
        """The entries of ``rows`` of a batch: the prefix program once per slice of at most
        the largest miss bucket, each padded to its bucket."""
        entries: list[PrefixEntry] = []
        for part, size in batch_slices(len(rows), self.miss_buckets):
            started = time.perf_counter()
            picked = take_rows(inputs, rows[part], size)
            self.bookkeeping_s += time.perf_counter() - started
            fresh = self.programs.prefix_entries(self.ranker.weights, self.ranker.table, picked)
            entries.extend(fresh[: len(rows[part])])
        self.prefixes_computed += len(rows)
        return entries

    def warm_up(self, batch_sizes: Sequence[int], candidates: Optional[int] = None) -> int:
        """Compile the prefix program for every miss bucket and the candidates' for every
        batch size (``candidates`` wide: the config's by default), running each once on
        all-padding inputs; the cache is not touched. Returns how many programs."""
        config = self.ranker.config
        width = config.candidate_seq_len if candidates is None else candidates
        weights, table = self.ranker.weights, self.ranker.table
        empty = lambda b: padding_inputs(config, b, width)  # noqa: E731
        entry = None
        for size in self.miss_buckets:
            entry = self.programs.prefix_entries(weights, table, take_rows(empty(size), [], size))
        assert entry is not None
        for size in batch_sizes:
            inputs = empty(size)
            stacked = (entry[0],) * size
            candidates_only = inputs._replace(history=cut(inputs.history))
            self.programs.candidates(weights, table, stacked, candidates_only)
        return len(self.miss_buckets) + len(batch_sizes)


def padding_inputs(config: ProductionConfig, batch: int, candidates: int) -> RankingInputs:
    """An all-padding batch (every id 0, every feature 0) of ``batch`` requests."""
    shaped = example_inputs(config, batch, history_lens=[0] * batch, candidate_lens=[0] * batch)
    zero = lambda a: np.zeros_like(a)  # noqa: E731
    return RankingInputs(
        UserFeatures._make(zero(a) for a in shaped.user),
        PostSequence._make(zero(a) for a in shaped.history),
        PostSequence._make(
            pad_axis(zero(a)[:, :candidates], 1, candidates) for a in shaped.candidates
        ),
    )
