"""Positions, attention key sets, output heads and the plain full-sequence forward.

The sequence is [user token, user-features token, history (H), candidates (C)]: the prefix
P = 2 + H tokens, then C candidates. Right-anchored RoPE: the last real history token sits at
P - 1 whatever the history's length, every candidate at P, padding at 0.

Which keys a query attends to (``ProductionConfig.attention_keys``):

- ``serving_kernel`` (default): what X's serving kernel (``mha_inference_gqa``) computes. It
  masks padded queries only: a real query attends to every key in the 128-wide key blocks up
  to the last block that holds a real prefix token, padded history keys in that block
  included; a candidate also attends to itself, never to another candidate.
- ``exact``: the real prefix tokens only (and itself, for a candidate), as X's training
  kernel masks them (which also rounds the own key's weight like the others').

``forward`` runs the whole sequence at once with one [T, T] key mask: the plain reference the
serving engine (``phoenix/engine/production_ranking.py``: the prefix once, then the
candidates against it) is checked against.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from phoenix.production.config import DWELL_TIME
from phoenix.production.features import candidate_tokens, prefix_tokens
from phoenix.production.inputs import Array, HashedRows, RankingInputs
from phoenix.production.params import ProductionWeights
from phoenix.production.transformer import (
    OwnKeys,
    attend,
    attention_heads,
    finish_layer,
    rms_norm,
    rope_rotation,
)

# Compile the forward so that every operation in the compute dtype rounds its result, as each
# of X's operations does: XLA otherwise keeps float32 between fused bfloat16 operations, which
# moved half of the tokens by a bfloat16 step from X's. On CPUs, XLA's YNNPACK fusions (a dot
# with the additions around it) skip those roundings too and moved 40% of the candidate
# tokens: the CPU programs leave them out.
STRICT_ROUNDING = {"xla_allow_excess_precision": False}
CPU_STRICT_ROUNDING = {**STRICT_ROUNDING, "xla_cpu_experimental_ynn_fusion_type": ""}


def compiler_options(backend: str | None = None) -> dict:
    """The options that make XLA round as X's program does, for ``backend`` (the default
    backend when None)."""
    backend = backend or jax.default_backend()
    return dict(CPU_STRICT_ROUNDING if backend == "cpu" else STRICT_ROUNDING)


class RankingOutputs(NamedTuple):
    """Per candidate: [B, C, ...] float32 (padding candidates' rows are meaningless)."""

    log_probs: jax.Array  # [B, C, A] log sigmoid of the action logits
    logits: jax.Array  # [B, C, A]
    continuous: jax.Array  # [B, C, N] continuous heads (dwell routed by surface)


def prefix_positions(prefix_ok: jax.Array, config) -> jax.Array:
    """[B, P] float32 RoPE positions: user tokens at their index, history right-anchored (the
    last of n real posts at P - 1, the first at P - n), padding at 0."""
    p, users = config.prefix_len, config.num_user_prefix_tokens
    index = jnp.arange(p, dtype=jnp.int32)[None, :]  # [1, P]
    history_len = jnp.sum(prefix_ok[:, users:], axis=1, dtype=jnp.int32)[:, None]  # [B, 1]
    anchored = p - history_len + index - users
    positions = jnp.where(index >= users, anchored, index)
    return jnp.where(prefix_ok, positions, 0).astype(jnp.float32)


def candidate_positions(candidate_ok: jax.Array, config) -> jax.Array:
    """[B, C] float32: every real candidate at P (history's end), padding at 0."""
    return jnp.where(candidate_ok, config.prefix_len, 0).astype(jnp.float32)


def prefix_key_ok(prefix_ok: jax.Array, config) -> jax.Array:
    """[B, P] bool: the prefix keys every real query attends to (see the module doc)."""
    if config.attention_keys == "exact":
        return prefix_ok
    index = jnp.arange(config.prefix_len, dtype=jnp.int32)
    last = jnp.max(jnp.where(prefix_ok, index, -1), axis=1, keepdims=True)  # [B, 1]
    block = config.attention_block
    limit = jnp.where(last >= 0, (last // block + 1) * block, 0)  # [B, 1]
    return index[None, :] < limit


def action_logits(h: jax.Array, w: ProductionWeights, config) -> jax.Array:
    """[B, C, A] in the compute dtype from final hidden states [B, C, D]."""
    return jnp.dot(h, w.unembed) * config.output_scale


def continuous_heads(h: jax.Array, w: ProductionWeights, surface: Array, config) -> jax.Array:
    """[B, C, N]: raw head values, except the dwell slot: on the softplus surfaces (the
    gallery) softplus capped smoothly at 300, elsewhere sigmoid x 30."""
    values = jnp.dot(h, w.continuous)  # [B, C, N]
    dwell = values[..., DWELL_TIME]
    cap = config.dwell_softplus_cap
    softplus = cap * jnp.tanh(jax.nn.softplus(dwell) / cap)
    sigmoid = jax.nn.sigmoid(dwell) * config.dwell_sigmoid_scale
    on_softplus = jnp.isin(surface, jnp.asarray(config.dwell_softplus_surfaces))
    return values.at[..., DWELL_TIME].set(jnp.where(on_softplus, softplus, sigmoid))


def heads(h: jax.Array, w: ProductionWeights, surface: Array, config) -> RankingOutputs:
    """Final norm, then the action and continuous heads, as float32 outputs."""
    h = rms_norm(h, w.final_norm, config.norm_eps)  # [B, C, D]
    logits = action_logits(h, w, config)
    f32 = jnp.float32
    return RankingOutputs(
        log_probs=jax.nn.log_sigmoid(logits).astype(f32),
        logits=logits.astype(f32),
        continuous=continuous_heads(h, w, surface, config).astype(f32),
    )


def sequence_mask(prefix_ok: jax.Array, candidate_ok: jax.Array, config) -> jax.Array:
    """[B, T, T] bool, T = P + C: every real query to the prefix key set; padded queries to
    nothing. (A candidate's own key is not in it: ``attend`` takes it apart, after the
    others, as the kernel does.)"""
    key_ok = prefix_key_ok(prefix_ok, config)  # [B, P]
    b, c = candidate_ok.shape
    valid = jnp.concatenate([prefix_ok, candidate_ok], axis=1)  # [B, T]
    to_prefix = jnp.concatenate([key_ok, jnp.zeros((b, c), bool)], axis=1)  # [B, T]
    return to_prefix[:, None, :] & valid[:, :, None]


def forward(
    w: ProductionWeights, inputs: RankingInputs, rows: HashedRows, config
) -> RankingOutputs:
    """Every token through every layer at once (jit with ``config`` static). The sequence is
    padded to whole attention blocks, as X pads it; the padding is never attended to."""
    prefix, prefix_ok = prefix_tokens(w, inputs, rows, config)  # [B, P, D], [B, P]
    candidates, candidate_ok = candidate_tokens(w, inputs, rows, config)  # [B, C, D], [B, C]
    b, c, width = candidates.shape
    pad = -(config.prefix_len + c) % config.attention_block
    h = jnp.concatenate([prefix, candidates, jnp.zeros((b, pad, width), prefix.dtype)], axis=1)
    candidate_ok = jnp.concatenate([candidate_ok, jnp.zeros((b, pad), bool)], axis=1)
    valid = jnp.concatenate([prefix_ok, candidate_ok], axis=1)  # [B, T], T = P + C + pad
    positions = jnp.concatenate(
        [prefix_positions(prefix_ok, config), candidate_positions(candidate_ok, config)], axis=1
    )  # [B, T]
    rotation = rope_rotation(positions, config.key_size, config.rope_base_exponent)
    allowed = sequence_mask(prefix_ok, candidate_ok, config)  # [B, T, T]
    is_candidate = jnp.arange(valid.shape[1]) >= config.prefix_len  # [T]
    own_ok = valid & is_candidate[None, :]  # [B, T]

    def layer(h, w_layer):
        q, k, v = attention_heads(h, w_layer, rotation, config)
        attention = attend(
            q, k, v, allowed, valid, config.attention_scale, config.attention_block,
            own=OwnKeys(k, v, own_ok, round_weight=config.attention_keys == "exact"),
        )  # fmt: skip
        return finish_layer(h, attention, w_layer, config), None

    h, _ = jax.lax.scan(layer, h, w.layers)
    candidates_out = h[:, config.prefix_len : config.prefix_len + c]  # [B, C, D]
    return heads(candidates_out, w, inputs.candidates.product_surface, config)
