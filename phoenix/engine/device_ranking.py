"""A whole ranking request on the device: raw ids in, ranked order, scores and probabilities out.

Per (batch bucket, candidate bucket) two jitted programs run back to back without a host
round trip between them:

1. ``hash``: the multiply-add-mod hashes of every user, post and author id and their rows in
   the stacked embedding table. It runs with 64-bit integers (the hash wraps in int64, as the
   original computes it), so it is a program of its own: JAX fixes the integer width of a
   whole program when it traces it.
2. ``rank``: the embedding lookups in the device-resident table, the context pass, every
   candidate chunk against the cached context, the sigmoid blend of action probabilities and a
   stable descending sort per user. Padding candidates (post id 0) sort last.

The host only stacks and pads the batch's inputs and splits the outputs per request. Scores
equal ``RankingEngine.score`` on the same inputs (same kernels, same chunking rule).

Shape glossary
  B  users (a batch bucket)   S  history_seq_len   T  1 + S   C  candidates (a bucket)
  D  emb_size   A  num_actions   N  continuous outputs (8)
  nU / nI / nA  user / item / author hashes
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine import kernels
from phoenix.engine.batching import (
    bucket_for,
    default_compute_dtype,
    default_max_rows_per_call,
)
from phoenix.engine.programs import Program, ProgramStore, prepare_all
from phoenix.engine.ranking import _model_method
from phoenix.grok import rms_normalize
from phoenix.hashing import EntityHash, hash_formula
from phoenix.recsys_model import DWELL_TIME_INDEX, PhoenixModelConfig, RecsysBatch, RecsysEmbeddings

REFERENCE_TIME = 1_700_000_000  # impression time that turns post ages into timestamps
NUM_CONTINUOUS = 8  # width of history_continuous_actions


# The request batch the ranker takes is the serving layer's padded batch of the ranker's
# contract (``phoenix.serving.batches``): one field per input, named as the contract names it,
# zeros as padding, and ``sent`` ({optional input: [B] bool}). The engine names here the
# fields it reads; an input it does not name (candidate_retrieval_scores) never reaches the
# device.
HASHED_IDS = (  # int64 ids, hashed by the first program
    "user_id",  # [B]
    "history_post_ids",  # [B, S], newest S items, right-padded with 0
    "history_author_ids",  # [B, S]
    "candidate_post_ids",  # [B, C], 0 = padding candidate
    "candidate_author_ids",  # [B, C]
)
FEATURES = (  # read by the ranking program as they are
    "history_actions",  # [B, S, A] float32
    "history_product_surface",  # [B, S] int32
    "history_dwell_seconds",  # [B, S] float32 (0 when not sent)
    "candidate_product_surface",  # [B, C] int32
    "candidate_post_age_seconds",  # [B, C] float32 (unknown unless sent)
)


class RankedBatch(NamedTuple):
    """Per user, candidates in ranked order (best first); padding candidates last."""

    order: np.ndarray  # [B, C] int32 positions into the request's candidates
    scores: np.ndarray  # [B, C] float32 blended scores, in ranked order
    action_probs: np.ndarray  # [B, C, A] float32, in ranked order


def hash_on_device(ids: jax.Array, entity: EntityHash):
    """(hashes, table rows) int32 [..., h] of int64 ``ids`` [...]; traced under x64.

    ``phoenix.hashing.hash_formula``, the host's formula, in jax.numpy; padding id 0 gets
    hash 0 and row 0.
    """
    hashes = hash_formula(
        jnp, ids, entity.scales, entity.biases, entity.modulus, entity.vocab_size
    )  # [..., h]
    rows = jnp.where(hashes == 0, 0, hashes + entity.table_offset)
    return hashes.astype(jnp.int32), rows.astype(jnp.int32)


class DeviceRanker:
    """Ranks request batches with one hashing and one ranking program per bucket."""

    def __init__(
        self,
        config: PhoenixModelConfig,
        params,
        table: np.ndarray,
        entities: dict[str, EntityHash],
        weights: np.ndarray,
        *,
        compute_dtype=None,
        batch_buckets: Sequence[int] = (1, 2, 4, 8),
        candidate_buckets: Sequence[int],
        max_rows_per_call: Optional[int] = None,
        store: Optional[ProgramStore] = None,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.candidate_buckets = tuple(sorted(candidate_buckets))
        self.chunk = self.candidate_buckets[-1]
        # Users per candidate pass: on CPUs big [users, heads, rows, T] arrays spill the caches.
        self.max_rows = max_rows_per_call or default_max_rows_per_call()
        self.entities = entities
        self.shape = kernels.AttentionShape.of(config)
        self.weights = {
            "params": jax.device_put(params),  # moved once, not with every call
            "table": jnp.asarray(table, jnp.float32),  # [rows, D], resident on the device
            **kernels.ranker_weights(params, config, self.dtype)._asdict(),
            "blend": jnp.asarray(weights, jnp.float32),  # [A]
        }
        self._context_tokens = _model_method(self.config, "build_context_inputs")
        self._hash = Program("ranker_hash", self._hash_fn, store, x64=True)
        # What shapes the ranking program besides its inputs (the config is the store's).
        settings = {
            "dtype": jnp.dtype(self.dtype).name,
            "chunk": self.chunk,
            "max_rows": self.max_rows,
        }
        self._rank = Program("ranker", self._rank_fn, store, settings=settings)

    # -- programs ------------------------------------------------------------------------

    def _hash_fn(self, users, history_posts, history_authors, candidate_posts, candidate_authors):
        e = self.entities
        return {
            "user": hash_on_device(users[:, None], e["user"]),  # [B, 1, nU] -> squeezed later
            "history_post": hash_on_device(history_posts, e["item"]),  # [B, S, nI]
            "history_author": hash_on_device(history_authors, e["author"]),  # [B, S, nA]
            "candidate_post": hash_on_device(candidate_posts, e["item"]),  # [B, C, nI]
            "candidate_author": hash_on_device(candidate_authors, e["author"]),  # [B, C, nA]
        }

    def _rank_fn(self, weights, hashed, inputs: dict):
        table = weights["table"]
        lookup = lambda rows: jnp.take(table, rows, axis=0)  # noqa: E731  [..., h, D]
        user_hashes, user_rows = (x[:, 0] for x in hashed["user"])  # [B, nU]
        dwell = inputs["history_dwell_seconds"]  # [B, S]
        continuous = jnp.zeros(dwell.shape + (NUM_CONTINUOUS,), jnp.float32)
        continuous = continuous.at[:, :, DWELL_TIME_INDEX].set(dwell)  # [B, S, N]
        context = RecsysBatch(
            user_hashes=user_hashes,
            history_post_hashes=hashed["history_post"][0],
            history_author_hashes=hashed["history_author"][0],
            history_actions=inputs["history_actions"],
            history_product_surface=inputs["history_product_surface"],
            candidate_post_hashes=None,
            candidate_author_hashes=None,
            candidate_product_surface=None,
            history_continuous_actions=continuous,
        )
        context_emb = RecsysEmbeddings(
            user_embeddings=lookup(user_rows),
            history_post_embeddings=lookup(hashed["history_post"][1]),
            history_author_embeddings=lookup(hashed["history_author"][1]),
            candidate_post_embeddings=None,
            candidate_author_embeddings=None,
        )
        tokens, mask = self._context_tokens(weights["params"], context, context_emb)  # [B,T,D]
        rotation = kernels.rope_rotation(
            kernels.context_positions(mask, self.config), self.shape.key_size
        )
        cache = kernels.context_layers(tokens, mask, rotation, weights["layers"], self.shape)

        candidates = self._candidate_inputs(hashed, inputs, lookup)
        logits = self._score_candidates(weights, cache, mask, candidates)  # [B, C, A]
        probs = jax.nn.sigmoid(logits)  # [B, C, A]
        blended = jnp.dot(probs, weights["blend"])  # [B, C]
        blended = jnp.where(candidates.valid, blended, -jnp.inf)  # padding sorts last
        order = jnp.argsort(-blended, axis=1, stable=True).astype(jnp.int32)  # [B, C]
        ranked_probs = jnp.take_along_axis(probs, order[..., None], axis=1)  # [B, C, A]
        return order, jnp.take_along_axis(blended, order, axis=1), ranked_probs

    def _candidate_inputs(self, hashed, inputs: dict, lookup) -> kernels.CandidateInputs:
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

    def _score_candidates(self, weights, cache, context_mask, candidates: kernels.CandidateInputs):
        """Logits [B, C, A], candidates in chunks and users in groups of at most max_rows."""
        users, count = candidates.valid.shape
        chunk = min(count, self.chunk)
        group = users if self.max_rows is None else max(1, min(users, self.max_rows // chunk))
        rows_out = []
        for u in range(0, users, group):
            take = lambda x, u=u: x[u : u + group]  # noqa: E731
            group_cache = [(take(k), take(v)) for k, v in cache]
            chunks = []
            for start in range(0, count, chunk):
                part = kernels.CandidateInputs(
                    *(x[u : u + group, start : start + chunk] for x in candidates)
                )
                chunks.append(
                    self._score_chunk(weights, group_cache, take(context_mask), part, start)
                )
            rows_out.append(jnp.concatenate(chunks, axis=1))
        return jnp.concatenate(rows_out, axis=0)

    def _score_chunk(self, weights, cache, context_mask, part: kernels.CandidateInputs, start: int):
        granularity = self.config.post_age_granularity_mins
        tokens = kernels.candidate_tokens(part, weights["candidates"], granularity).astype(
            self.dtype
        )
        rotation = self._candidate_rotation(part.valid.shape[1], start)
        h = kernels.candidate_layers(
            tokens, part.valid, rotation, context_mask, cache, weights["layers"], self.shape
        )
        h = rms_normalize(h, weights["final_norm"]).astype(jnp.float32)  # [B, c, D]
        return jnp.dot(h, weights["unembed"])  # [B, c, A]

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

    # -- host side -----------------------------------------------------------------------

    def padded_shape(self, users: int, candidates: int) -> tuple[int, int]:
        """(batch bucket, candidate width) a batch of this size is padded to."""
        width = bucket_for(max(1, candidates), self.candidate_buckets)
        if candidates > self.chunk:  # several chunks of the largest bucket
            width = -(-candidates // self.chunk) * self.chunk
        return bucket_for(users, self.batch_buckets), width

    def rank(self, batch) -> RankedBatch:
        """Rank every user's candidates; ``batch`` (the ranker's padded request batch, module
        note above) must already be padded to a bucket shape."""
        hashed = self._hash(*id_inputs(batch))
        order, scores, probs = self._rank(self.weights, hashed, feature_inputs(batch))
        return RankedBatch(np.asarray(order), np.asarray(scores), np.asarray(probs))

    def warm_up(self, empty_batch: Callable[[int, int], Any]) -> int:
        """Load (or compile) both programs for every (batch bucket, candidate bucket), from
        shapes alone: nothing runs. ``empty_batch(users, candidates)`` is an all-padding
        request batch of that shape. Returns how many buckets."""
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


def id_inputs(batch) -> tuple[np.ndarray, ...]:
    """The int64 id arrays the hashing program takes, in its argument order."""
    return tuple(getattr(batch, name) for name in HASHED_IDS)


def feature_inputs(batch) -> dict[str, np.ndarray]:
    """What the ranking program reads besides the hashes: FEATURES, and whether each user's
    request sent post ages (a post of unknown age gets no timestamps)."""
    features = {name: getattr(batch, name) for name in FEATURES}
    features["age_sent"] = batch.sent["candidate_post_age_seconds"]  # [B] bool
    return features
