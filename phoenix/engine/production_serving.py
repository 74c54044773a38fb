"""X's production ranker as the ``ranker`` serves it: a padded request batch of raw ids and
features to ranked candidates, every program prepared at warm-up.

``ProductionBatchRanker.rank`` takes the serving layer's padded batch of the ranker's contract
(``phoenix.schema.batches``: one field per input, zeros as padding, ``sent`` per optional
input; the fields it reads are ``FIELDS``) already padded to a bucket shape, and:

1. on the host, hashes the raw ids as X hashes them (``phoenix.production.hashing``: int64
   arithmetic, a few thousand ids a batch) and assembles ``RankingInputs``: what a request
   left out is X's "unknown" (0), the candidates' post ages become impression and creation
   times, a candidate older than 14 days is stale, the candidates' timezone is the request's
   home timezone unless it sends theirs;
2. the prefix program (one per batch bucket a call uses: on CPUs a call holds at most 2,048
   prefix tokens, two nano users, and a bigger batch runs as several calls): the table rows of
   the user and history, then ``production_passes.prefix``: the user, user-features and
   history tokens through every layer, a ``PrefixCache`` of keys and values that stays on the
   device;
3. the candidates program (one per such bucket and candidate width): the candidates' rows,
   ``production_passes.score_candidates`` against that cache, the probabilities of the 64
   action slots (sigmoid of the logits) and their blend with the ``score_weights`` vector;
   candidate lists wider than ``chunk`` (the config's ``candidate_seq_len``) run as several
   calls against one cache (a candidate attends to the prefix and itself only, so chunks
   change nothing);
4. on the host, a stable descending sort per user, padding last.

Programs come from a ``ProgramStore`` or are compiled at ``warm_up``, from shapes only. On a
CPU the forward computes in float32 by default (X computes in bfloat16, which a CPU emulates:
docs/production.md, "Serving it", measured the two); in bfloat16 it compiles with X's rounding
(``phoenix.production.model.compiler_options``).

Shape glossary
  B  users (a batch bucket)   H  history_seq_len   P  2 + H   W  candidate width
  A  action slots (64)   L  semantic-ID levels   nU / nIP / nI / nA  hashes per entity
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine.batching import (
    bucket_for,
    default_compute_dtype,
    default_max_rows_per_call,
)
from phoenix.engine.production_passes import PrefixCache, prefix, score_candidates
from phoenix.engine.programs import Program, ProgramStore, prepare_all
from phoenix.engine.ranking_inputs import RankedBatch
from phoenix.production.config import ProductionConfig
from phoenix.production.hashing import (
    hash_author_ids,
    hash_item_ids,
    hash_user_ids,
)
from phoenix.production.inputs import HashedRows, PostSequence, RankingInputs, UserFeatures
from phoenix.production.model import compiler_options
from phoenix.production.params import device_table, device_weights

REFERENCE_TIME = 1_700_000_000  # candidates' impression time: their age is all that counts
STALE_AFTER_S = 14 * 86_400  # X's stale post: older than 14 days
PROFILE_FIELDS = (  # the user's profile: contract input name -> UserFeatures field
    "country",
    "language",
    "latitude",
    "longitude",
    "installed_apps",
    "profile_gender",
    "inferred_gender",
    "inferred_gender_score",
    "age_bracket",
    "age_years",
)
# The batch fields read (the contract's input names); candidate_retrieval_scores and the
# rest never reach the device.
FIELDS = (
    "user_id",
    *PROFILE_FIELDS,
    "timezone",
    "history_post_ids",
    "history_author_ids",
    "history_actions",
    "history_product_surface",
    "history_dwell_seconds",
    "history_impression_time",
    "history_creation_time",
    "history_timezone",
    "history_hour_of_day",
    "history_semantic_ids",
    "candidate_post_ids",
    "candidate_author_ids",
    "candidate_product_surface",
    "candidate_post_age_seconds",
    "candidate_timezone",
    "candidate_hour_of_day",
    "candidate_semantic_ids",
)


# ----------------------------------------------------------------------------------------
# The host: raw ids and features to RankingInputs
# ----------------------------------------------------------------------------------------


def user_features(batch, config: ProductionConfig) -> UserFeatures:
    """[B] users: hashed ids (no IP: its rows stay padding) and the profile features."""
    users = np.asarray(batch.user_id)
    b = users.shape[0]
    profile = {name: np.asarray(getattr(batch, name)) for name in PROFILE_FIELDS}
    return UserFeatures(
        hashes=hash_user_ids(users, config.hashes),  # [B, nU]
        ip_hashes=np.zeros((b, config.hashes.num_ip_hashes), np.int32),
        country=profile["country"].astype(np.int32),
        language=profile["language"].astype(np.int32),
        latitude=profile["latitude"].astype(np.float32),
        longitude=profile["longitude"].astype(np.float32),
        installed_apps=profile["installed_apps"] != 0,  # [B, apps] bool
        profile_gender=profile["profile_gender"].astype(np.int32),
        inferred_gender=profile["inferred_gender"].astype(np.int32),
        inferred_gender_score=profile["inferred_gender_score"].astype(np.float32),
        age_bracket=profile["age_bracket"].astype(np.int32),
        age_years=profile["age_years"].astype(np.float32),
    )


def history_sequence(batch, config: ProductionConfig) -> PostSequence:
    """[B, H] history posts, real ones first (the batch pads after them)."""
    posts = np.asarray(batch.history_post_ids)
    zeros = np.zeros(posts.shape, np.int32)
    return PostSequence(
        post_hashes=hash_item_ids(posts, config.hashes),  # [B, H, nI]
        author_hashes=hash_author_ids(batch.history_author_ids, config.hashes),  # [B, H, nA]
        product_surface=np.asarray(batch.history_product_surface, np.int32),
        impression_time=np.asarray(batch.history_impression_time).astype(np.int32),
        creation_time=np.asarray(batch.history_creation_time).astype(np.int32),
        timezone=np.asarray(batch.history_timezone, np.int32),
        hour_of_day=np.asarray(batch.history_hour_of_day, np.int32),
        author_followed_by_viewer=zeros.astype(bool),
        author_following_viewer=zeros.astype(bool),
        engagement_counts=np.zeros(posts.shape + (5,), np.float32),
        semantic_ids=np.asarray(batch.history_semantic_ids, np.int32),  # [B, H, L]
        stale=None,  # type: ignore[arg-type]  # read for candidates only
        actions=np.asarray(batch.history_actions) != 0,  # [B, H, A] bool
        dwell_time=np.asarray(batch.history_dwell_seconds, np.float32),
    )


def candidate_sequence(batch, config: ProductionConfig) -> PostSequence:
    """[B, W] candidates: post ages as impression and creation times (unknown where not
    sent or negative), staleness from the age, the home timezone where theirs is not sent."""
    posts = np.asarray(batch.candidate_post_ids)
    zeros = np.zeros(posts.shape, np.int32)
    ages = np.asarray(batch.candidate_post_age_seconds, np.float64)  # [B, W]
    known = batch.sent["candidate_post_age_seconds"][:, None] & (ages >= 0) & (posts != 0)
    ages = np.clip(np.floor(ages), 0, REFERENCE_TIME - 1).astype(np.int64)
    home = np.asarray(batch.timezone, np.int32)[:, None]  # [B, 1]
    theirs = batch.sent["candidate_timezone"][:, None]
    zone = np.where(theirs, np.asarray(batch.candidate_timezone, np.int32), home)
    return PostSequence(
        post_hashes=hash_item_ids(posts, config.hashes),  # [B, W, nI]
        author_hashes=hash_author_ids(batch.candidate_author_ids, config.hashes),
        product_surface=np.asarray(batch.candidate_product_surface, np.int32),
        impression_time=np.where(known, REFERENCE_TIME, 0).astype(np.int32),
        creation_time=np.where(known, REFERENCE_TIME - ages, 0).astype(np.int32),
        timezone=np.where(posts != 0, zone, 0).astype(np.int32),
        hour_of_day=np.asarray(batch.candidate_hour_of_day, np.int32),
        author_followed_by_viewer=zeros.astype(bool),
        author_following_viewer=zeros.astype(bool),
        engagement_counts=np.zeros(posts.shape + (5,), np.float32),
        semantic_ids=np.asarray(batch.candidate_semantic_ids, np.int32),  # [B, W, L]
        stale=known & (ages >= STALE_AFTER_S),
        actions=None,  # type: ignore[arg-type]  # read for the history only
        dwell_time=None,  # type: ignore[arg-type]
    )


def check_rows(sequence_hashes: Mapping[str, Any], num_rows: int) -> None:
    """Every hashed row inside the table (the hash functions guarantee it for a table that
    fits the config, which the artifact checks; a broken one fails here, named)."""
    for name, hashes in sequence_hashes.items():
        if hashes.size and (hashes.min() < 0 or hashes.max() >= num_rows):
            raise ValueError(f"{name}: hashed rows outside the table's {num_rows} rows")


# ----------------------------------------------------------------------------------------
# The device: the two programs
# ----------------------------------------------------------------------------------------


def _rows(table: jax.Array, hashes) -> jax.Array:
    return jnp.take(table, hashes, axis=0)  # [..., h, W]


def prefix_program(weights, table, user: UserFeatures, history: PostSequence, *, config):
    """The prefix's cache of a batch of users: table rows, then every layer."""
    rows = HashedRows(
        user=_rows(table, user.hashes),  # [B, nU, W]
        user_ip=_rows(table, user.ip_hashes),  # [B, nIP, W]
        history_posts=_rows(table, history.post_hashes),  # [B, H, nI, W]
        history_authors=_rows(table, history.author_hashes),  # [B, H, nA, W]
        candidate_posts=None,  # type: ignore[arg-type]
        candidate_authors=None,  # type: ignore[arg-type]
    )
    inputs = RankingInputs(user, history, None)  # type: ignore[arg-type]
    return prefix(weights, inputs, rows, config)


def candidates_program(weights, table, cache: PrefixCache, candidates: PostSequence, blend,
                       *, config):  # fmt: skip
    """(blended scores [B, W], action probabilities [B, W, A]) of candidates against the
    users' prefix caches; padding candidates score -inf."""
    rows = HashedRows(
        None, None, None, None,  # type: ignore[arg-type]
        candidate_posts=_rows(table, candidates.post_hashes),  # [B, W, nI, W']
        candidate_authors=_rows(table, candidates.author_hashes),  # [B, W, nA, W']
    )  # fmt: skip
    inputs = RankingInputs(None, None, candidates)  # type: ignore[arg-type]
    outputs = score_candidates(weights, cache, inputs, rows, config)
    probs = jax.nn.sigmoid(outputs.logits)  # [B, W, A] float32
    valid = candidates.post_hashes[..., 0] != 0  # [B, W]
    return jnp.where(valid, jnp.dot(probs, blend), -jnp.inf), probs


class ProductionBatchRanker:
    """The production ranker over padded request batches: ``rank`` a batch, ``warm_up`` every
    program a batch can need."""

    def __init__(
        self,
        config: ProductionConfig,
        params: Mapping[str, np.ndarray],
        blend: np.ndarray,
        *,
        batch_buckets: Sequence[int],
        candidate_buckets: Sequence[int],
        store: Optional[ProgramStore] = None,
        compute_dtype: Any = None,
        max_rows_per_call: Optional[int] = None,
    ):
        """``max_rows_per_call``: tokens of the users' prefixes one call holds (default: 2048
        on CPUs, no limit on accelerators, as the original family's engine): a batch of more
        users runs as calls of the largest batch bucket within it, whole-padding ones left
        out."""
        dtype = jnp.dtype(compute_dtype or default_compute_dtype()).name
        self.config = dataclasses.replace(config, compute_dtype=dtype)
        self.weights = device_weights(params, self.config)
        self.table = device_table(params, self.config)  # [V, W'] in the compute dtype
        self.blend = jnp.asarray(blend, jnp.float32)  # [A]
        self.batch_buckets = tuple(sorted(batch_buckets))
        # Users per call: on CPUs a batch of 8 nano users in one call took 8.8 s where calls
        # of one took 6.0 (2 cores, load 9-13; CPU time 4.3 against 4.0 s).
        rows = max_rows_per_call or default_max_rows_per_call()
        fits = [b for b in self.batch_buckets if rows is None or b * config.prefix_len <= rows]
        self.call_buckets = tuple(fits) or self.batch_buckets[:1]
        self.users_per_call = self.call_buckets[-1]
        # Candidate lists wider than the config's run as calls of this width.
        self.chunk = self.config.candidate_seq_len
        widths = sorted({min(b, self.chunk) for b in candidate_buckets} | {self.chunk})
        self.candidate_buckets = tuple(widths)
        # X's rounding where it computes as X does; float32 has nothing to round
        options = compiler_options() if dtype == "bfloat16" else {}
        settings = {"dtype": dtype, "config": repr(self.config)}
        self._prefix = Program(
            "production_prefix",
            _partial(prefix_program, self.config),
            store,
            settings=settings,
            compiler_options=options,
        )
        self._candidates = Program(
            "production_candidates",
            _partial(candidates_program, self.config),
            store,
            settings=settings,
            compiler_options=options,
        )

    def padded_shape(self, users: int, candidates: int) -> tuple[int, int]:
        """(batch bucket, candidate width) a batch of this size is padded to: the smallest
        candidate bucket that holds it, else whole chunks."""
        width = bucket_for(max(1, candidates), self.candidate_buckets)
        if candidates > self.chunk:
            width = -(-candidates // self.chunk) * self.chunk
        return bucket_for(users, self.batch_buckets), width

    def inputs(self, batch) -> tuple[UserFeatures, PostSequence, PostSequence]:
        """The batch's users, histories and candidates as the model reads them."""
        user = user_features(batch, self.config)
        history = history_sequence(batch, self.config)
        candidates = candidate_sequence(batch, self.config)
        if history.post_hashes.shape[1] != self.config.history_seq_len:
            raise ValueError(
                f"a batch of {history.post_hashes.shape[1]} history items; this ranker reads "
                f"{self.config.history_seq_len} (pad the batch to it)"
            )
        check_rows(
            {"user_id": user.hashes, "history_post_ids": history.post_hashes,
             "history_author_ids": history.author_hashes,
             "candidate_post_ids": candidates.post_hashes,
             "candidate_author_ids": candidates.author_hashes},
            self.table.shape[0],
        )  # fmt: skip
        return user, history, candidates

    def rank(self, batch, rows: Optional[int] = None) -> RankedBatch:
        """Every user's candidates in ranked order (best first, padding last); the batch's
        first ``rows`` rows (None: all) are users, the rest padding."""
        user, history, candidates = self.inputs(batch)
        users = len(batch.user_id)
        rows = users if rows is None else rows
        step = self.users_per_call
        parts = []
        for start in range(0, users, step):
            size = min(step, users - start)
            if start >= rows:  # only padding: nothing to compute
                parts.append(_padding_answer(size, candidates.post_hashes.shape[1], self.blend))
                continue
            pad = bucket_for(size, self.call_buckets)
            take = lambda x, s=start, n=size, p=pad: _slice_users(x, s, n, p)  # noqa: E731
            parts.append(
                self._rank_call(
                    jax.tree.map(take, user),
                    jax.tree.map(take, history),
                    jax.tree.map(take, candidates),
                    size,
                )  # fmt: skip
            )
        return RankedBatch(*(np.concatenate(arrays) for arrays in zip(*parts)))

    def _rank_call(self, user, history, candidates, size: int) -> RankedBatch:
        """One call's users (a call bucket, of which the first ``size`` are returned)."""
        cache = self._prefix(self.weights, self.table, user, history)
        width = candidates.post_hashes.shape[1]
        step = min(width, self.chunk)
        parts = [
            self._candidates(
                self.weights, self.table, cache, _take(candidates, start, step), self.blend
            )
            for start in range(0, width, step)
        ]  # every chunk dispatched before any is read
        scores = np.concatenate([np.asarray(s) for s, _ in parts], axis=1)  # [B, W]
        probs = np.concatenate([np.asarray(p) for _, p in parts], axis=1)  # [B, W, A]
        scores, probs = scores[:size], probs[:size]
        order = np.argsort(-scores, axis=1, kind="stable").astype(np.int32)  # padding last
        return RankedBatch(
            order,
            np.take_along_axis(scores, order, axis=1),
            np.take_along_axis(probs, order[..., None], axis=1),
        )

    def warm_up(self, empty_batch: Callable[[int, int], Any]) -> int:
        """Load (or compile) the prefix program of every batch bucket and the candidates
        program of every (batch bucket, candidate bucket), from shapes alone: nothing runs.
        ``empty_batch(users, width)`` is an all-padding request batch. Returns how many
        programs."""
        shapes = {}
        for users in self.call_buckets:
            user, history, _ = self.inputs(empty_batch(users, self.candidate_buckets[0]))
            shapes[users] = (user, history)
        prepare_all([(self._prefix, (self.weights, self.table, *shapes[b])) for b in shapes])
        calls = []
        for users in self.call_buckets:
            cache = self._prefix.output_shapes(self.weights, self.table, *shapes[users])
            for width in self.candidate_buckets:
                candidates = candidate_sequence(empty_batch(users, width), self.config)
                calls.append(
                    (self._candidates, (self.weights, self.table, cache, candidates, self.blend))
                )
        prepare_all(calls)
        return len(shapes) + len(calls)


def _partial(fn: Callable, config: ProductionConfig) -> Callable:
    def bound(*args):
        return fn(*args, config=config)

    bound.__name__ = fn.__name__
    return bound


def _slice_users(x, start: int, size: int, padded: int):
    """Rows [start, start + size) of a host array, zero rows after them up to ``padded``."""
    part = x[start : start + size]
    if padded == size:
        return part
    return np.concatenate([part, np.zeros((padded - size, *part.shape[1:]), part.dtype)])


def _padding_answer(users: int, width: int, blend) -> RankedBatch:
    """What rows of padding rank to: positions in order, -inf, no probabilities."""
    order = np.broadcast_to(np.arange(width, dtype=np.int32), (users, width))
    return RankedBatch(
        np.array(order),
        np.full((users, width), -np.inf, np.float32),
        np.zeros((users, width, blend.shape[0]), np.float32),
    )


def _take(sequence: PostSequence, start: int, width: int) -> PostSequence:
    """Positions [start, start + width) of every [B, W, ...] field (None stays None)."""
    return PostSequence(*(None if x is None else x[:, start : start + width] for x in sequence))
