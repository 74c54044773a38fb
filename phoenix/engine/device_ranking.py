"""The ranking engine of the Phoenix ranker: the cached-context passes on the device.

Ranking exploits candidate isolation: the user + history tokens (the *context*) never attend
to candidates, so their per-layer keys and values are computed once per user and every
candidate is then scored against that cache, attending to the context and to itself only, in
chunks of the largest candidate bucket. Results equal the plain model's (``PhoenixModel``)
whatever the chunking or the batch composition.

``DeviceRanker`` runs that body from two kinds of input, each a program per (batch bucket,
candidate width) compiled (or loaded from a ``ProgramStore``) by warm-up:

- ``rank``: what the ranker serves. A request batch of raw ids runs two programs back to back
  without a host round trip between them:

  1. ``hash``: the multiply-add-mod hashes of every user, post and author id and their rows
     in the stacked embedding table. It runs with 64-bit integers (the hash wraps in int64,
     as the original computes it), so it is a program of its own: JAX fixes the integer
     width of a whole program when it traces it.
  2. ``rank``: the embedding lookups in the device-resident table, the context pass, every
     candidate chunk against the cached context, the sigmoid blend of action probabilities
     and a stable descending sort per user. Padding candidates (post id 0) sort last.

  The host only stacks and pads the batch's inputs and splits the outputs per request.
  The request batch is the serving layer's padded batch of the ranker's contract
  (``ranking_inputs``). With a prefix cache ``rank`` runs the programs of ``prefix_ranking``
  instead: the users' prefixes kept across calls, the context computed for the misses only.
- ``score``: the original model's inputs (hashes and their embeddings, ``RecsysBatch`` and
  ``RecsysEmbeddings``) in, logits and continuous predictions out: the API path, checked
  against the original's reference outputs and benchmarked against it.

Shape glossary
  B  users (a batch bucket)   S  history_seq_len   T  1 + S   C  candidates (a bucket)
  D  emb_size   A  num_actions   N  continuous outputs (8)
  nU / nI / nA  user / item / author hashes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine import kernels
from phoenix.engine.batching import (
    DEFAULT_BATCH_BUCKETS,
    batch_slices,
    bucket_for,
    default_compute_dtype,
    default_joint_rows,
    default_max_rows_per_call,
    example_inputs,
    take_users,
)
from phoenix.engine.prefix_cache import PrefixCache
from phoenix.engine.prefix_ranking import PrefixCachedRanker
from phoenix.engine.programs import Program, ProgramStore, prepare_all
from phoenix.engine.ranking_inputs import (
    RankedBatch,
    context_inputs,
    feature_inputs,
    hash_on_device,
    id_inputs,
    ranked_outputs,
    table_lookup,
)
from phoenix.engine.score_inputs import candidate_features, context_features
from phoenix.grok import rms_normalize
from phoenix.hashing import EntityHash
from phoenix.recsys_model import (
    REFERENCE_TIME,
    PhoenixModelConfig,
    RecsysBatch,
    RecsysEmbeddings,
)


class RankingScores(NamedTuple):
    """The model's outputs for every candidate of every user, in the candidates' order."""

    logits: np.ndarray  # [B, C, A] float32
    continuous_preds: np.ndarray  # [B, C, N] float32


def context_tokens_program(config: PhoenixModelConfig):
    """Haiku-applied ``PhoenixModel.build_context_inputs``: the context tokens exactly as the
    model builds them, as a function of (params, batch, embeddings)."""
    return hk.without_apply_rng(
        hk.transform(lambda batch, emb: config.make().build_context_inputs(batch, emb))
    ).apply


def padding_at_position_zero(rotation: kernels.Rotation, valid) -> kernels.Rotation:
    """``rotation`` [1, c, 1, d] with the padding candidates of ``valid`` [B, c] at position 0
    (cos 1, sin 0), as the model's right-anchored positions place them."""
    keep = valid[:, :, None, None]
    return kernels.Rotation(jnp.where(keep, rotation.cos, 1.0), jnp.where(keep, rotation.sin, 0.0))


class DeviceRanker:
    """The ranker's cached-context passes: ``rank`` from raw ids (served), ``score`` from
    hashed features (the API path); one program per bucket for each."""

    def __init__(
        self,
        config: PhoenixModelConfig,
        params,
        table: Optional[np.ndarray] = None,
        entities: Optional[dict[str, EntityHash]] = None,
        weights: Optional[np.ndarray] = None,
        *,
        compute_dtype=None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        candidate_buckets: Sequence[int],
        max_rows_per_call: Optional[int] = None,
        joint_rows: Optional[int] = None,
        store: Optional[ProgramStore] = None,
        prefix_cache: Optional[PrefixCache] = None,
    ):
        """``table`` (the stacked embedding table [rows, D]), ``entities`` (the id hashes by
        entity) and ``weights`` (the blend of action probabilities [A]) are what ``rank``
        needs besides the model; an engine built without them only ``score``s. With a
        ``prefix_cache``, ``rank`` keeps the users' prefixes in it across calls
        (``prefix_ranking``)."""
        given = [x is not None for x in (table, entities, weights)]
        if any(given) and not all(given):
            raise ValueError(
                "DeviceRanker: table, entities and weights go together (rank needs all three); "
                "give none of them for an engine that only scores hashed features"
            )
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.candidate_buckets = tuple(sorted(candidate_buckets))
        self.chunk = self.candidate_buckets[-1]
        # Users per candidate pass: on CPUs big [users, heads, rows, T] arrays spill the caches.
        self.max_rows = max_rows_per_call or default_max_rows_per_call()
        # Batches of at most this many users x candidates run context and candidates as one
        # pass (``kernels.joint_layers``): fewer, larger kernels where launches bound the time.
        self.joint_rows = default_joint_rows() if joint_rows is None else joint_rows
        self.entities = entities
        self.shape = kernels.AttentionShape.of(config)
        self.weights = {
            "params": jax.device_put(params),  # moved once, not with every call
            **kernels.ranker_weights(params, config, self.dtype)._asdict(),
        }
        if table is not None:
            self.weights["table"] = jnp.asarray(table, jnp.float32)  # [rows, D], on the device
            self.weights["blend"] = jnp.asarray(weights, jnp.float32)  # [A]
        self._context_tokens = context_tokens_program(self.config)
        self._hash = Program("ranker_hash", self._hash_fn, store, x64=True)
        # What shapes the ranking programs besides their inputs (the config is the store's).
        settings = {
            "dtype": jnp.dtype(self.dtype).name,
            "chunk": self.chunk,
            "max_rows": self.max_rows,
            "joint_rows": self.joint_rows,
        }
        self.store, self.settings = store, settings  # the prefix cache's programs share them
        self._rank = Program("ranker", self._rank_fn, store, settings=settings)
        self._score = Program("ranker_scores", self._score_fn, store, settings=settings)
        self.prefix = None if prefix_cache is None else PrefixCachedRanker(self, prefix_cache)

    # -- programs ------------------------------------------------------------------------

    def _hash_fn(self, users, history_posts, history_authors, candidate_posts, candidate_authors):
        e = self.entities
        assert e is not None  # rank's programs run after _check_ranks_raw_ids
        return {
            "user": hash_on_device(users[:, None], e["user"]),  # [B, 1, nU] -> squeezed later
            "history_post": hash_on_device(history_posts, e["item"]),  # [B, S, nI]
            "history_author": hash_on_device(history_authors, e["author"]),  # [B, S, nA]
            "candidate_post": hash_on_device(candidate_posts, e["item"]),  # [B, C, nI]
            "candidate_author": hash_on_device(candidate_authors, e["author"]),  # [B, C, nA]
        }

    def _rank_fn(self, weights, hashed, inputs: dict):
        lookup = table_lookup(weights["table"])
        context, context_emb = context_inputs(hashed, inputs, lookup)
        candidates = self.candidate_inputs(hashed, inputs, lookup)
        # the continuous predictions are not served: XLA drops their computation
        logits, _ = self._passes(weights, context, context_emb, candidates, model_padding=False)
        return ranked_outputs(logits, candidates.valid, weights["blend"])

    def candidate_inputs(self, hashed, inputs: dict, lookup) -> kernels.CandidateInputs:
        age_seconds = inputs["candidate_post_age_seconds"]  # [B, C]
        has_age = jnp.broadcast_to(inputs["age_sent"][:, None], age_seconds.shape)  # [B, C]
        age = jnp.floor(age_seconds).astype(jnp.int32)
        return kernels.CandidateInputs(
            valid=hashed["candidate_post"][0][:, :, 0] != 0,  # [B, C]
            product_surface=inputs["candidate_product_surface"],
            impr_ts=jnp.where(has_age, REFERENCE_TIME, 0).astype(jnp.int32),
            creation_ts=jnp.where(has_age, REFERENCE_TIME - age, 0).astype(jnp.int32),
            post_embeddings=lookup(hashed["candidate_post"][1]),  # [B, C, nI, D]
            author_embeddings=lookup(hashed["candidate_author"][1]),  # [B, C, nA, D]
        )

    def _score_fn(self, weights, context, context_emb, candidates: kernels.CandidateInputs):
        """The model's outputs for every candidate, padding candidates included."""
        return self._passes(weights, context, context_emb, candidates, model_padding=True)

    def _passes(
        self,
        weights,
        context: RecsysBatch,
        context_emb: RecsysEmbeddings,
        candidates: kernels.CandidateInputs,
        *,
        model_padding: bool,
    ):
        """Logits [B, C, A] and continuous predictions [B, C, N]: the context pass once, then
        every candidate against its kv cache.

        ``model_padding``: padding candidates (hash 0) get the model's RoPE position too (0
        when right-anchored), so their outputs equal the model's; ranking drops them, and
        keeps its candidate rotation a constant of the program.
        """
        tokens, mask = self._context_tokens(weights["params"], context, context_emb)  # [B,T,D]
        rotation = kernels.rope_rotation(
            kernels.context_positions(mask, self.config), self.shape.key_size
        )
        if self.runs_joint(*candidates.valid.shape):
            return self._joint_pass(weights, tokens, mask, rotation, candidates, model_padding)
        cache = kernels.context_layers(tokens, mask, rotation, weights["layers"], self.shape)
        return self.score_candidates(weights, cache, mask, candidates, model_padding)

    def context_cache(self, weights, context: RecsysBatch, context_emb: RecsysEmbeddings):
        """(per-layer (keys, values) [B, T, K, d] each, context mask [B, T]): the context
        pass alone, what the candidates' pass attends to (the prefix cache keeps it)."""
        tokens, mask = self._context_tokens(weights["params"], context, context_emb)  # [B,T,D]
        rotation = kernels.rope_rotation(
            kernels.context_positions(mask, self.config), self.shape.key_size
        )
        return kernels.context_layers(tokens, mask, rotation, weights["layers"], self.shape), mask

    def runs_joint(self, users: int, width: int) -> bool:
        """Whether a program of ``users`` x ``width`` candidates runs the joint pass."""
        return width <= self.chunk and users * width <= self.joint_rows

    def _joint_pass(
        self, weights, tokens, context_mask, context_rotation, candidates, model_padding
    ):
        """(logits, continuous) from context and candidates as one sequence: what the cached
        passes compute, in one pass of every layer instead of two."""
        users, width = candidates.valid.shape
        seq = tokens.shape[1]
        rotation = self._candidate_rotation(width, 0)
        if model_padding and self.config.right_anchored_rope:
            rotation = padding_at_position_zero(rotation, candidates.valid)
        both = [
            jnp.concatenate(
                [jnp.broadcast_to(x, (users, *x.shape[1:])) for x in (ctx, cand)], axis=1
            )  # [B, T + C, 1, d]
            for ctx, cand in zip(context_rotation, rotation)
        ]
        granularity = self.config.post_age_granularity_mins
        candidate_tokens = kernels.candidate_tokens(candidates, weights["candidates"], granularity)
        joint = jnp.concatenate([tokens, candidate_tokens.astype(self.dtype)], axis=1)
        allowed = kernels.isolation_mask(context_mask, candidates.valid)  # [B, T+C, T+C]
        h = kernels.joint_layers(
            joint, allowed, kernels.Rotation(*both), weights["layers"], self.shape
        )  # [B, T + C, D]
        return self._outputs(weights, h[:, seq:])

    def _outputs(self, weights, h):
        """Logits [B, c, A] and continuous predictions [B, c, N] of final hidden states."""
        h = rms_normalize(h, weights["final_norm"]).astype(jnp.float32)  # [B, c, D]
        logits = jnp.dot(h, weights["unembed"])  # [B, c, A]
        return logits, jax.nn.sigmoid(jnp.dot(h, weights["continuous"]))  # [B, c, N]

    def score_candidates(
        self, weights, cache, context_mask, candidates: kernels.CandidateInputs, model_padding
    ):
        """(logits, continuous), candidates in chunks and users in groups of at most
        ``users_per_pass``.

        The whole groups run as one loop on the device (``lax.map``: one compiled body), a
        smaller last group after it: unrolled, each group was another copy of every layer in
        the program, and a CPU program's compile grew with its batch bucket (8 x 1024
        candidates, four groups of two users: docs/performance.md, "Start-up")."""
        users, count = candidates.valid.shape
        limit = self.users_per_pass(count)
        group = users if limit is None else min(users, limit)
        whole = users - users % group  # users in whole groups

        def score(group_cache, group_mask, group_candidates):
            return self._score_chunks(
                weights, group_cache, group_mask, group_candidates, model_padding
            )

        inputs = (cache, context_mask, candidates)
        if whole == group:  # one whole group (always on a GPU: no row limit): no loop at all
            outputs = [score(*jax.tree.map(lambda x: x[:group], inputs))]
        else:
            grouped = jax.tree.map(  # [groups, group, ...] each
                lambda x: x[:whole].reshape(whole // group, group, *x.shape[1:]), inputs
            )
            looped = jax.lax.map(lambda xs: score(*xs), grouped)  # [groups, group, c, ...]
            outputs = [jax.tree.map(lambda y: y.reshape(whole, *y.shape[2:]), looped)]
        if whole < users:
            outputs.append(score(*jax.tree.map(lambda x: x[whole:], inputs)))
        return tuple(jnp.concatenate(parts, axis=0) for parts in zip(*outputs))

    def _score_chunks(
        self, weights, cache, context_mask, candidates: kernels.CandidateInputs, model_padding
    ):
        """(logits, continuous) of one group of users, their candidates in chunks of at most
        ``chunk`` (several only on the ``score`` path: requests fit the largest bucket)."""
        count = candidates.valid.shape[1]
        chunk = min(count, self.chunk)
        chunks = []
        for start in range(0, count, chunk):
            part = kernels.CandidateInputs(*(x[:, start : start + chunk] for x in candidates))
            chunks.append(
                self._score_chunk(weights, cache, context_mask, part, start, model_padding)
            )
        return tuple(jnp.concatenate(outputs, axis=1) for outputs in zip(*chunks))

    def _score_chunk(
        self, weights, cache, context_mask, part: kernels.CandidateInputs, start, model_padding
    ):
        granularity = self.config.post_age_granularity_mins
        tokens = kernels.candidate_tokens(part, weights["candidates"], granularity).astype(
            self.dtype
        )
        rotation = self._candidate_rotation(part.valid.shape[1], start)
        if model_padding and self.config.right_anchored_rope:
            rotation = padding_at_position_zero(rotation, part.valid)
        h = kernels.candidate_layers(
            tokens, part.valid, rotation, context_mask, cache, weights["layers"], self.shape
        )
        return self._outputs(weights, h)

    def _candidate_rotation(self, width: int, start: int) -> kernels.Rotation:
        """cos/sin of candidate positions as constants of the program.

        Positions do not depend on the data (T + index, or T for every candidate when
        right-anchored; padding is masked anyway), and constants keep XLA from fusing and
        re-evaluating cos/sin for every head of every layer.
        """
        seq = 1 + self.config.history_seq_len
        if self.config.right_anchored_rope:
            positions = np.full((1, width), seq, np.float32)
        else:
            positions = (seq + start + np.arange(width, dtype=np.float32))[None, :]
        with jax.ensure_compile_time_eval():
            rotation = kernels.rope_rotation(jnp.asarray(positions), self.shape.key_size)
        return kernels.Rotation(np.asarray(rotation.cos), np.asarray(rotation.sin))

    # -- host side: buckets, raw ids --------------------------------------------------------

    def padded_shape(self, users: int, candidates: int) -> tuple[int, int]:
        """(batch bucket, candidate width) a batch of this size is padded to."""
        width = bucket_for(max(1, candidates), self.candidate_buckets)
        if candidates > self.chunk:  # several chunks of the largest bucket
            width = -(-candidates // self.chunk) * self.chunk
        return bucket_for(users, self.batch_buckets), width

    def users_per_pass(self, width: int) -> Optional[int]:
        """Users whose candidates a chunk pass scores together when ``width`` candidates are
        padded to: ``max_rows`` rows at most, one user at least; None without a row limit."""
        if self.max_rows is None:
            return None
        return max(1, self.max_rows // min(width, self.chunk))

    def rank(self, batch, rows: Optional[int] = None) -> RankedBatch:
        """Rank every user's candidates; ``batch`` (the ranker's padded request batch, module
        note above) must already be padded to a bucket shape. With a prefix cache, its first
        ``rows`` rows (None: all) are users whose prefixes it keeps, the rest padding."""
        self._check_ranks_raw_ids()
        if self.prefix is not None:
            return self.prefix.rank(batch, len(batch.user_id) if rows is None else rows)
        hashed = self._hash(*id_inputs(batch))
        order, scores, probs = self._rank(self.weights, hashed, feature_inputs(batch))
        return RankedBatch(np.asarray(order), np.asarray(scores), np.asarray(probs))

    def warm_up(self, empty_batch: Callable[[int, int], Any]) -> int:
        """Load (or compile) both programs for every (batch bucket, candidate bucket), from
        shapes alone: nothing runs. ``empty_batch(users, candidates)`` is an all-padding
        request batch of that shape. Returns how many buckets. With a prefix cache, its
        programs instead (``rank`` runs no other)."""
        self._check_ranks_raw_ids()
        if self.prefix is not None:
            return self.prefix.warm_up(empty_batch)
        batches = [
            empty_batch(users, width)
            for users in self.batch_buckets
            for width in self.candidate_buckets
        ]
        prepare_all([(self._hash, id_inputs(b)) for b in batches])
        hashed = [self._hash.output_shapes(*id_inputs(b)) for b in batches]
        prepare_all(
            [(self._rank, (self.weights, h, feature_inputs(b))) for h, b in zip(hashed, batches)]
        )
        return len(batches)

    def _check_ranks_raw_ids(self) -> None:
        if "table" not in self.weights:
            raise ValueError(
                "this DeviceRanker was built without an embedding table, entity hashes and "
                "blend weights: it scores hashed features (score) but cannot rank raw ids"
            )

    # -- host side: hashed features ------------------------------------------------------

    def score(self, batch: RecsysBatch, emb: RecsysEmbeddings) -> RankingScores:
        """Logits and continuous predictions for every candidate of every user.

        ``batch`` may hold any number of users (split into calls of at most the largest batch
        bucket) and any number of candidates (padded as ``padded_shape`` says).
        """
        users = np.shape(batch.user_hashes)[0]
        count = np.shape(batch.candidate_post_hashes)[1]
        pending = []  # dispatch every call before reading any: they run asynchronously
        for rows, pad_to in batch_slices(users, self.batch_buckets):
            inputs = self._score_inputs(*take_users(batch, emb, rows), pad_to)
            pending.append((self._score(self.weights, *inputs), rows.stop - rows.start))
        if not pending:  # no users
            return RankingScores(
                np.zeros((0, count, self.weights["unembed"].shape[1]), np.float32),
                np.zeros((0, count, self.weights["continuous"].shape[1]), np.float32),
            )
        logits = np.concatenate([np.asarray(lg)[:n, :count] for (lg, _), n in pending])
        continuous = np.concatenate([np.asarray(ct)[:n, :count] for (_, ct), n in pending])
        return RankingScores(logits, continuous)

    def _score_inputs(self, batch: RecsysBatch, emb: RecsysEmbeddings, rows: int):
        """(context, context embeddings, candidates) of the score program, padded to ``rows``
        users and the candidate width ``padded_shape`` gives."""
        _, width = self.padded_shape(rows, np.shape(batch.candidate_post_hashes)[1])
        return (
            *context_features(self.config, batch, emb, rows),
            candidate_features(batch, emb, rows, width),
        )

    def warm_up_score(self) -> int:
        """Load (or compile) the program of ``score`` for every (batch bucket, candidate
        bucket), from example inputs: nothing runs. Returns how many buckets."""
        buckets = [(u, w) for u in self.batch_buckets for w in self.candidate_buckets]
        examples = [(users, example_inputs(self.config, users, w)) for users, w in buckets]
        args = [(self.weights, *self._score_inputs(*ex, users)) for users, ex in examples]
        prepare_all([(self._score, a) for a in args])
        return len(buckets)
