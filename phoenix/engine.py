"""Fast jitted inference for the Phoenix ranker and retriever.

Ranking exploits candidate isolation: the user + history tokens (the *context*) never attend
to candidates, so their per-layer keys and values are computed once per user and every
candidate is then scored against that cache, attending to the context and to itself only.
That turns the (1 + S + C)^2 attention of the plain model into (1 + S)^2 + C * (1 + S + 1)
and lets any number of candidates be scored in fixed-size chunks, with results equal to the
plain model's (``PhoenixModel``) whatever the chunking or the batch composition.

Every jitted function is compiled for a small set of bucketed shapes (batch size, candidate
chunk, top-k) by ``warm_up()``, so no request pays for a compilation later.

Shape glossary
  B  users in a call (padded to a batch bucket)   S  history_seq_len
  T  context length 1 + S                          C  candidates in a chunk (a chunk bucket)
  D  emb_size   H  query heads   K  key/value heads   G  H // K   d  key_size
  A  num_actions   N  continuous outputs (8)   L  layers   M  corpus size   k  top-k bucket
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from phoenix.grok import (
    MASKED_LOGIT,
    ffn_size,
    right_anchored_rope_positions,
    rms_normalize,
    rope_phase,
    rotate_half,
    soft_cap_logits,
)
from phoenix.recsys_model import (
    PhoenixModelConfig,
    RecsysBatch,
    RecsysEmbeddings,
    compute_post_age_bucket,
)
from phoenix.recsys_retrieval_model import (
    INF,
    PhoenixRetrievalModelConfig,
    candidate_tower_mlp,
    l2_normalize,
)

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_CANDIDATE_BUCKETS = (16, 64, 256, 512, 1024)
DEFAULT_TOP_K_BUCKETS = (64, 256, 1024, 2048)


def default_max_rows_per_call() -> Optional[int]:
    """Users x candidates per chunk call on CPUs (None: no limit on accelerators).

    Measured on 2 cores (mini config, 8 users, 1024 candidates): 161 ms in calls of two users
    against 206 ms in one call; past ~2048 rows the [users, heads, rows, T] attention arrays
    spill the caches.
    """
    return 2048 if jax.default_backend() == "cpu" else None


def default_compute_dtype() -> Any:
    """bfloat16 on accelerators (the original forward dtype), float32 on CPUs."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= size (the largest bucket if none is)."""
    for bucket in buckets:
        if size <= bucket:
            return bucket
    return buckets[-1]


def batch_slices(n: int, buckets: Sequence[int]):
    """Split n rows into slices of at most the largest bucket, each with its padded size."""
    largest = buckets[-1]
    for start in range(0, n, largest):
        stop = min(n, start + largest)
        yield slice(start, stop), bucket_for(stop - start, buckets)


def _pad_axis(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Zero-pad ``x`` along ``axis`` up to ``size``."""
    missing = size - x.shape[axis]
    if missing <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, missing)
    return np.pad(x, widths)


# ----------------------------------------------------------------------------------------
# Layer parameters, pre-cast once to the compute dtype
# ----------------------------------------------------------------------------------------


class LayerWeights(NamedTuple):
    norm_attn_in: jax.Array  # [D]
    norm_attn_out: jax.Array  # [D]
    norm_ffn_in: jax.Array  # [D]
    norm_ffn_out: jax.Array  # [D]
    w_qkv: jax.Array  # [D, (H + 2K) * d]: query, key and value projections side by side
    w_o: jax.Array  # [H*d, D]
    w_gate_value: jax.Array  # [D, 2F]: GELU gate and value projections side by side
    w_out: jax.Array  # [F, D]


def layer_weights(params, num_layers: int, dtype) -> list[LayerWeights]:
    """Per-layer weights from Haiku params; matrices cast to ``dtype``, norms stay float32."""
    layers = []
    for i in range(num_layers):
        prefix = f"transformer/decoder_layer_{i}"
        attn = f"{prefix}/multi_head_attention"
        cast = lambda name: jnp.asarray(params[name]["w"], dtype)  # noqa: E731
        norm = lambda name, p=prefix: jnp.asarray(params[f"{p}/{name}"]["scale"], jnp.float32)  # noqa: E731
        layers.append(
            LayerWeights(
                norm_attn_in=norm("rms_norm"),
                norm_attn_out=norm("rms_norm_1"),
                norm_ffn_in=norm("rms_norm_2"),
                norm_ffn_out=norm("rms_norm_3"),
                w_qkv=jnp.concatenate(
                    [cast(f"{attn}/query"), cast(f"{attn}/key"), cast(f"{attn}/value")], axis=1
                ),
                w_o=cast(f"{attn}/linear"),
                w_gate_value=jnp.concatenate(
                    [cast(f"{prefix}/linear"), cast(f"{prefix}/linear_v")], axis=1
                ),
                w_out=cast(f"{prefix}/linear_1"),
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
    model = params["phoenix_model"]
    w = jnp.asarray(model["proj_mat_2"], jnp.float32)  # [(nI + nA + 2) * D, D]
    D = config.emb_size
    hashes = (config.hash_config.num_item_hashes + config.hash_config.num_author_hashes) * D
    surface = jnp.asarray(model["product_surface_embedding_table"], jnp.float32)  # [V_s, D]
    post_age = jnp.asarray(model["post_age_embedding_table"], jnp.float32)  # [V_age, D]
    return CandidateTables(
        w_hashes=w[:hashes],
        surface=jnp.dot(surface, w[hashes : hashes + D], precision="highest"),
        post_age=jnp.dot(post_age, w[hashes + D : hashes + 2 * D], precision="highest"),
    )


def lookup_rows(table: jax.Array, index: jax.Array) -> jax.Array:
    """table[index] with zeros for indices outside the table, as a one-hot matmul gives."""
    inside = (index >= 0) & (index < table.shape[0])  # [B, C]
    rows = jnp.take(table, jnp.clip(index, 0, table.shape[0] - 1), axis=0)  # [B, C, D]
    return jnp.where(inside[..., None], rows, 0.0)


class CandidateInputs(NamedTuple):
    """One chunk of candidates as the jitted scorer takes it, padded to [B, C]."""

    valid: np.ndarray  # [B, C] bool: False for padding (post hash 0)
    product_surface: np.ndarray  # [B, C] int32
    impr_ts: np.ndarray  # [B, C] int32 seconds, 0 = unknown
    creation_ts: np.ndarray  # [B, C] int32 seconds, 0 = unknown
    post_embeddings: np.ndarray  # [B, C, nI, D] float32
    author_embeddings: np.ndarray  # [B, C, nA, D] float32


def candidate_tokens(inputs: CandidateInputs, tables: CandidateTables, granularity_mins: int):
    """Candidate tokens [B, C, D] (float32), equal to the model's ``build_candidate_inputs``."""
    post, author = inputs.post_embeddings, inputs.author_embeddings  # [B, C, nI|nA, D]
    b, c = post.shape[:2]
    hashes = jnp.concatenate([post.reshape(b, c, -1), author.reshape(b, c, -1)], axis=-1)
    age = compute_post_age_bucket(inputs.impr_ts, inputs.creation_ts, granularity_mins)  # [B, C]
    tokens = jnp.dot(hashes.astype(jnp.float32), tables.w_hashes)  # [B, C, D]
    tokens = tokens + lookup_rows(tables.surface, inputs.product_surface)
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


class Rotation(NamedTuple):
    """cos and sin of the RoPE phases, [B|1, n, 1, d] each."""

    cos: jax.Array
    sin: jax.Array


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


def context_layers(tokens, mask, rotation: Rotation, layers, shape: AttentionShape):
    """Causal pass over the context; returns the per-layer (keys, values) cache.

    tokens [B, T, D], mask [B, T] bool, rotation of the context positions ([B|1, T, 1, d])
    -> list of ([B, T, K, d], [B, T, K, d]).
    """
    seq = tokens.shape[1]
    causal = jnp.tril(jnp.ones((seq, seq), bool))  # [T, T]
    allowed = causal[None] & mask[:, None, :]  # [B, T(query), T(key)]
    h, cache = tokens, []
    b, K, G, d = tokens.shape[0], shape.num_kv_heads, shape.groups, shape.key_size
    allowed = allowed[:, None, :, None, :]  # [B, 1, T(query), 1, T(key)]
    for w in layers:
        q, k, v = _qkv(rms_normalize(h, w.norm_attn_in), w, shape, rotation)
        cache.append((k, v))
        # Plain batched matmuls over (user, kv head): [T*G, d] x [d, T] and [T*G, T] x [T, d].
        q_rows = q.transpose(0, 2, 1, 3, 4).reshape(b, K, seq * G, d)  # [B, K, T*G, d]
        logits = jnp.matmul(q_rows, k.transpose(0, 2, 3, 1)).astype(jnp.float32)
        logits = soft_cap_logits(logits.reshape(b, K, seq, G, seq), shape.attn_output_multiplier)
        logits = jnp.where(allowed, logits, MASKED_LOGIT)  # [B, K, T, G, T]
        probs = jax.nn.softmax(logits).astype(h.dtype).reshape(b, K, seq * G, seq)
        attn = jnp.matmul(probs, v.transpose(0, 2, 1, 3))  # [B, K, T*G, d]
        attn = attn.reshape(b, K, seq, G, d).transpose(0, 2, 1, 3, 4).reshape(b, seq, -1)
        h = _finish_layer(h, attn, w)
    return cache


def candidate_layers(tokens, mask, rotation: Rotation, context_mask, cache, layers, shape):
    """Candidates attend to the cached context and to themselves only.

    tokens [B, C, D], mask [B, C] bool, rotation of the candidate positions ([B|1, C, 1, d]),
    context_mask [B, T] bool.
    Returns the final hidden states [B, C, D]. The softmax over (context keys + own key) is
    written out so the context part is one plain batched matmul and the self part an
    elementwise product (no [.., T+1] concatenation).
    """
    b, c, _ = tokens.shape
    K, G, d = shape.num_kv_heads, shape.groups, shape.key_size
    context_ok = context_mask[:, None, None, :]  # [B, 1, 1, T]
    h = tokens
    for w, (ctx_k, ctx_v) in zip(layers, cache, strict=False):
        q, k, v = _qkv(rms_normalize(h, w.norm_attn_in), w, shape, rotation)  # q [B,C,K,G,d]
        q_rows = q.transpose(0, 2, 1, 3, 4).reshape(b, K, c * G, d)  # [B, K, C*G, d]
        keys = ctx_k.transpose(0, 2, 3, 1)  # [B, K, d, T]
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
        values = ctx_v.transpose(0, 2, 1, 3)  # [B, K, T, d]
        attn = jnp.matmul(p_context, values)  # [B, K, C*G, d]
        own_v = jnp.repeat(v.transpose(0, 2, 1, 3), G, axis=2)  # [B, K, C*G, d]
        attn = attn + p_self[..., None] * own_v
        attn = attn.reshape(b, K, c, G, d).transpose(0, 2, 1, 3, 4)  # [B, C, K, G, d]
        h = _finish_layer(h, attn.reshape(b, c, -1), w)
    return h


# ----------------------------------------------------------------------------------------
# Ranking
# ----------------------------------------------------------------------------------------


class RankingScores(NamedTuple):
    logits: np.ndarray  # [B, C, A] float32
    continuous_preds: np.ndarray  # [B, C, N] float32


def _model_method(config: PhoenixModelConfig, method: str):
    """Haiku-applied ``PhoenixModel.<method>``: token construction exactly as the model does."""
    return hk.without_apply_rng(
        hk.transform(lambda batch, emb: getattr(config.make(), method)(batch, emb))
    ).apply


class RankingEngine:
    """Scores any number of candidates per user against a cached user + history context."""

    def __init__(
        self,
        config: PhoenixModelConfig,
        params,
        *,
        compute_dtype=None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        candidate_buckets: Sequence[int] = DEFAULT_CANDIDATE_BUCKETS,
        max_rows_per_call: Optional[int] = None,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.candidate_buckets = tuple(sorted(candidate_buckets))
        # None: the platform's default (a limit on CPUs, none on accelerators)
        self.max_rows = max_rows_per_call or default_max_rows_per_call()
        self.chunk = self.candidate_buckets[-1]
        self.params = params
        tc = config.model
        self.shape = AttentionShape(
            tc.num_q_heads, tc.num_kv_heads, tc.key_size, tc.attn_output_multiplier
        )
        self.layers = layer_weights(params, tc.num_layers, self.dtype)
        self.final_norm = jnp.asarray(params["phoenix_model/rms_norm"]["scale"], jnp.float32)
        self.unembed = jnp.asarray(params["phoenix_model"]["unembeddings"], jnp.float32)
        self.continuous = jnp.asarray(
            params["phoenix_model"]["continuous_unembeddings"], jnp.float32
        )
        self._context_tokens = _model_method(self.config, "build_context_inputs")
        self.candidate_tables = candidate_tables(params, config)
        self._context_inputs_jit = jax.jit(self._context_tokens_fn)
        self._context_layers_jit = jax.jit(self._context_layers_fn)
        self._score_chunk = jax.jit(self._chunk_fn)
        # RoPE cos/sin come from a program of their own and enter the layer passes as inputs:
        # computed inside one program, XLA fuses cos and sin into every consumer and
        # re-evaluates them for each head of each layer (a quarter of the candidate pass).
        self._candidate_rotation = jax.jit(self._candidate_rotation_fn)

    # -- jitted bodies ------------------------------------------------------------------

    def _context_tokens_fn(self, params, batch: RecsysBatch, emb: RecsysEmbeddings):
        """Context tokens [B, T, D], mask [B, T] and rotation; candidate fields are None."""
        tokens, mask = self._context_tokens(params, batch, emb)
        rotation = rope_rotation(self._context_positions(mask), self.shape.key_size)
        return tokens, mask, rotation

    def _context_layers_fn(self, tokens, mask, rotation):
        """The per-layer kv cache of the context (rotation computed by the previous program)."""
        return context_layers(tokens, mask, rotation, self.layers, self.shape)

    def _encode_context(self, params, batch: RecsysBatch, emb: RecsysEmbeddings):
        """(kv cache, context mask) of the users in ``batch``."""
        tokens, mask, rotation = self._context_inputs_jit(params, batch, emb)
        return self._context_layers_jit(tokens, mask, rotation), mask

    def _context_positions(self, mask):
        if self.config.right_anchored_rope:
            return right_anchored_rope_positions(mask, self.config.history_seq_len, 1)
        return jnp.arange(mask.shape[1], dtype=jnp.float32)[None, :]

    def _candidate_positions(self, mask, first_index):
        """Candidate i of the request sits at position T + i (or history_end when anchored)."""
        seq = 1 + self.config.history_seq_len
        if self.config.right_anchored_rope:
            return jnp.where(mask, float(seq), 0.0)
        index = jnp.arange(mask.shape[1], dtype=jnp.float32)[None, :]
        return seq + first_index + index

    def _candidate_rotation_fn(self, mask, first_index) -> Rotation:
        positions = self._candidate_positions(mask, first_index)  # [B|1, C]
        return rope_rotation(positions, self.shape.key_size)

    def _chunk_fn(self, tables, cache, context_mask, inputs: CandidateInputs, rotation):
        granularity = self.config.post_age_granularity_mins
        tokens = candidate_tokens(inputs, tables, granularity).astype(self.dtype)  # [B, C, D]
        mask = inputs.valid  # [B, C]
        h = candidate_layers(tokens, mask, rotation, context_mask, cache, self.layers, self.shape)
        h = rms_normalize(h, self.final_norm).astype(jnp.float32)  # [B, C, D]
        logits = jnp.dot(h, self.unembed)  # [B, C, A]
        continuous = jax.nn.sigmoid(jnp.dot(h, self.continuous))  # [B, C, N]
        return logits, continuous

    # -- host-side orchestration ----------------------------------------------------------

    def _context_inputs(self, batch: RecsysBatch, emb: RecsysEmbeddings, rows: int):
        """User and history fields padded to ``rows`` users; candidate fields left out."""

        def pad(x, dtype):
            return _pad_axis(np.asarray(x, dtype), 0, rows)

        continuous = batch.history_continuous_actions
        if continuous is None:  # zeros are what the model uses for None (dwell 0 s)
            users, seq = np.shape(batch.history_product_surface)
            continuous = np.zeros((users, seq, self.config.num_continuous_actions), np.float32)
        context = RecsysBatch(
            user_hashes=pad(batch.user_hashes, np.int32),
            history_post_hashes=pad(batch.history_post_hashes, np.int32),
            history_author_hashes=pad(batch.history_author_hashes, np.int32),
            history_actions=pad(batch.history_actions, np.float32),
            history_product_surface=pad(batch.history_product_surface, np.int32),
            candidate_post_hashes=None,
            candidate_author_hashes=None,
            candidate_product_surface=None,
            history_continuous_actions=pad(continuous, np.float32),
            candidate_impr_ts=None,
            candidate_post_creation_ts=None,
            user_ip_hashes=None,
        )
        context_emb = RecsysEmbeddings(
            user_embeddings=pad(emb.user_embeddings, np.float32),
            history_post_embeddings=pad(emb.history_post_embeddings, np.float32),
            history_author_embeddings=pad(emb.history_author_embeddings, np.float32),
            candidate_post_embeddings=None,
            candidate_author_embeddings=None,
        )
        return context, context_emb

    def _candidate_inputs(self, batch, emb, start: int, stop: int, rows: int) -> CandidateInputs:
        """Candidates [start, stop) of every user, padded to ``rows`` x a chunk bucket."""
        width = bucket_for(stop - start, self.candidate_buckets)

        def cut(x, dtype):
            return _pad_axis(_pad_axis(np.asarray(x[:, start:stop], dtype), 1, width), 0, rows)

        def pad(x):  # x already holds only this chunk's candidates
            return _pad_axis(_pad_axis(x, 1, width), 0, rows)

        post_hashes = np.asarray(batch.candidate_post_hashes)[:, start:stop]  # [B, c, nI]
        impr, created = batch.candidate_impr_ts, batch.candidate_post_creation_ts
        if impr is None or created is None:  # timestamp 0 = unknown age, as the model's None
            impr = created = pad(np.zeros(post_hashes.shape[:2], np.int32))
        else:
            impr, created = cut(impr, np.int32), cut(created, np.int32)
        return CandidateInputs(
            valid=pad(post_hashes[:, :, 0] != 0),
            product_surface=cut(batch.candidate_product_surface, np.int32),
            impr_ts=impr,
            creation_ts=created,
            post_embeddings=cut(emb.candidate_post_embeddings, np.float32),
            author_embeddings=cut(emb.candidate_author_embeddings, np.float32),
        )

    def score(self, batch: RecsysBatch, emb: RecsysEmbeddings) -> RankingScores:
        """Logits and continuous predictions for every candidate of every user.

        ``batch`` may hold any number of users (split into batch buckets of at most
        ``users_per_call`` users) and any number of candidates (scored in chunks of the
        largest candidate bucket).
        """
        users = np.asarray(batch.user_hashes).shape[0]
        num_candidates = np.asarray(batch.candidate_post_hashes).shape[1]
        per_call = self.users_per_call(num_candidates)
        buckets = [b for b in self.batch_buckets if b <= per_call]
        logits, continuous = [], []
        for rows, pad_to in batch_slices(users, buckets):
            sub_b, sub_e = _take_users(batch, emb, rows)
            out = self._score_users(sub_b, sub_e, num_candidates, pad_to)
            logits.append(out.logits)
            continuous.append(out.continuous_preds)
        if not logits:  # no users
            return RankingScores(
                np.zeros((0, num_candidates, self.unembed.shape[1]), np.float32),
                np.zeros((0, num_candidates, self.continuous.shape[1]), np.float32),
            )
        return RankingScores(np.concatenate(logits), np.concatenate(continuous))

    def _score_users(self, batch, emb, num_candidates: int, rows: int) -> RankingScores:
        users = np.asarray(batch.user_hashes).shape[0]
        context, context_emb = self._context_inputs(batch, emb, rows)
        cache, context_mask = self._encode_context(self.params, context, context_emb)
        logits, continuous = [], []
        pending = []  # dispatch every chunk before reading any: they run asynchronously
        for start in range(0, num_candidates, self.chunk):
            stop = min(num_candidates, start + self.chunk)
            inputs = self._candidate_inputs(batch, emb, start, stop, rows)
            rotation = self._candidate_rotation(inputs.valid, np.float32(start))
            out = self._score_chunk(self.candidate_tables, cache, context_mask, inputs, rotation)
            pending.append((out, stop - start))
        for (lg, ct), width in pending:
            logits.append(np.asarray(lg)[:users, :width])
            continuous.append(np.asarray(ct)[:users, :width])
        if not logits:  # zero candidates
            empty = lambda n: np.zeros((users, 0, n), np.float32)  # noqa: E731
            return RankingScores(empty(self.unembed.shape[1]), empty(self.continuous.shape[1]))
        return RankingScores(np.concatenate(logits, axis=1), np.concatenate(continuous, axis=1))

    def users_per_call(self, num_candidates: int) -> int:
        """The largest batch bucket whose chunk call stays within ``max_rows`` rows."""
        width = bucket_for(max(1, min(num_candidates, self.chunk)), self.candidate_buckets)
        if self.max_rows is None:
            return self.batch_buckets[-1]
        fitting = [b for b in self.batch_buckets if b * width <= self.max_rows]
        return fitting[-1] if fitting else self.batch_buckets[0]

    def warm_up(self) -> int:
        """Compile every (batch bucket, candidate bucket) shape that ``score`` can use;
        returns how many."""
        compiled = 0
        for width in self.candidate_buckets:
            for rows in self.batch_buckets:
                if rows <= self.users_per_call(width):
                    self.score(*example_inputs(self.config, rows, width))
                    compiled += 1
        return compiled


def _take_users(batch: RecsysBatch, emb: RecsysEmbeddings, rows: slice):
    take = lambda x: None if x is None else np.asarray(x)[rows]  # noqa: E731
    return (
        RecsysBatch(*[take(x) for x in batch]),
        RecsysEmbeddings(**{f.name: take(getattr(emb, f.name)) for f in dataclasses.fields(emb)}),
    )


def example_inputs(
    config, users: int, candidates: int, *, with_continuous=False, with_timestamps=False, seed=0
):
    """Random valid (batch, embeddings) of the config's shapes, for warm-up and tests."""
    rng = np.random.default_rng(seed)
    hashes = config.hash_config
    S, D = config.history_seq_len, config.emb_size
    num_actions = getattr(config, "num_actions", 19)
    ints = lambda *shape: rng.integers(1, 1000, size=shape).astype(np.int32)  # noqa: E731
    normal = lambda *shape: rng.normal(size=shape + (D,)).astype(np.float32)  # noqa: E731
    batch = RecsysBatch(
        user_hashes=ints(users, hashes.num_user_hashes),
        history_post_hashes=ints(users, S, hashes.num_item_hashes),
        history_author_hashes=ints(users, S, hashes.num_author_hashes),
        history_actions=(rng.random((users, S, num_actions)) > 0.7).astype(np.float32),
        history_product_surface=rng.integers(0, config.product_surface_vocab_size, (users, S)),
        candidate_post_hashes=ints(users, candidates, hashes.num_item_hashes),
        candidate_author_hashes=ints(users, candidates, hashes.num_author_hashes),
        candidate_product_surface=rng.integers(
            0, config.product_surface_vocab_size, (users, candidates)
        ),
        history_continuous_actions=(
            rng.exponential(10.0, (users, S, 8)).astype(np.float32) if with_continuous else None
        ),
        candidate_impr_ts=(
            np.full((users, candidates), 1_700_000_000, np.int64) if with_timestamps else None
        ),
        candidate_post_creation_ts=(
            1_700_000_000 - rng.integers(0, 100 * 3600, (users, candidates))
            if with_timestamps
            else None
        ),
    )
    emb = RecsysEmbeddings(
        user_embeddings=normal(users, hashes.num_user_hashes),
        history_post_embeddings=normal(users, S, hashes.num_item_hashes),
        candidate_post_embeddings=normal(users, candidates, hashes.num_item_hashes),
        history_author_embeddings=normal(users, S, hashes.num_author_hashes),
        candidate_author_embeddings=normal(users, candidates, hashes.num_author_hashes),
    )
    return batch, emb


# ----------------------------------------------------------------------------------------
# Retrieval
# ----------------------------------------------------------------------------------------


class RetrievalEngine:
    """Jitted user tower, candidate tower and exact top-k over a corpus."""

    def __init__(
        self,
        config: PhoenixRetrievalModelConfig,
        params,
        *,
        compute_dtype=None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        top_k_buckets: Sequence[int] = DEFAULT_TOP_K_BUCKETS,
        candidate_chunk: int = 256,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.params = params
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.top_k_buckets = tuple(sorted(top_k_buckets))
        self.candidate_chunk = candidate_chunk
        model = lambda: self.config.make()  # noqa: E731
        apply = lambda fn: hk.without_apply_rng(hk.transform(fn)).apply  # noqa: E731
        self._users = jax.jit(apply(lambda b, e: model().build_user_representation(b, e)[0]))
        tower = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"
        self._tower = params.get(tower)
        self._candidates = jax.jit(self._candidate_fn)
        self._top_k = jax.jit(self._top_k_fn, static_argnames="k")
        self.corpus: Optional[jax.Array] = None

    def _candidate_fn(self, tower, post_emb, author_emb):
        stacked = jnp.concatenate([post_emb, author_emb], axis=-2)  # [n, h, D]
        if tower is None:  # mean-pooling tower: no parameters
            return l2_normalize(jnp.mean(stacked.astype(jnp.float32), axis=-2))
        w1, w2 = tower["candidate_tower_projection_1"], tower["candidate_tower_projection_2"]
        return candidate_tower_mlp(stacked.reshape(stacked.shape[0], -1), w1, w2)  # [n, D]

    @staticmethod
    def _top_k_fn(users, corpus, valid, k):
        scores = jnp.dot(users.astype(corpus.dtype), corpus.T).astype(jnp.float32)  # [B, M]
        scores = jnp.where(valid, scores, -INF)
        return jax.lax.top_k(scores, k)

    def encode_users(self, batch: RecsysBatch, emb: RecsysEmbeddings) -> np.ndarray:
        """Unit user vectors [B, D] (float32)."""
        out = []
        pad = lambda x, to: None if x is None else _pad_axis(np.asarray(x), 0, to)  # noqa: E731
        hashes = self.config.hash_config
        for rows, pad_to in batch_slices(
            np.asarray(batch.user_hashes).shape[0], self.batch_buckets
        ):
            sub_b, sub_e = _take_users(batch, emb, rows)
            # The user tower reads no candidate or optional field: give it one fixed
            # structure (dtype and shape) so that warm-up compiles what serving runs.
            sub_b = RecsysBatch(
                user_hashes=pad(np.asarray(sub_b.user_hashes, np.int32), pad_to),
                history_post_hashes=pad(np.asarray(sub_b.history_post_hashes, np.int32), pad_to),
                history_author_hashes=pad(
                    np.asarray(sub_b.history_author_hashes, np.int32), pad_to
                ),
                history_actions=pad(np.asarray(sub_b.history_actions, np.float32), pad_to),
                history_product_surface=pad(
                    np.asarray(sub_b.history_product_surface, np.int32), pad_to
                ),
                candidate_post_hashes=np.zeros((pad_to, 1, hashes.num_item_hashes), np.int32),
                candidate_author_hashes=np.zeros((pad_to, 1, hashes.num_author_hashes), np.int32),
                candidate_product_surface=np.zeros((pad_to, 1), np.int32),
            )
            d = self.config.emb_size
            sub_e = RecsysEmbeddings(
                user_embeddings=pad(np.asarray(sub_e.user_embeddings, np.float32), pad_to),
                history_post_embeddings=pad(
                    np.asarray(sub_e.history_post_embeddings, np.float32), pad_to
                ),
                history_author_embeddings=pad(
                    np.asarray(sub_e.history_author_embeddings, np.float32), pad_to
                ),
                candidate_post_embeddings=np.zeros(
                    (pad_to, 1, hashes.num_item_hashes, d), np.float32
                ),
                candidate_author_embeddings=np.zeros(
                    (pad_to, 1, hashes.num_author_hashes, d), np.float32
                ),
            )
            users = np.asarray(self._users(self.params, sub_b, sub_e), np.float32)
            out.append(users[: rows.stop - rows.start])
        return np.concatenate(out) if out else np.zeros((0, self.config.emb_size), np.float32)

    def encode_candidates(self, post_emb: np.ndarray, author_emb: np.ndarray) -> np.ndarray:
        """Unit candidate vectors [n, D] from hash embeddings [n, nI, D] and [n, nA, D]."""
        n, chunk = post_emb.shape[0], self.candidate_chunk
        out = []
        for start in range(0, n, chunk):
            p = _pad_axis(post_emb[start : start + chunk], 0, chunk)
            a = _pad_axis(author_emb[start : start + chunk], 0, chunk)
            out.append(np.asarray(self._candidates(self._tower, p, a), np.float32))
        if not out:
            return np.zeros((0, self.config.emb_size), np.float32)
        return np.concatenate(out)[:n]

    def set_corpus(self, embeddings: np.ndarray) -> None:
        """Place the corpus [M, D] on the device in the compute dtype."""
        self.corpus = jnp.asarray(embeddings, self.dtype)

    def top_k(self, users: np.ndarray, k: int, exclude: Optional[np.ndarray] = None):
        """Best ``k`` corpus indices and scores per user [B, k'] (k' = min(k, M)), best first.

        ``exclude`` [B, M] bool marks entries a user must not get (e.g. already seen).
        """
        if self.corpus is None:
            raise ValueError("no corpus set")
        size = self.corpus.shape[0]
        k = min(k, size)
        kb = min(bucket_for(k, self.top_k_buckets), size)
        indices, scores = [], []
        for rows, pad_to in batch_slices(users.shape[0], self.batch_buckets):
            valid = np.ones((pad_to, size), bool)
            if exclude is not None:
                valid = ~_pad_axis(exclude[rows], 0, pad_to)
            s, i = self._top_k(_pad_axis(users[rows], 0, pad_to), self.corpus, valid, k=kb)
            n = rows.stop - rows.start
            indices.append(np.asarray(i)[:n, :k])
            scores.append(np.asarray(s)[:n, :k])
        if not indices:
            return np.zeros((0, k), np.int32), np.zeros((0, k), np.float32)
        return np.concatenate(indices), np.concatenate(scores)

    def warm_up(self) -> int:
        """Compile user-tower batch buckets, the candidate chunk and top-k buckets."""
        compiled = 0
        for rows in self.batch_buckets:
            self.encode_users(*example_inputs(self.config, rows, 1))
            compiled += 1
            if self.corpus is not None:
                for k in self.top_k_buckets:
                    if k <= self.corpus.shape[0] or k == self.top_k_buckets[0]:
                        self.top_k(np.zeros((rows, self.config.emb_size), np.float32), k)
                        compiled += 1
        hashes = self.config.hash_config
        d = self.config.emb_size
        self.encode_candidates(
            np.zeros((1, hashes.num_item_hashes, d), np.float32),
            np.zeros((1, hashes.num_author_hashes, d), np.float32),
        )
        return compiled + 1


def _dense_flops_per_token(config: PhoenixModelConfig) -> float:
    """Q/K/V/O projections and the gated FFN, per token and layer."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    projections = 2 * D * d * (tc.num_q_heads * 2 + tc.num_kv_heads * 2)
    return projections + 2 * 3 * D * ffn_size(D, tc.widening_factor)


def flops_per_candidate(config: PhoenixModelConfig) -> float:
    """Approximate FLOPs the engine spends per scored candidate (transformer + heads)."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    T = 1 + config.history_seq_len
    attention = 2 * 2 * tc.num_q_heads * d * (T + 1)
    hashes = config.hash_config.num_item_hashes + config.hash_config.num_author_hashes
    inputs = 2 * D * D * hashes  # surface and post age are pre-projected lookups
    heads = 2 * D * (config.num_actions + config.num_continuous_actions)
    return tc.num_layers * (_dense_flops_per_token(config) + attention) + inputs + heads


def flops_per_context(config: PhoenixModelConfig) -> float:
    """Approximate FLOPs of one user's context pass."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    T = 1 + config.history_seq_len
    attention = 2 * 2 * tc.num_q_heads * d * T * T
    inputs = T * 2 * D * D * 7
    return tc.num_layers * (T * _dense_flops_per_token(config) + attention) + inputs


__all__ = [
    "RankingEngine",
    "RetrievalEngine",
    "RankingScores",
    "bucket_for",
    "example_inputs",
    "flops_per_candidate",
    "flops_per_context",
]
