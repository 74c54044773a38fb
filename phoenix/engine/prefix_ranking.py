"""The original ranker with a prefix cache across requests: the family-specific part of the
cache (the store is ``prefix_cache``).

The prefix of the original ranker is the user token and the ``history_seq_len`` history tokens
(``T = 1 + S``); the candidates' pass reads, of the prefix, each layer's keys and values and
which context tokens are valid (``DeviceRanker.score_candidates``). That is an entry
(``PrefixEntry``), and everything the prefix pass reads is in its key: the user id, and the
digest of the batch's rows of ``PREFIX_FIELDS`` after padding and truncation to
``history_seq_len`` (the prefix programs take those arrays and nothing else, so no input of the
prefix can be left out of the key).

``PrefixCachedRanker.rank`` takes the ranker's padded request batch, as ``DeviceRanker.rank``
does, and per call runs:

1. on the host: a key per real row, and a lookup (hits and misses; a prefix that two rows of
   the batch share is computed once);
2. the misses only, padded to their own batch bucket: the ``ranker_prefix_hash`` program (the
   user and history ids hashed, in int64) and ``ranker_prefix`` (lookups, the context pass):
   one entry per user, stored;
3. the whole batch: ``ranker_candidate_hash`` and ``ranker_candidates``: the rows' entries
   (hits and fresh misses; padding rows borrow row 0's) stacked inside the program, every
   candidate attending to its user's cached keys and values and to itself, then the blend and
   the sort of ``DeviceRanker.rank``.

The entries never leave the device: step 2's outputs are step 3's inputs, on a GPU in device
memory, on a CPU in host memory. The joint pass (``DeviceRanker.runs_joint``: context and
candidates as one sequence) is never taken here: it computes the context with the
candidates, which a hit must not do. Scores equal ``DeviceRanker.rank``'s within float
rounding (the context runs in another program shape: tests/unit/test_prefix_ranking.py).

Shape glossary
  B  users (a batch bucket)   m  misses (a batch bucket)   C  candidates
  S  history_seq_len   T  1 + S   L  layers   K  key/value heads   d  key_size
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import jax.numpy as jnp
import numpy as np

from phoenix.engine.batching import bucket_for, pad_axis
from phoenix.engine.prefix_cache import PrefixCache, PrefixKey, entries_of_rows, row_digests
from phoenix.engine.programs import Program, prepare_all
from phoenix.engine.ranking_inputs import (
    RankedBatch,
    context_inputs,
    hash_on_device,
    ranked_outputs,
    table_lookup,
)


class CachedEngine(Protocol):
    """What the cache needs of the ranker it serves (``device_ranking.DeviceRanker``, which
    builds this class: imports go one way)."""

    weights: Any
    store: Any
    settings: Any
    entities: Any
    batch_buckets: Any
    candidate_buckets: Any

    def context_cache(self, *args: Any, **kwargs: Any) -> Any: ...

    def score_candidates(self, *args: Any, **kwargs: Any) -> Any: ...

    def candidate_inputs(self, *args: Any, **kwargs: Any) -> Any: ...


# Every batch field the prefix reads, hashed into its key and given to its programs.
PREFIX_IDS = ("user_id", "history_post_ids", "history_author_ids")  # int64, hashed on device
PREFIX_FEATURES = ("history_actions", "history_product_surface", "history_dwell_seconds")
PREFIX_FIELDS = PREFIX_IDS + PREFIX_FEATURES
CANDIDATE_IDS = ("candidate_post_ids", "candidate_author_ids")  # int64, hashed on device
CANDIDATE_FEATURES = ("candidate_product_surface", "candidate_post_age_seconds")


class PrefixEntry(NamedTuple):
    """One user's prefix as the candidates' pass reads it (``kernels.candidate_layers``)."""

    keys: Any  # [L, K, d, T] compute dtype: each layer's keys
    values: Any  # [L, K, T, d] compute dtype: each layer's values
    mask: Any  # [T] bool: the valid context tokens


def entry_bytes(entry: PrefixEntry) -> int:
    """The memory an entry holds (on the device it lives on)."""
    return sum(int(array.nbytes) for array in entry)


def prefix_rows(batch, rows: Sequence[int], size: int) -> dict[str, np.ndarray]:
    """PREFIX_FIELDS of ``rows`` of a padded batch, zero-padded to ``size`` users."""
    picked = np.asarray(rows, np.intp)
    return {name: pad_axis(getattr(batch, name)[picked], 0, size) for name in PREFIX_FIELDS}


def candidate_inputs(batch) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray]]:
    """(the candidate ids to hash, the candidate features and ``age_sent``) of a batch."""
    features = {name: getattr(batch, name) for name in CANDIDATE_FEATURES}
    features["age_sent"] = batch.sent["candidate_post_age_seconds"]  # [B] bool
    return tuple(getattr(batch, name) for name in CANDIDATE_IDS), features


class PrefixCachedRanker:
    """``DeviceRanker.rank`` with the users' prefixes kept in ``cache`` across calls."""

    def __init__(self, ranker: CachedEngine, cache: PrefixCache):
        if "table" not in ranker.weights:
            raise ValueError("PrefixCachedRanker needs a DeviceRanker that ranks raw ids")
        self.ranker = ranker
        self.cache = cache
        store = ranker.store
        dtype = {"dtype": ranker.settings["dtype"]}
        self._prefix_hash = Program("ranker_prefix_hash", self._prefix_hash_fn, store, x64=True)
        self._prefix = Program("ranker_prefix", self._prefix_fn, store, settings=dtype)
        self._candidate_hash = Program(
            "ranker_candidate_hash", self._candidate_hash_fn, store, x64=True
        )
        # the candidates' pass never runs joint: joint_rows does not shape it
        settings = {k: v for k, v in ranker.settings.items() if k != "joint_rows"}
        self._candidates = Program(
            "ranker_candidates", self._candidates_fn, store, settings=settings
        )
        self.prefixes_computed = 0  # users whose prefix a call computed (misses, once each)
        self.bookkeeping_s = 0.0  # host time spent on keys, lookups and stores

    # -- programs ------------------------------------------------------------------------

    def _prefix_hash_fn(self, users, history_posts, history_authors):
        e = self.ranker.entities
        assert e is not None  # checked in __init__: the ranker ranks raw ids
        return {
            "user": hash_on_device(users[:, None], e["user"]),  # [m, 1, nU]
            "history_post": hash_on_device(history_posts, e["item"]),  # [m, S, nI]
            "history_author": hash_on_device(history_authors, e["author"]),  # [m, S, nA]
        }

    def _prefix_fn(self, weights, hashed, features: dict) -> tuple[PrefixEntry, ...]:
        context, context_emb = context_inputs(hashed, features, table_lookup(weights["table"]))
        cache, mask = self.ranker.context_cache(weights, context, context_emb)
        keys = jnp.stack([k for k, _ in cache], axis=1)  # [m, L, K, d, T]
        values = jnp.stack([v for _, v in cache], axis=1)  # [m, L, K, T, d]
        return tuple(PrefixEntry(keys[i], values[i], mask[i]) for i in range(mask.shape[0]))

    def _candidate_hash_fn(self, candidate_posts, candidate_authors):
        e = self.ranker.entities
        assert e is not None
        return {
            "candidate_post": hash_on_device(candidate_posts, e["item"]),  # [B, C, nI]
            "candidate_author": hash_on_device(candidate_authors, e["author"]),  # [B, C, nA]
        }

    def _candidates_fn(self, weights, entries: tuple[PrefixEntry, ...], hashed, features: dict):
        keys = jnp.stack([entry.keys for entry in entries])  # [B, L, K, d, T]
        values = jnp.stack([entry.values for entry in entries])  # [B, L, K, T, d]
        mask = jnp.stack([entry.mask for entry in entries])  # [B, T]
        cache = [(keys[:, layer], values[:, layer]) for layer in range(keys.shape[1])]
        candidates = self.ranker.candidate_inputs(hashed, features, table_lookup(weights["table"]))
        logits, _ = self.ranker.score_candidates(
            weights, cache, mask, candidates, model_padding=False
        )
        return ranked_outputs(logits, candidates.valid, weights["blend"])

    # -- host side ---------------------------------------------------------------------------

    def keys(self, batch, rows: int) -> list[PrefixKey]:
        """The cache keys of the first ``rows`` rows of a padded batch."""
        digests = row_digests([getattr(batch, name) for name in PREFIX_FIELDS], rows)
        return [self.cache.key(user, digest) for user, digest in zip(batch.user_id, digests)]

    def rank(self, batch, rows: int) -> RankedBatch:
        """``DeviceRanker.rank`` of a padded batch whose first ``rows`` rows are users (the
        rest padding, never looked up nor kept)."""
        if not 0 < rows <= len(batch.user_id):
            raise ValueError(f"rank: rows must be in 1..{len(batch.user_id)}, got {rows}")
        started = time.perf_counter()
        keys = self.keys(batch, rows)
        self.bookkeeping_s += time.perf_counter() - started
        stacked, spent = entries_of_rows(
            self.cache,
            keys,
            lambda missing: self._compute_prefixes(batch, missing),
            entry_bytes,
            len(batch.user_id),
        )
        self.bookkeeping_s += spent
        ids, features = candidate_inputs(batch)
        hashed = self._candidate_hash(*ids)
        order, scores, probs = self._candidates(self.ranker.weights, stacked, hashed, features)
        return RankedBatch(np.asarray(order), np.asarray(scores), np.asarray(probs))

    def _compute_prefixes(self, batch, rows: list[int]) -> tuple[PrefixEntry, ...]:
        """The entries of ``rows`` of a batch, in one call of the prefix programs padded to a
        batch bucket."""
        size = bucket_for(len(rows), self.ranker.batch_buckets)
        started = time.perf_counter()
        prefix = prefix_rows(batch, rows, size)
        self.bookkeeping_s += time.perf_counter() - started
        hashed = self._prefix_hash(*(prefix[name] for name in PREFIX_IDS))
        features = {name: prefix[name] for name in PREFIX_FEATURES}
        self.prefixes_computed += len(rows)
        return self._prefix(self.ranker.weights, hashed, features)[: len(rows)]

    def warm_up(self, empty_batch: Callable[[int, int], Any]) -> int:
        """Load (or compile) the prefix programs for every batch bucket and the candidates'
        for every (batch bucket, candidate bucket), from shapes alone: nothing runs.
        ``empty_batch(users, candidates)`` is an all-padding request batch of that shape.
        Returns how many (batch, candidate) buckets."""
        ranker = self.ranker
        weights = ranker.weights
        narrowest = ranker.candidate_buckets[0]
        prefixes = [
            prefix_rows(empty_batch(users, narrowest), range(users), users)
            for users in ranker.batch_buckets
        ]
        id_args = [tuple(p[name] for name in PREFIX_IDS) for p in prefixes]
        prepare_all([(self._prefix_hash, args) for args in id_args])
        prefix_args = [
            (weights, self._prefix_hash.output_shapes(*args), {n: p[n] for n in PREFIX_FEATURES})
            for args, p in zip(id_args, prefixes)
        ]
        prepare_all([(self._prefix, args) for args in prefix_args])
        entry = self._prefix.output_shapes(*prefix_args[0])[0]
        shapes = [(u, w) for u in ranker.batch_buckets for w in ranker.candidate_buckets]
        batches = [candidate_inputs(empty_batch(users, width)) for users, width in shapes]
        prepare_all([(self._candidate_hash, ids) for ids, _ in batches])
        candidate_args = [
            (weights, (entry,) * users, self._candidate_hash.output_shapes(*ids), features)
            for (users, _), (ids, features) in zip(shapes, batches)
        ]
        prepare_all([(self._candidates, args) for args in candidate_args])
        return len(shapes)
