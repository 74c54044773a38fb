"""The production ranker's serving forward: the prefix once per request, then the candidates.

In X's production ranker no query attends to a candidate except the candidate itself (the
serving kernel's key set: ``phoenix.production.model``), so the prefix (user token,
user-features token, history: P = 2 + H tokens) does not depend on the candidates:

1. ``prefix_pass`` runs the prefix through every layer and returns its keys and values per
   layer (``PrefixCache``), with the keys its queries and every candidate may attend to;
2. ``candidate_pass`` runs the candidates, each attending to the cached prefix keys (one
   batched matmul) and to its own key (an elementwise product), never to another candidate.

The cache is a value returned by one pass and taken by the other, so a per-user cache across
requests can hold it (a user's row of each array). The outputs equal the plain full-sequence
forward (``phoenix.production.forward``) within float rounding: exactly in float32
(``tests/unit/test_production_model.py``).

Shapes: L layers, B requests, P prefix tokens, C candidates, K key/value heads, d key size.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np

from phoenix.engine.batching import DEFAULT_BATCH_BUCKETS
from phoenix.engine.prefix_cache import PrefixCache as PrefixStore
from phoenix.production.config import ProductionConfig
from phoenix.production.features import candidate_tokens, prefix_tokens
from phoenix.production.hashing import check_rows_in_table, gather_rows
from phoenix.production.inputs import HashedRows, RankingInputs
from phoenix.production.model import (
    RankingOutputs,
    candidate_positions,
    compiler_options,
    heads,
    prefix_key_ok,
    prefix_positions,
)
from phoenix.production.params import (
    LayerStack,
    ProductionWeights,
    device_table,
    device_weights,
)
from phoenix.production.transformer import (
    OwnKeys,
    attend,
    attention_heads,
    finish_layer,
    rope_rotation,
)

if TYPE_CHECKING:  # production_prefix imports this module
    from phoenix.engine.production_prefix import ProductionPrefixRanker


class PrefixCache(NamedTuple):
    """What candidates need of a prefix: per layer its keys and values, and which keys a
    candidate attends to."""

    keys: jax.Array  # [L, B, P, K, d] after qk-norm and RoPE, compute dtype
    values: jax.Array  # [L, B, P, K, d]
    key_ok: jax.Array  # [B, P] bool


def prefix_pass(
    layers: LayerStack, tokens: jax.Array, prefix_ok: jax.Array, config: ProductionConfig
) -> PrefixCache:
    """tokens [B, P, D] (scaled), prefix_ok [B, P] bool (real tokens) -> the cache."""
    key_ok = prefix_key_ok(prefix_ok, config)  # [B, P]
    rotation = rope_rotation(
        prefix_positions(prefix_ok, config), config.key_size, config.rope_base_exponent
    )

    def layer(h, w):
        q, k, v = attention_heads(h, w, rotation, config)
        attention = attend(
            q, k, v, key_ok[:, None, :], prefix_ok, config.attention_scale, config.attention_block
        )
        return finish_layer(h, attention, w, config), (k, v)

    _, (keys, values) = jax.lax.scan(layer, tokens, layers)
    return PrefixCache(keys, values, key_ok)


def candidate_pass(
    layers: LayerStack,
    cache: PrefixCache,
    tokens: jax.Array,
    candidate_ok: jax.Array,
    config: ProductionConfig,
) -> jax.Array:
    """tokens [B, C, D] (scaled), candidate_ok [B, C] -> final hidden states [B, C, D]."""
    rotation = rope_rotation(
        candidate_positions(candidate_ok, config), config.key_size, config.rope_base_exponent
    )
    allowed = cache.key_ok[:, None, :]  # [B, 1, P]

    def layer(h, xs):
        w, prefix_keys, prefix_values = xs
        q, k, v = attention_heads(h, w, rotation, config)
        own = OwnKeys(k, v, candidate_ok, round_weight=config.attention_keys == "exact")
        attention = attend(
            q, prefix_keys, prefix_values, allowed, candidate_ok, config.attention_scale,
            config.attention_block, own=own,
        )  # fmt: skip
        return finish_layer(h, attention, w, config), None

    h, _ = jax.lax.scan(layer, tokens, (layers, cache.keys, cache.values))
    return h


def prefix(
    w: ProductionWeights, inputs: RankingInputs, rows: HashedRows, config: ProductionConfig
) -> PrefixCache:
    """The prefix's cache from features and gathered rows."""
    tokens, prefix_ok = prefix_tokens(w, inputs, rows, config)
    return prefix_pass(w.layers, tokens, prefix_ok, config)


def score_candidates(
    w: ProductionWeights,
    cache: PrefixCache,
    inputs: RankingInputs,
    rows: HashedRows,
    config: ProductionConfig,
) -> RankingOutputs:
    """The candidates of ``inputs`` against a prefix's cache."""
    tokens, candidate_ok = candidate_tokens(w, inputs, rows, config)
    h = candidate_pass(w.layers, cache, tokens, candidate_ok, config)
    return heads(h, w, inputs.candidates.product_surface, config)


def rank(
    w: ProductionWeights, inputs: RankingInputs, rows: HashedRows, config: ProductionConfig
) -> RankingOutputs:
    """Both passes in one function (one program when jitted so)."""
    return score_candidates(w, prefix(w, inputs, rows, config), inputs, rows, config)


class Programs(NamedTuple):
    """The jitted passes of one config: the weights are arguments, so every ranker of that
    config shares them (and their compiled programs, one per input shape)."""

    prefix: Callable
    score_candidates: Callable
    gather: Callable


@functools.lru_cache(maxsize=8)
def programs(config: ProductionConfig) -> Programs:
    """The jitted passes for ``config``, compiled to round as X's program does."""
    options = compiler_options()
    jit = lambda f: jax.jit(functools.partial(f, config=config), compiler_options=options)  # noqa: E731
    return Programs(jit(prefix), jit(score_candidates), jax.jit(gather_rows))


class ProductionRanker:
    """The serving forward over weights resident on the device.

    ``rank(inputs, rows)`` from gathered rows runs the two passes, ``prefix`` then
    ``score_candidates``, as two programs with the ``PrefixCache`` between them;
    ``rank_ids(inputs)`` gathers the rows from the parameters' ``emb_table`` first. With a
    ``prefix_cache`` (a ``prefix_cache.PrefixCache`` store), ``rank_ids`` keeps each user's
    rows of the ``PrefixCache`` in it across calls and computes only the misses' prefixes,
    padded to ``miss_buckets`` (``production_prefix``); ``rank`` never uses it (the rows it
    is given come from the caller, which no key covers).
    """

    def __init__(
        self,
        config: ProductionConfig,
        params: Mapping[str, np.ndarray],
        *,
        prefix_cache: Optional[PrefixStore] = None,
        miss_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    ):
        self.config = config
        self.weights = device_weights(params, config)
        self.table = device_table(params, config) if "emb_table" in params else None
        self.programs = programs(config)
        self.prefix_cache = prefix_cache
        self.cached: Optional[ProductionPrefixRanker] = None
        if prefix_cache is not None:
            from phoenix.engine.production_prefix import ProductionPrefixRanker

            self.cached = ProductionPrefixRanker(self, prefix_cache, miss_buckets)

    def rank(self, inputs: RankingInputs, rows: HashedRows) -> RankingOutputs:
        return self.score_candidates(self.prefix(inputs, rows), inputs, rows)

    def rank_ids(self, inputs: RankingInputs, users: Optional[int] = None) -> RankingOutputs:
        """Rank with the rows of the parameters' table; a hash outside it is refused, named.
        With a prefix cache, the first ``users`` requests (None: all) are users whose
        prefixes it keeps, the rest padding."""
        if self.table is None:
            raise ValueError("the parameters hold no 'emb_table': call rank with gathered rows")
        if self.cached is not None:
            return self.cached.rank_ids(inputs, users)
        check_rows_in_table(inputs, self.table.shape[0])
        return self.rank(inputs, self.programs.gather(self.table, inputs))

    def prefix(self, inputs: RankingInputs, rows: HashedRows) -> PrefixCache:
        return self.programs.prefix(self.weights, inputs, rows)

    def score_candidates(
        self, cache: PrefixCache, inputs: RankingInputs, rows: HashedRows
    ) -> RankingOutputs:
        return self.programs.score_candidates(self.weights, cache, inputs, rows)
