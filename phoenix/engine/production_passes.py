"""The production ranker's two serving passes as pure functions: the prefix once per request,
then the candidates (the ranker of ``production_ranking`` and the per-user cache of
``production_prefix`` both run them). Imports jax, numpy and ``phoenix.production`` only.

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

from typing import NamedTuple

import jax

from phoenix.production.config import ProductionConfig
from phoenix.production.features import candidate_tokens, prefix_tokens
from phoenix.production.inputs import HashedRows, RankingInputs
from phoenix.production.model import (
    RankingOutputs,
    candidate_positions,
    heads,
    prefix_key_ok,
    prefix_positions,
)
from phoenix.production.params import (
    LayerStack,
    ProductionWeights,
)
from phoenix.production.transformer import (
    OwnKeys,
    attend,
    attention_heads,
    finish_layer,
    rope_rotation,
)


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
