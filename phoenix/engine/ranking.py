"""Ranking with a cached context: any number of candidates per user, scored in chunks.

Ranking exploits candidate isolation: the user + history tokens (the *context*) never attend
to candidates, so their per-layer keys and values are computed once per user and every
candidate is then scored against that cache, attending to the context and to itself only.
That turns the (1 + S + C)^2 attention of the plain model into (1 + S)^2 + C * (1 + S + 1)
and lets any number of candidates be scored in fixed-size chunks, with results equal to the
plain model's (``PhoenixModel``) whatever the chunking or the batch composition.

Every jitted function is compiled for a small set of bucketed shapes (batch size, candidate
chunk) by ``warm_up()``, so no request pays for a compilation later.

Shape glossary
  B  users in a call (padded to a batch bucket)   S  history_seq_len
  T  context length 1 + S                          C  candidates in a chunk (a chunk bucket)
  D  emb_size   A  num_actions   N  continuous outputs (8)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine.batching import (
    DEFAULT_BATCH_BUCKETS,
    batch_slices,
    bucket_for,
    default_compute_dtype,
    default_max_rows_per_call,
    pad_axis,
)
from phoenix.engine.kernels import (
    AttentionShape,
    CandidateInputs,
    Rotation,
    candidate_layers,
    candidate_tokens,
    context_layers,
    context_positions,
    ranker_weights,
    rope_rotation,
)
from phoenix.grok import rms_normalize
from phoenix.recsys_model import PhoenixModelConfig, RecsysBatch, RecsysEmbeddings


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
        candidate_buckets: Sequence[int],
        max_rows_per_call: Optional[int] = None,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.candidate_buckets = tuple(sorted(candidate_buckets))
        # None: the platform's default (a limit on CPUs, none on accelerators)
        self.max_rows = max_rows_per_call or default_max_rows_per_call()
        self.chunk = self.candidate_buckets[-1]
        self.params = jax.device_put(params)  # moved once, not with every call
        self.shape = AttentionShape.of(config)
        weights = ranker_weights(params, config, self.dtype)
        self.layers, self.candidate_tables = weights.layers, weights.candidates
        self.final_norm, self.unembed = weights.final_norm, weights.unembed
        self.continuous = jnp.asarray(
            params["phoenix_model"]["continuous_unembeddings"], jnp.float32
        )
        self._context_tokens = _model_method(self.config, "build_context_inputs")
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
        rotation = rope_rotation(context_positions(mask, self.config), self.shape.key_size)
        return tokens, mask, rotation

    def _context_layers_fn(self, tokens, mask, rotation):
        """The per-layer kv cache of the context (rotation computed by the previous program)."""
        return context_layers(tokens, mask, rotation, self.layers, self.shape)

    def _encode_context(self, params, batch: RecsysBatch, emb: RecsysEmbeddings):
        """(kv cache, context mask) of the users in ``batch``."""
        tokens, mask, rotation = self._context_inputs_jit(params, batch, emb)
        return self._context_layers_jit(tokens, mask, rotation), mask

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
            return pad_axis(np.asarray(x, dtype), 0, rows)

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
            return pad_axis(pad_axis(np.asarray(x[:, start:stop], dtype), 1, width), 0, rows)

        def pad(x):  # x already holds only this chunk's candidates
            return pad_axis(pad_axis(x, 1, width), 0, rows)

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
