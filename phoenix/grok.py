"""Grok-style decoder transformer used by both Phoenix towers.

API-compatible with the original ``grok`` module: same public names, the same keyword
arguments and the same Haiku parameter names (``transformer/decoder_layer_<i>/...``), so
published checkpoints load unchanged.

The numerics are factored into small pure functions (``rms_normalize``, ``apply_rope``,
``soft_cap_logits``, ``gated_gelu``) which the Haiku modules below and the cached-context
inference engine (``phoenix.engine``) share, so both compute exactly the same thing.

Shape glossary
  B  batch (users)            T  sequence length (user + history [+ candidates])
  D  model width (emb_size)   F  feed-forward width, ``ffn_size(D, widening_factor)``
  H  query heads              K  key/value heads (H is a multiple of K)
  G  query heads per key/value head (H // K)
  d  head width (key_size)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple, Optional, Sequence, Union

import haiku as hk
import jax
import jax.numpy as jnp

logger = logging.getLogger(__name__)

ROPE_BASE = 10_000
SOFT_CAP = 30.0
MASKED_LOGIT = -1e30
RMS_EPS = 1e-5


class TrainingState(NamedTuple):
    """Holds the Haiku parameters of a model."""

    params: hk.Params


class MHAOutput(NamedTuple):
    embeddings: jax.Array


class DecoderOutput(NamedTuple):
    embeddings: jax.Array


class TransformerOutput(NamedTuple):
    embeddings: jax.Array


# ----------------------------------------------------------------------------------------
# Pure functions (shared with the inference engine)
# ----------------------------------------------------------------------------------------


def ffn_size(emb_size: int, widening_factor: float) -> int:
    """Gated-FFN width: two thirds of ``widening_factor * emb_size``, rounded up to 8."""
    size = int(widening_factor * emb_size) * 2 // 3
    return size + (-size) % 8


def make_recsys_attn_mask(
    seq_len: int,
    candidate_start_offset: int,
    dtype: jnp.dtype = jnp.float32,
) -> jax.Array:
    """Causal mask whose candidate block is the identity: candidates see context + self.

    Returns [1, 1, T, T] with 1 where a query (row) may attend to a key (column).
    """
    rows = jnp.arange(seq_len)[:, None]  # [T, 1]
    cols = jnp.arange(seq_len)[None, :]  # [1, T]
    causal = cols <= rows
    both_candidates = (rows >= candidate_start_offset) & (cols >= candidate_start_offset)
    allowed = jnp.where(both_candidates, rows == cols, causal)  # [T, T]
    return allowed.astype(dtype)[None, None]


def right_anchored_rope_positions(
    padding_mask: jax.Array,
    history_seq_len: int,
    num_user_prefix_tokens: int,
) -> jax.Array:
    """RoPE positions that pin the newest valid history item to ``history_end - 1``.

    Prefix tokens keep their index, valid history items count back from the anchor, every
    candidate sits at ``history_end`` and padded tokens get 0. Returns float32 [B, T].
    """
    history_start = num_user_prefix_tokens
    history_end = num_user_prefix_tokens + history_seq_len
    index = jnp.arange(padding_mask.shape[1], dtype=jnp.int32)[None, :]  # [1, T]
    num_valid_history = jnp.sum(
        padding_mask[:, history_start:history_end], axis=1, dtype=jnp.int32
    )  # [B]
    shift = history_end - num_valid_history[:, None] - history_start  # [B, 1]
    in_history = (index >= history_start) & (index < history_end)
    positions = jnp.where(in_history, index + shift, index)  # [B, T]
    positions = jnp.where(index >= history_end, history_end, positions)
    positions = jnp.where(padding_mask, positions, 0)
    return positions.astype(jnp.float32)


def rms_normalize(x: jax.Array, scale: Optional[jax.Array], eps: float = RMS_EPS) -> jax.Array:
    """RMS normalisation computed in float32, returned in the input dtype."""
    x32 = x.astype(jnp.float32)
    inv_rms = jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    normed = x32 * inv_rms
    if scale is not None:
        normed = scale.astype(jnp.float32) * normed
    return normed.astype(x.dtype)


def rotate_half(x: jax.Array) -> jax.Array:
    """Map the two feature halves (a, b) to (-b, a): a quarter turn in each RoPE plane."""
    first, second = jnp.split(x, 2, axis=-1)
    return jnp.concatenate((-second, first), axis=-1)


def rope_phase(positions: jax.Array, dim: int, base: int = ROPE_BASE) -> jax.Array:
    """Rotation angles for float positions [b, T] -> [b, T, 1, dim] (halves repeated)."""
    inv_freq = 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))  # [dim/2]
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, T, dim/2]
    return jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [b, T, 1, dim]


def apply_rope(x: jax.Array, phase: jax.Array) -> jax.Array:
    """Rotate heads x [B, T, heads, dim] by ``phase`` [b, T, 1, dim]; keeps x's dtype."""
    rotated = x * jnp.cos(phase) + rotate_half(x) * jnp.sin(phase)
    return rotated.astype(x.dtype)


def soft_cap_logits(logits: jax.Array, multiplier: float) -> jax.Array:
    """Scale attention logits, then squash them into (-30, 30) with 30 * tanh(x / 30)."""
    logits = logits * multiplier
    return SOFT_CAP * jnp.tanh(logits / SOFT_CAP)


def gated_gelu(x: jax.Array, w_gate: jax.Array, w_value: jax.Array, w_out: jax.Array):
    """GeGLU feed-forward: (gelu(x @ w_gate) * (x @ w_value)) @ w_out, in x's dtype."""
    dtype = x.dtype
    gate = jax.nn.gelu(jnp.dot(x, w_gate.astype(dtype)))  # [..., F]
    value = jnp.dot(x, w_value.astype(dtype))  # [..., F]
    return jnp.dot(gate * value, w_out.astype(dtype))  # [..., D]


# ----------------------------------------------------------------------------------------
# Haiku modules
# ----------------------------------------------------------------------------------------


def hk_rms_norm(x: jax.Array, fixed_scale=False) -> jax.Array:
    """RMSNorm over the last axis with a learned scale (unless ``fixed_scale``)."""
    return RMSNorm(axis=-1, create_scale=not fixed_scale)(x)


def layer_norm(x):
    """The norm every Phoenix block uses (an RMSNorm with a learned scale)."""
    return hk_rms_norm(x)


class Linear(hk.Linear):
    """Linear layer with float32 parameters applied in the input's dtype."""

    def __init__(self, output_size: int, with_bias: bool = True, name: Optional[str] = None):
        super().__init__(output_size=output_size, with_bias=with_bias, name=name)

    def __call__(self, inputs: jax.Array) -> jax.Array:  # type: ignore[override]
        if not inputs.shape:
            raise ValueError("Input must not be scalar.")
        dtype = inputs.dtype
        zeros = hk.initializers.Constant(0)
        w = hk.get_parameter("w", [inputs.shape[-1], self.output_size], jnp.float32, init=zeros)
        out = jnp.dot(inputs, w.astype(dtype))
        if self.with_bias:
            b = hk.get_parameter("b", [self.output_size], jnp.float32, init=zeros)
            out = out + jnp.broadcast_to(b, out.shape).astype(dtype)
        return out


class RMSNorm(hk.RMSNorm):
    """RMSNorm computed in float32 whatever the forward dtype."""

    def __init__(
        self,
        axis: Union[int, Sequence[int], slice],
        eps: float = RMS_EPS,
        name: Optional[str] = None,
        create_scale: bool = True,
    ):
        super().__init__(axis, eps, create_scale=create_scale, name=name)

    def __call__(self, inputs: jax.Array):
        scale = None
        if self.create_scale:
            scale = hk.get_parameter(
                "scale", (inputs.shape[-1],), jnp.float32, init=hk.initializers.Constant(0)
            )
        return rms_normalize(inputs, scale, self.eps)


class RotaryEmbedding(hk.Module):
    """Rotary position embedding (RoPE) over the last axis of [B, T, heads, dim] inputs."""

    def __init__(self, dim: int, name: Optional[str] = None, base_exponent: int = ROPE_BASE):
        super().__init__(name)
        if dim % 2:
            raise ValueError(f"RoPE needs an even dimension, got {dim}")
        self.dim = dim
        self.base_exponent = base_exponent

    def __call__(
        self,
        x: jax.Array,
        seq_dim: int,
        offset: Union[jax.Array, int],
        const_position: Optional[int] = None,
        t: Optional[jax.Array] = None,
    ) -> jax.Array:
        seq_len = x.shape[seq_dim]
        if const_position:
            t = jnp.full((1, seq_len), const_position, dtype=jnp.float32)
        elif t is None:
            offset = jnp.reshape(jnp.asarray(offset, jnp.float32), (-1, 1))  # [b, 1]
            t = jnp.arange(seq_len, dtype=jnp.float32)[None, :] + offset  # [b, T]
        return apply_rope(x, rope_phase(t, self.dim, self.base_exponent))


class MultiHeadAttention(hk.Module):
    """Grouped-query attention with RoPE, soft-capped logits and float32 softmax."""

    def __init__(
        self,
        num_q_heads: int,
        num_kv_heads: int,
        key_size: int,
        *,
        with_bias: bool = True,
        value_size: Optional[int] = None,
        model_size: Optional[int] = None,
        attn_output_multiplier: float = 1.0,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        if num_q_heads % num_kv_heads:
            raise ValueError(f"num_q_heads={num_q_heads} is not a multiple of {num_kv_heads=}")
        self.num_q_heads = num_q_heads
        self.num_kv_heads = num_kv_heads
        self.key_size = key_size
        self.value_size = value_size or key_size
        self.model_size = model_size or key_size * num_q_heads
        self.attn_output_multiplier = attn_output_multiplier
        self.with_bias = with_bias

    @hk.transparent  # keep projections at multi_head_attention/<name>
    def _project_heads(self, x: jax.Array, head_size: int, num_heads: int, name: str):
        y = Linear(num_heads * head_size, with_bias=False, name=name)(x)  # [B, T, n*d]
        return y.reshape(*x.shape[:-1], num_heads, head_size)  # [B, T, n, d]

    def __call__(
        self,
        query: jax.Array,
        key: jax.Array,
        value: jax.Array,
        mask: jax.Array,
        positions: Optional[jax.Array] = None,
    ) -> MHAOutput:
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"key/value shape mismatch: {key.shape}/{value.shape}")
        if mask is None or mask.ndim != 4:
            raise ValueError(f"mask must be [B, 1, T, T], got {getattr(mask, 'shape', None)}")

        q = self._project_heads(query, self.key_size, self.num_q_heads, "query")  # [B,T,H,d]
        k = self._project_heads(key, self.key_size, self.num_kv_heads, "key")  # [B,T,K,d]
        v = self._project_heads(value, self.value_size, self.num_kv_heads, "value")  # [B,T,K,d]

        rope = RotaryEmbedding(dim=self.key_size, base_exponent=ROPE_BASE)
        k = rope(k, seq_dim=1, offset=0, t=positions)
        q = rope(q, seq_dim=1, offset=0, t=positions)

        batch, seq_len, _, _ = q.shape
        groups = self.num_q_heads // self.num_kv_heads
        q = q.reshape(batch, seq_len, self.num_kv_heads, groups, self.key_size)  # [B,T,K,G,d]

        logits = jnp.einsum("btkgd,bskd->bkgts", q, k).astype(jnp.float32)  # [B,K,G,T,S]
        logits = soft_cap_logits(logits, self.attn_output_multiplier)
        logits = jnp.where(mask[:, :, None, :, :].astype(bool), logits, MASKED_LOGIT)
        weights = jax.nn.softmax(logits).astype(query.dtype)  # [B,K,G,T,S]

        attn = jnp.einsum("bkgts,bskd->btkgd", weights, v)  # [B,T,K,G,d]
        attn = attn.reshape(batch, seq_len, -1)  # [B, T, H*d]
        return MHAOutput(Linear(self.model_size, with_bias=False)(attn))


@dataclass
class MHABlock(hk.Module):
    """Self-attention over the block input (parameters live in the enclosing layer)."""

    num_q_heads: int
    num_kv_heads: int
    key_size: int
    attn_output_multiplier: float = 1.0

    @hk.transparent
    def __call__(
        self,
        inputs: jax.Array,  # [B, T, D]
        mask: jax.Array,  # [B, 1, T, T]
        positions: Optional[jax.Array] = None,
    ) -> MHAOutput:
        attention = MultiHeadAttention(
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            key_size=self.key_size,
            model_size=inputs.shape[-1],
            attn_output_multiplier=self.attn_output_multiplier,
        )
        return attention(inputs, inputs, inputs, mask, positions=positions)


@dataclass
class DenseBlock(hk.Module):
    """GeGLU feed-forward block (parameters live in the enclosing layer)."""

    num_q_heads: int
    num_kv_heads: int
    key_size: int
    widening_factor: float = 4.0

    @hk.transparent
    def __call__(self, inputs: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, D]
        model_size = inputs.shape[-1]
        hidden = ffn_size(model_size, self.widening_factor)
        value = Linear(hidden, with_bias=False, name="linear_v")(inputs)  # [B, T, F]
        gate = jax.nn.gelu(Linear(hidden, with_bias=False)(inputs))  # [B, T, F]
        return Linear(model_size, with_bias=False)(gate * value)  # [B, T, D]


@dataclass
class DecoderLayer(hk.Module):
    """One layer: norm -> attention -> norm -> residual, norm -> FFN -> norm -> residual."""

    num_q_heads: int
    num_kv_heads: int
    key_size: int
    num_layers: int
    layer_index: Optional[int] = None
    widening_factor: float = 4.0
    name: Optional[str] = None
    attn_output_multiplier: float = 1.0

    def __call__(
        self,
        inputs: jax.Array,  # [B, T, D]
        mask: jax.Array,  # [B, 1, T, T]
        padding_mask: Optional[jax.Array],
        positions: Optional[jax.Array] = None,
    ) -> DecoderOutput:
        del padding_mask  # already folded into ``mask``
        h = inputs
        attn = MHABlock(
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            key_size=self.key_size,
            attn_output_multiplier=self.attn_output_multiplier,
        )(layer_norm(h), mask, positions=positions).embeddings
        h = h + layer_norm(attn)
        dense = DenseBlock(
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            key_size=self.key_size,
            widening_factor=self.widening_factor,
        )(layer_norm(h))
        h = h + layer_norm(dense)
        return DecoderOutput(embeddings=h)


@dataclass
class Transformer(hk.Module):
    """Stack of decoder layers with a causal or candidate-isolation mask."""

    num_q_heads: int
    num_kv_heads: int
    key_size: int
    widening_factor: float
    attn_output_multiplier: float
    num_layers: int
    name: Optional[str] = None

    def __call__(
        self,
        embeddings: jax.Array,  # [B, T, D]
        mask: jax.Array,  # [B, T] padding mask, True = real token
        candidate_start_offset: Optional[int] = None,
        positions: Optional[jax.Array] = None,  # [B, T] RoPE positions
    ) -> TransformerOutput:
        dtype = embeddings.dtype
        seq_len = embeddings.shape[1]
        key_mask = mask[:, None, None, :].astype(dtype)  # [B, 1, 1, T]
        if candidate_start_offset is None:
            structure = jnp.tril(jnp.ones((1, 1, seq_len, seq_len), dtype=dtype))
        else:
            structure = make_recsys_attn_mask(seq_len, candidate_start_offset, dtype)
        attn_mask = key_mask * structure  # [B, 1, T, T]

        h = embeddings
        for index in range(self.num_layers):
            h = DecoderLayer(
                num_q_heads=self.num_q_heads,
                num_kv_heads=self.num_kv_heads,
                key_size=self.key_size,
                num_layers=self.num_layers,
                layer_index=index,
                widening_factor=self.widening_factor,
                attn_output_multiplier=self.attn_output_multiplier,
                name=f"decoder_layer_{index}",
            )(h, attn_mask, mask, positions=positions).embeddings
        return TransformerOutput(embeddings=h)


@dataclass
class TransformerConfig:
    """Shape of the transformer; ``make()`` builds the Haiku module (inside a transform)."""

    emb_size: int
    key_size: int
    num_q_heads: int
    num_kv_heads: int
    num_layers: int
    widening_factor: float = 4.0
    attn_output_multiplier: float = 1.0
    name: Optional[str] = None

    def make(self) -> Transformer:
        return Transformer(
            num_q_heads=self.num_q_heads,
            num_kv_heads=self.num_kv_heads,
            key_size=self.key_size,
            widening_factor=self.widening_factor,
            attn_output_multiplier=self.attn_output_multiplier,
            num_layers=self.num_layers,
        )
