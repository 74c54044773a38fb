"""The production ranker's typed inputs: a batch of B requests as NamedTuples of arrays.

Shapes: B requests, H = history_seq_len, C = candidate_seq_len, nU/nIP/nI/nA hashes per user,
IP, post and author, L = sid_num_levels, A = output_vocab_size, W = emb_table_width.

History and candidates share ``PostSequence``; a few fields are read on one side only (marked
below), as in X's batch. Padding: a post whose first post hash is 0 is padding, and a history
is packed at the front (its real posts first); X's positions assume both.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

Array = jax.Array | np.ndarray


class UserFeatures(NamedTuple):
    """The viewer: hashed ids and profile features, [B, ...] each."""

    hashes: Array  # [B, nU] int32 rows of the hashed table; hashes[:, 0] == 0: no user
    ip_hashes: Array  # [B, nIP] int32 rows
    country: Array  # [B] int32 in [0, num_countries)
    language: Array  # [B] int32 in [0, num_languages)
    latitude: Array  # [B] float32 degrees
    longitude: Array  # [B] float32 degrees
    installed_apps: Array  # [B, num_installed_apps] bool
    profile_gender: Array  # [B] int32 in [0, 3)
    inferred_gender: Array  # [B] int32 in [0, 2)
    inferred_gender_score: Array  # [B] float32 in [0, 1]
    age_bracket: Array  # [B] int32 in [0, num_age_brackets)
    age_years: Array  # [B] float32


class PostSequence(NamedTuple):
    """A history or the candidates: S posts per request, [B, S, ...] each.

    Categorical values outside their table are clipped to it, as X's one-hot lookups do.
    """

    post_hashes: Array  # [B, S, nI] int32 rows; post_hashes[..., 0] == 0: padding
    author_hashes: Array  # [B, S, nA] int32 rows
    product_surface: Array  # [B, S] int32 in [0, 16)
    impression_time: Array  # [B, S] int32 seconds since the epoch, 0 = unknown
    creation_time: Array  # [B, S] int32 seconds, 0 = unknown (post age from both)
    timezone: Array  # [B, S] int32 in [0, 32)
    hour_of_day: Array  # [B, S] int32 local hour + 1 in [1, 24], 0 = unknown
    author_followed_by_viewer: Array  # [B, S] bool
    author_following_viewer: Array  # [B, S] bool
    engagement_counts: Array  # [B, S, 5] float32 raw counts: favs, replies, reposts, quotes, views
    semantic_ids: Array  # [B, S, L] int32 codes in [1, codebook], 0 = missing
    stale: Array  # [B, S] bool: older than 14 days (read for candidates only)
    actions: Array  # [B, S, A] bool: the viewer's actions on the post (history only)
    dwell_time: Array  # [B, S] float32 seconds (history only)


class RankingInputs(NamedTuple):
    """One batch: the viewer, the history and the candidates to rank."""

    user: UserFeatures
    history: PostSequence  # S = H
    candidates: PostSequence  # S = C


class HashedRows(NamedTuple):
    """The hashed embedding rows of a batch, gathered (``hashing.gather_rows``) or given."""

    user: Array  # [B, nU, W]
    user_ip: Array  # [B, nIP, W]
    history_posts: Array  # [B, H, nI, W]
    history_authors: Array  # [B, H, nA, W]
    candidate_posts: Array  # [B, C, nI, W]
    candidate_authors: Array  # [B, C, nA, W]


def post_valid(sequence: PostSequence) -> Array:
    """[B, S] bool: the real posts (first post hash nonzero)."""
    return sequence.post_hashes[..., 0] != 0
