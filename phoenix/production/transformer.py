"""The trunk's pieces: RMSNorm, GQA heads with qk-norm, RoPE, attention, the FFN, a layer.

Shapes: B requests, T (Tq, Tk) tokens, D width, H query heads, K key/value heads, G = H / K,
d key size, F FFN width. Matmuls take the compute dtype and round their output to it; norms,
RoPE and softmax run in float32, as X's code does.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from phoenix.production.params import LayerStack

F32 = jnp.float32


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """x [..., D] / rms(x) * scale, in float32, back in x's dtype."""
    x32 = x.astype(F32)
    mean_square = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
    return (scale.astype(F32) * (x32 * jax.lax.rsqrt(mean_square + eps))).astype(x.dtype)


class Rotation(NamedTuple):
    """cos and sin of the RoPE phases, [B, T, 1, d] each."""

    cos: jax.Array
    sin: jax.Array


def rope_rotation(positions: jax.Array, key_size: int, base: int) -> Rotation:
    """The rotation of tokens at ``positions`` [B, T] (float32)."""
    exponents = jnp.arange(0, key_size, 2, dtype=F32)
    inv_freq = 1.0 / (base ** (exponents / key_size))  # [d/2]
    phase = positions.astype(F32)[..., None] * inv_freq  # [B, T, d/2]
    phase = jnp.concatenate([phase, phase], axis=-1)[:, :, None, :]  # [B, T, 1, d]
    return Rotation(jnp.cos(phase), jnp.sin(phase))


def rotate(x: jax.Array, rotation: Rotation) -> jax.Array:
    """RoPE on heads x [B, T, heads, d]: the halves rotated as pairs, in float32."""
    x32 = x.astype(F32)
    first, second = jnp.split(x32, 2, axis=-1)
    half_turn = jnp.concatenate([-second, first], axis=-1)
    return (x32 * rotation.cos + half_turn * rotation.sin).astype(x.dtype)


def layer_at(layers: LayerStack, index: int) -> LayerStack:
    """One layer's weights out of the stack."""
    return LayerStack(*(w[index] for w in layers))


def attention_heads(h: jax.Array, w: LayerStack, rotation: Rotation, config):
    """Queries [B, T, H, d], keys and values [B, T, K, d] of tokens h [B, T, D] (one layer's
    ``w``): normalised, one projection, per-kv-head [G queries, key, value], qk-norm over all
    heads together, RoPE on queries and keys."""
    b, t, _ = h.shape
    H, K, G, d = config.num_q_heads, config.num_kv_heads, config.groups, config.key_size
    x = rms_norm(h, w.pre_attn_norm, config.norm_eps)
    qkv = jnp.dot(x, w.qkv).reshape(b, t, K, G + 2, d)  # [B, T, K, G + 2, d]
    q = qkv[:, :, :, :G].reshape(b, t, H * d)  # query head k * G + g uses kv head k
    k = qkv[:, :, :, G].reshape(b, t, K * d)
    v = qkv[:, :, :, G + 1]  # [B, T, K, d]
    q = rms_norm(q, w.q_norm, config.norm_eps).reshape(b, t, H, d)
    k = rms_norm(k, w.k_norm, config.norm_eps).reshape(b, t, K, d)
    return rotate(q, rotation), rotate(k, rotation), v


class OwnKeys(NamedTuple):
    """Each query's own key and value, outside the shared keys: [B, Tq, K, d] each; ``ok``
    [B, Tq] bool says which queries attend to theirs. ``round_weight``: round the own key's
    weight to the compute dtype like the others' (X's training kernel) or keep it in float32
    (its serving kernel)."""

    keys: jax.Array
    values: jax.Array
    ok: jax.Array
    round_weight: bool = False


def attend(q, keys, values, allowed, query_ok, scale: float, block: int, own=None):
    """Softmax attention computed as X's serving kernel computes it.

    q [B, Tq, H, d]; keys, values [B, Tk, K, d]; allowed [B, Tq or 1, Tk] bool: which keys
    each query sees; query_ok [B, Tq] bool: a query that is not gets zeros, as the kernel
    gives padding; ``own``: each query's own key and value, taken after the shared keys.

    Like the kernel, an online softmax over blocks of ``block`` keys: float32 logits (bf16
    inputs, float32 accumulation), a running maximum of at least 1.0, each block's weights
    rounded to the compute dtype before they meet its values and rescaled as the maximum
    grows; the own key's weight in float32 (``OwnKeys.round_weight``). A block without an
    allowed key is skipped, as the kernel never visits it. Given X's queries, keys and
    values this gave X's attention output bit for bit in all but 4e-5 of the values (a
    softmax over all keys at once: 2%).
    Returns [B, Tq, H * d] in q's dtype.
    """
    b, tq, H, d = q.shape
    tk, K = keys.shape[1], keys.shape[2]
    if tk % block:
        raise ValueError(f"{tk} keys do not fill blocks of {block}")
    qg = q.reshape(b, tq, K, H // K, d)  # [B, Tq, K, G, d]
    blocks = lambda x: jnp.moveaxis(x.reshape(x.shape[0], tk // block, block, *x.shape[2:]), 1, 0)  # noqa: E731
    by_block = (
        blocks(keys),  # [n, B, t, K, d]
        blocks(values),
        jnp.moveaxis(allowed.reshape(*allowed.shape[:2], tk // block, block), 2, 0),  # [n,B,Tq|1,t]
    )

    def step(carry, xs):
        top, total, mixed = carry
        block_keys, block_values, block_allowed = xs
        logits = (
            jnp.einsum("bqkgd,btkd->bkgqt", qg, block_keys, preferred_element_type=F32) * scale
        )  # [B, K, G, Tq, t]
        ok = block_allowed[:, None, None]  # [B, 1, 1, Tq|1, t]
        visited = jnp.any(ok, axis=-1)  # [B, 1, 1, Tq|1]
        block_top = jnp.maximum(jnp.max(jnp.where(ok, logits, -jnp.inf), axis=-1), 1.0)
        new_top = jnp.where(visited, jnp.maximum(top, block_top), top)
        weights = jnp.where(ok, jnp.exp(logits - new_top[..., None]), 0.0)
        rescale = jnp.where(visited, jnp.exp(top - new_top), 1.0)
        total = total * rescale + jnp.sum(weights, axis=-1)
        mixed = mixed * rescale[..., None] + jnp.einsum(
            "bkgqt,btkd->bkgqd", weights.astype(q.dtype), block_values,
            preferred_element_type=F32,
        )  # fmt: skip
        return (new_top, total, mixed), None

    top = jnp.full((b, K, H // K, tq), -jnp.inf, F32)  # running maximum [B, K, G, Tq]
    start = (top, jnp.zeros_like(top), jnp.zeros((b, K, H // K, tq, d), F32))
    (top, total, mixed), _ = jax.lax.scan(step, start, by_block)
    if own is not None:
        own_logit = jnp.sum(qg.astype(F32) * own.keys.astype(F32)[:, :, :, None], axis=-1)
        own_logit = own_logit.transpose(0, 2, 3, 1) * scale  # [B, K, G, Tq]
        visited = own.ok[:, None, None, :]  # [B, 1, 1, Tq]
        new_top = jnp.where(visited, jnp.maximum(top, jnp.maximum(own_logit, 1.0)), top)
        weight = jnp.where(visited, jnp.exp(own_logit - new_top), 0.0)
        rescale = jnp.where(visited, jnp.exp(top - new_top), 1.0)
        total = total * rescale + weight
        if own.round_weight:
            weight = weight.astype(q.dtype).astype(F32)
        own_values = own.values.astype(F32).transpose(0, 2, 1, 3)[:, :, None]  # [B,K,1,Tq,d]
        mixed = mixed * rescale[..., None] + weight[..., None] * own_values
    out = mixed / jnp.where(total == 0.0, 1.0, total)[..., None]
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, tq, H * d)  # [B, Tq, H*d]
    return jnp.where(query_ok[..., None], out, 0.0).astype(q.dtype)


def feed_forward(x: jax.Array, w: LayerStack) -> jax.Array:
    """[B, T, D] from normalised x: up, tanh-approximated GELU, down."""
    return jnp.dot(jax.nn.gelu(jnp.dot(x, w.up), approximate=True), w.down)


def finish_layer(h: jax.Array, attention: jax.Array, w: LayerStack, config) -> jax.Array:
    """The residual after attention ([B, T, H*d] projected), then the FFN's.

    The FFN's norm reads the float32 sum of the residual and the attention's projection, the
    residual stream keeps it rounded: X's compiled program fuses the addition into the norm
    (given X's layer input, this gave X's layer output in all but 5e-4 of the values;
    normalising the rounded sum, 12%).
    """
    residual = h.astype(F32) + jnp.dot(attention, w.out).astype(F32)  # [B, T, D]
    h = residual.astype(h.dtype)
    x = rms_norm(residual, w.pre_ffn_norm, config.norm_eps).astype(h.dtype)
    return h + feed_forward(x, w)
