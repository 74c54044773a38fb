"""Seeded example batches for the production ranker: every feature in its valid range, posts
and users hashed from random 64-bit ids, histories and candidate lists of chosen lengths
(padding after them). For tests, timings and warm-up; numpy only."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from phoenix.production.config import ProductionConfig
from phoenix.production.hashing import (
    hash_author_ids,
    hash_ip_ids,
    hash_item_ids,
    hash_user_ids,
)
from phoenix.production.inputs import PostSequence, RankingInputs, UserFeatures

NOW = 1_755_000_000  # seconds: impressions happen up to a week before


def example_sequence(
    config: ProductionConfig, rng: np.random.Generator, lengths: Sequence[int], history: bool
) -> PostSequence:
    """[B, S] posts, the first ``lengths[b]`` real, S = history_seq_len or candidate_seq_len."""
    c = config
    b, s = len(lengths), c.history_seq_len if history else c.candidate_seq_len
    if any(not 0 <= n <= s for n in lengths):
        raise ValueError(f"lengths must lie in [0, {s}], got {list(lengths)}")
    real = np.arange(s)[None, :] < np.asarray(lengths)[:, None]  # [B, S]

    def draw(low, high, shape=(), dtype=np.int32):
        values = rng.integers(low, high, size=(b, s) + shape).astype(dtype)
        return np.where(real.reshape(real.shape + (1,) * len(shape)), values, 0)

    post_ids = np.where(real, rng.integers(1, 2**62, size=(b, s)), 0)
    author_ids = np.where(real, rng.integers(1, 2**40, size=(b, s)), 0)
    impression = np.where(real, NOW - (rng.integers(0, 7 * 86400, (b, s)) if history else 0), 0)
    creation = np.where(real, impression - rng.integers(0, 3 * 86400, (b, s)), 0)
    return PostSequence(
        post_hashes=hash_item_ids(post_ids, c.hashes),
        author_hashes=hash_author_ids(author_ids, c.hashes),
        product_surface=draw(0, c.product_surface_cardinality),
        impression_time=impression.astype(np.int32),
        creation_time=creation.astype(np.int32),
        timezone=draw(0, c.timezone_cardinality),
        hour_of_day=draw(0, c.hour_of_day_cardinality),
        author_followed_by_viewer=draw(0, 2).astype(bool),
        author_following_viewer=draw(0, 2).astype(bool),
        engagement_counts=draw(0, 100_000, (5,), np.float32),
        semantic_ids=draw(0, c.sid_codebook_size + 1, (c.sid_num_levels,)),
        stale=draw(0, 2).astype(bool),
        actions=(draw(0, 20, (c.output_vocab_size,)) == 1) & real[..., None],
        dwell_time=np.where(real, rng.exponential(8.0, (b, s)), 0).astype(np.float32),
    )


def example_user(config: ProductionConfig, rng: np.random.Generator, batch: int) -> UserFeatures:
    c = config
    user_ids = rng.integers(1, 2**62, size=batch)
    return UserFeatures(
        hashes=hash_user_ids(user_ids, c.hashes),
        ip_hashes=hash_ip_ids(rng.integers(1, 2**32, size=batch), c.hashes),
        country=rng.integers(0, c.num_countries, batch).astype(np.int32),
        language=rng.integers(0, c.num_languages, batch).astype(np.int32),
        latitude=rng.uniform(-60, 60, batch).astype(np.float32),
        longitude=rng.uniform(-180, 180, batch).astype(np.float32),
        installed_apps=rng.random((batch, c.num_installed_apps)) < 0.2,
        profile_gender=rng.integers(0, 3, batch).astype(np.int32),
        inferred_gender=rng.integers(0, 2, batch).astype(np.int32),
        inferred_gender_score=rng.random(batch).astype(np.float32),
        age_bracket=rng.integers(0, c.num_age_brackets, batch).astype(np.int32),
        age_years=rng.uniform(15, 70, batch).astype(np.float32),
    )


def example_inputs(
    config: ProductionConfig,
    batch: int,
    seed: int = 0,
    history_lens: Sequence[int] | None = None,
    candidate_lens: Sequence[int] | None = None,
) -> RankingInputs:
    """A batch of ``batch`` requests (full histories and candidate lists by default)."""
    rng = np.random.default_rng(seed)
    if history_lens is None:
        history_lens = [config.history_seq_len] * batch
    if candidate_lens is None:
        candidate_lens = [config.candidate_seq_len] * batch
    history_lens, candidate_lens = list(history_lens), list(candidate_lens)
    if len(history_lens) != batch or len(candidate_lens) != batch:
        raise ValueError(f"one history and one candidate length per request ({batch})")
    return RankingInputs(
        user=example_user(config, rng, batch),
        history=example_sequence(config, rng, history_lens, history=True),
        candidates=example_sequence(config, rng, candidate_lens, history=False),
    )
