"""The transformer passes of the cached-context ranker, as plain jittable functions.

The context (user + history) is encoded once into a per-layer key/value cache; candidates
then attend to that cache and to themselves only (candidate isolation), in chunks.

Shape glossary
  B  users in a call (padded to a batch bucket)   S  history_seq_len
  T  context length 1 + S                          C  candidates in a chunk (a chunk bucket)
  D  emb_size   H  query heads   K  key/value heads   G  H // K   d  key_size   F  FFN width
  nI / nA  item / author hashes
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.grok import (
    MASKED_LOGIT,
    right_anchored_rope_positions,
    rms_normalize,
    rope_phase,
    rotate_half,
    soft_cap_logits,
)
from phoenix.recsys_model import PhoenixModelConfig, compute_post_age_bucket

# numpy on the host, jax inside a traced program: the tuples below hold either
HostOrDevice = Union[np.ndarray, jax.Array]


class LayerWeights(NamedTuple):
    norm_attn_in: jax.Array  # [D]
    norm_attn_out: jax.Array  # [D]
    norm_ffn_in: jax.Array  # [D]
    norm_ffn_out: jax.Array  # [D]
    w_qkv: jax.Array  # [D, (H + 2K) * d]: query, key and value projections side by side
    w_o: jax.Array  # [H*d, D]
    w_gate_value: jax.Array  # [D, 2F]: GELU gate and value projections side by side
    w_out: jax.Array  # [F, D]


# The weights are rearranged with numpy, then put on the device once: in a fresh process each
# eager jnp operation (a concatenate, a slice, a dot) first compiles a program of its own, about
# 0.1 s apiece on a CPU, in every model instance at every start.


def on_device(array: np.ndarray, dtype) -> jax.Array:
    """``array`` cast to ``dtype`` on the host (ml_dtypes rounds as XLA does), then placed."""
    return jax.device_put(np.asarray(array).astype(dtype))


def layer_weights(params, num_layers: int, dtype) -> list[LayerWeights]:
    """Per-layer weights from Haiku params; matrices cast to ``dtype``, norms stay float32."""
    layers = []
    for i in range(num_layers):
        prefix = f"transformer/decoder_layer_{i}"
        attn = f"{prefix}/multi_head_attention"
        matrix = lambda name: np.asarray(params[name]["w"])  # noqa: E731
        norm = lambda name, p=prefix: on_device(params[f"{p}/{name}"]["scale"], np.float32)  # noqa: E731
        qkv = [matrix(f"{attn}/query"), matrix(f"{attn}/key"), matrix(f"{attn}/value")]
        gate_value = [matrix(f"{prefix}/linear"), matrix(f"{prefix}/linear_v")]
        layers.append(
            LayerWeights(
                norm_attn_in=norm("rms_norm"),
                norm_attn_out=norm("rms_norm_1"),
                norm_ffn_in=norm("rms_norm_2"),
                norm_ffn_out=norm("rms_norm_3"),
                w_qkv=on_device(np.concatenate(qkv, axis=1), dtype),  # [D, (H + 2K) * d]
                w_o=on_device(matrix(f"{attn}/linear"), dtype),
                w_gate_value=on_device(np.concatenate(gate_value, axis=1), dtype),  # [D, 2F]
                w_out=on_device(matrix(f"{prefix}/linear_1"), dtype),
            )
        )
    return layers


class CandidateTables(NamedTuple):
    """``proj_mat_2`` split by feature block, the one-hot tables folded into it in advance.

    The plain model projects concat(post hashes, author hashes, surface, post age) with
    ``proj_mat_2``; a one-hot row times a table times a block of ``proj_mat_2`` is one row of
    (table @ block), so surface and post age become lookups in pre-projected tables and only
    the hash embeddings go through a matmul.
    """

    w_hashes: jax.Array  # [(nI + nA) * D, D]: proj_mat_2 rows of the post and author hashes
    surface: jax.Array  # [V_surface, D]: product_surface_embedding_table @ its proj_mat_2 rows
    post_age: jax.Array  # [V_age, D]: post_age_embedding_table @ its proj_mat_2 rows


def candidate_tables(params, config: PhoenixModelConfig) -> CandidateTables:
    """The tables folded on the host in float64 (then float32): exact to float32 rounding."""
    model = params["phoenix_model"]
    w = np.asarray(model["proj_mat_2"], np.float64)  # [(nI + nA + 2) * D, D]
    D = config.emb_size
    assert config.hash_config is not None  # set by the config's __post_init__
    hashes = (config.hash_config.num_item_hashes + config.hash_config.num_author_hashes) * D
    surface = np.asarray(model["product_surface_embedding_table"], np.float64)  # [V_s, D]
    post_age = np.asarray(model["post_age_embedding_table"], np.float64)  # [V_age, D]
    return CandidateTables(
        w_hashes=on_device(w[:hashes], np.float32),  # [(nI + nA) * D, D]
        surface=on_device(surface @ w[hashes : hashes + D], np.float32),  # [V_s, D]
        post_age=on_device(post_age @ w[hashes + D : hashes + 2 * D], np.float32),  # [V_age, D]
    )


def lookup_rows(table: jax.Array, index: jax.Array) -> jax.Array:
    """table[index] with zeros for indices outside the table, as a one-hot matmul gives."""
    inside = (index >= 0) & (index < table.shape[0])  # [B, C]
    rows = jnp.take(table, jnp.clip(index, 0, table.shape[0] - 1), axis=0)  # [B, C, D]
    return jnp.where(inside[..., None], rows, 0.0)


class CandidateInputs(NamedTuple):
    """One chunk of candidates as the jitted scorer takes it, padded to [B, C]."""

    valid: HostOrDevice  # [B, C] bool: False for padding (post hash 0)
    product_surface: HostOrDevice  # [B, C] int32
    impr_ts: HostOrDevice  # [B, C] int32 seconds, 0 = unknown
    creation_ts: HostOrDevice  # [B, C] int32 seconds, 0 = unknown
    post_embeddings: HostOrDevice  # [B, C, nI, D] float32
    author_embeddings: HostOrDevice  # [B, C, nA, D] float32


def candidate_tokens(inputs: CandidateInputs, tables: CandidateTables, granularity_mins: int):
    """Candidate tokens [B, C, D] (float32), equal to the model's ``build_candidate_inputs``."""
    post, author = inputs.post_embeddings, inputs.author_embeddings  # [B, C, nI|nA, D]
    b, c = post.shape[:2]
    hashes = jnp.concatenate([post.reshape(b, c, -1), author.reshape(b, c, -1)], axis=-1)
    impr_ts, creation_ts = jnp.asarray(inputs.impr_ts), jnp.asarray(inputs.creation_ts)
    age = compute_post_age_bucket(impr_ts, creation_ts, granularity_mins)  # [B, C]
    tokens = jnp.dot(hashes.astype(jnp.float32), tables.w_hashes)  # [B, C, D]
    tokens = tokens + lookup_rows(tables.surface, jnp.asarray(inputs.product_surface))
    return tokens + lookup_rows(tables.post_age, age)


@dataclasses.dataclass(frozen=True)
class AttentionShape:
    num_q_heads: int
    num_kv_heads: int
    key_size: int
    attn_output_multiplier: float

    @property
    def groups(self) -> int:
        return self.num_q_heads // self.num_kv_heads

    @classmethod
    def of(cls, config: PhoenixModelConfig) -> AttentionShape:
        tc = config.model
        return cls(tc.num_q_heads, tc.num_kv_heads, tc.key_size, tc.attn_output_multiplier)


class RankerWeights(NamedTuple):
    """The ranker's parameters as the engines use them, resident on the device."""

    layers: list  # [LayerWeights] per layer, in the compute dtype
    candidates: CandidateTables
    final_norm: jax.Array  # [D] float32
    unembed: jax.Array  # [D, A] float32
    continuous: jax.Array  # [D, N] float32


def ranker_weights(params, config: PhoenixModelConfig, dtype) -> RankerWeights:
    return RankerWeights(
        layer_weights(params, config.model.num_layers, dtype),
        candidate_tables(params, config),
        on_device(params["phoenix_model/rms_norm"]["scale"], np.float32),
        on_device(params["phoenix_model"]["unembeddings"], np.float32),
        on_device(params["phoenix_model"]["continuous_unembeddings"], np.float32),
    )


def context_positions(mask: jax.Array, config: PhoenixModelConfig) -> jax.Array:
    """RoPE positions of the context tokens [B|1, 1 + S] (right-anchored or 0, 1, ...)."""
    if config.right_anchored_rope:
        return right_anchored_rope_positions(mask, config.history_seq_len, 1)
    return jnp.arange(mask.shape[1], dtype=jnp.float32)[None, :]


class Rotation(NamedTuple):
    """cos and sin of the RoPE phases, [B|1, n, 1, d] each."""

    cos: HostOrDevice
    sin: HostOrDevice


def rope_rotation(positions: jax.Array, key_size: int) -> Rotation:
    """cos/sin of the phases of ``positions`` [B|1, n] (as ``grok.apply_rope`` computes them)."""
    phase = rope_phase(positions, key_size)  # [B|1, n, 1, d]
    return Rotation(jnp.cos(phase), jnp.sin(phase))


def rotate(x: jax.Array, rotation: Rotation) -> jax.Array:
    """``grok.apply_rope`` with the cos/sin given: heads x [B, n, heads, d]."""
    return (x * rotation.cos + rotate_half(x) * rotation.sin).astype(x.dtype)


def _qkv(x: jax.Array, w: LayerWeights, shape: AttentionShape, rotation: Rotation):
    """Projected, rotated heads of normalised tokens x [B, n, D]."""
    b, n, _ = x.shape
    # One wide matmul instead of three narrow ones: the same dot products, better GEMM use.
    qkv = jnp.dot(x, w.w_qkv)  # [B, n, (H + 2K) * d]
    H, K, d = shape.num_q_heads, shape.num_kv_heads, shape.key_size
    q = qkv[..., : H * d].reshape(b, n, K, shape.groups, d)
    k = qkv[..., H * d : (H + K) * d].reshape(b, n, K, d)  # [B, n, K, d]
    v = qkv[..., (H + K) * d :].reshape(b, n, K, d)  # [B, n, K, d]
    q = rotate(q.reshape(b, n, -1, shape.key_size), rotation)  # rope over all H heads
    q = q.reshape(b, n, shape.num_kv_heads, shape.groups, shape.key_size)  # [B, n, K, G, d]
    return q, rotate(k, rotation), v


def _finish_layer(h, attn, w: LayerWeights):
    """Output projection, post-norm, residual, then the FFN sub-block."""
    h = h + rms_normalize(jnp.dot(attn, w.w_o), w.norm_attn_out)
    gate, value = jnp.split(jnp.dot(rms_normalize(h, w.norm_ffn_in), w.w_gate_value), 2, axis=-1)
    dense = jnp.dot(jax.nn.gelu(gate) * value, w.w_out)
    return h + rms_normalize(dense, w.norm_ffn_out)


def _attention_over(h, allowed, rotation: Rotation, w: LayerWeights, shape: AttentionShape):
    """One layer's self-attention of tokens h [B, n, D] among themselves, keys as ``allowed``
    [B, 1, n(query), 1, n(key)] says; returns (attention output [B, n, H*d], keys, values)."""
    b, n, _ = h.shape
    K, G, d = shape.num_kv_heads, shape.groups, shape.key_size
    q, k, v = _qkv(rms_normalize(h, w.norm_attn_in), w, shape, rotation)
    # Plain batched matmuls over (user, kv head): [n*G, d] x [d, n] and [n*G, n] x [n, d].
    q_rows = q.transpose(0, 2, 1, 3, 4).reshape(b, K, n * G, d)  # [B, K, n*G, d]
    logits = jnp.matmul(q_rows, k.transpose(0, 2, 3, 1)).astype(jnp.float32)
    logits = soft_cap_logits(logits.reshape(b, K, n, G, n), shape.attn_output_multiplier)
    logits = jnp.where(allowed, logits, MASKED_LOGIT)  # [B, K, n, G, n]
    probs = jax.nn.softmax(logits).astype(h.dtype).reshape(b, K, n * G, n)
    attn = jnp.matmul(probs, v.transpose(0, 2, 1, 3))  # [B, K, n*G, d]
    attn = attn.reshape(b, K, n, G, d).transpose(0, 2, 1, 3, 4).reshape(b, n, -1)
    return attn, k, v


def context_layers(tokens, mask, rotation: Rotation, layers, shape: AttentionShape):
    """Causal pass over the context; returns the per-layer (keys, values) cache.

    tokens [B, T, D], mask [B, T] bool, rotation of the context positions ([B|1, T, 1, d])
    -> list of (keys [B, K, d, T], values [B, K, T, d]): laid out as the candidates' matmuls
    read them, so that a cache kept across requests (the prefix cache) is never transposed
    again when it is read.
    """
    seq = tokens.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), bool))  # [T, T]
    allowed = (causal[None] & mask[:, None, :])[:, None, :, None, :]  # [B, 1, T, 1, T]
    h, cache = tokens, []
    for w in layers:
        attn, k, v = _attention_over(h, allowed, rotation, w, shape)
        cache.append((k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)))  # [B,K,d,T] [B,K,T,d]
        h = _finish_layer(h, attn, w)
    return cache


def isolation_mask(context_mask, candidate_mask):
    """Who attends to whom when context and candidates run as one sequence [B, T + C]: the
    context causally among its valid tokens, each candidate to the valid context and itself
    (valid only). Returns [B, T + C (query), T + C (key)] bool."""
    b, seq = context_mask.shape
    c = candidate_mask.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), bool))[None] & context_mask[:, None, :]  # [B,T,T]
    context_rows = jnp.concatenate([causal, jnp.zeros((b, seq, c), bool)], axis=2)  # [B,T,T+C]
    to_context = jnp.broadcast_to(context_mask[:, None, :], (b, c, seq))  # [B, C, T]
    to_self = jnp.eye(c, dtype=bool)[None] & candidate_mask[:, None, :]  # [B, C, C]
    candidate_rows = jnp.concatenate([to_context, to_self], axis=2)  # [B, C, T+C]
    return jnp.concatenate([context_rows, candidate_rows], axis=1)  # [B, T+C, T+C]


def joint_layers(tokens, allowed, rotation: Rotation, layers, shape: AttentionShape):
    """Context and candidates as one sequence through every layer (``isolation_mask``):
    half the kernels of the cached-context passes, for batches so small that kernel launches,
    not arithmetic, take the time. tokens [B, n, D], allowed [B, n, n], rotation [B|1, n, 1, d]
    -> final hidden states [B, n, D]."""
    allowed = allowed[:, None, :, None, :]  # [B, 1, n, 1, n]
    h = tokens
    for w in layers:
        attn, _, _ = _attention_over(h, allowed, rotation, w, shape)
        h = _finish_layer(h, attn, w)
    return h


def candidate_layers(tokens, mask, rotation: Rotation, context_mask, cache, layers, shape):
    """Candidates attend to the cached context and to themselves only.

    tokens [B, C, D], mask [B, C] bool, rotation of the candidate positions ([B|1, C, 1, d]),
    context_mask [B, T] bool, cache: per layer (keys [B, K, d, T], values [B, K, T, d]) as
    ``context_layers`` returns them.
    Returns the final hidden states [B, C, D]. The softmax over (context keys + own key) is
    written out so the context part is one plain batched matmul and the self part an
    elementwise product (no [.., T+1] concatenation).
    """
    b, c, _ = tokens.shape
    K, G, d = shape.num_kv_heads, shape.groups, shape.key_size
    context_ok = context_mask[:, None, None, :]  # [B, 1, 1, T]
    h = tokens
    for w, (keys, values) in zip(layers, cache, strict=False):
        q, k, v = _qkv(rms_normalize(h, w.norm_attn_in), w, shape, rotation)  # q [B,C,K,G,d]
        q_rows = q.transpose(0, 2, 1, 3, 4).reshape(b, K, c * G, d)  # [B, K, C*G, d]
        to_context = jnp.matmul(q_rows, keys).astype(jnp.float32)  # [B, K, C*G, T]
        # Each candidate's key against its own queries: a fused multiply-sum, since as a
        # dot XLA:CPU runs B*C*K tiny [G, d] x [d, 1] products one by one (2.5-4x slower).
        f32 = jnp.float32  # accumulate in float32 like the dots do, also under bfloat16
        to_self = jnp.sum(q.astype(f32) * k.astype(f32)[:, :, :, None, :], axis=-1)  # [B,C,K,G]
        to_self = to_self.transpose(0, 2, 1, 3).reshape(b, K, c * G)  # [B, K, C*G]
        cap = lambda x: soft_cap_logits(x.astype(jnp.float32), shape.attn_output_multiplier)  # noqa: E731
        to_context = jnp.where(context_ok, cap(to_context), MASKED_LOGIT)
        self_ok = jnp.repeat(mask, G, axis=1)[:, None, :]  # [B, 1, C*G]
        to_self = jnp.where(self_ok, cap(to_self), MASKED_LOGIT)
        top = jnp.maximum(jnp.max(to_context, axis=-1), to_self)  # [B, K, C*G]
        e_context = jnp.exp(to_context - top[..., None])  # [B, K, C*G, T]
        e_self = jnp.exp(to_self - top)  # [B, K, C*G]
        inv_total = 1.0 / (jnp.sum(e_context, axis=-1) + e_self)  # [B, K, C*G]
        p_context = (e_context * inv_total[..., None]).astype(h.dtype)
        p_self = (e_self * inv_total).astype(h.dtype)
        attn = jnp.matmul(p_context, values)  # [B, K, C*G, d]
        own_v = jnp.repeat(v.transpose(0, 2, 1, 3), G, axis=2)  # [B, K, C*G, d]
        attn = attn + p_self[..., None] * own_v
        attn = attn.reshape(b, K, c, G, d).transpose(0, 2, 1, 3, 4)  # [B, C, K, G, d]
        h = _finish_layer(h, attn.reshape(b, c, -1), w)
    return h
