"""Tokens from features: the user token, the user-features token, history and candidate posts.

Each token is a sum of parts added one by one in the compute dtype, in X's order and with its
roundings: a hashed row through its own projection, a categorical value's table row, a scalar
times a learned vector, small MLPs. X looks categorical values up as one-hot rows times a
table; a row lookup of the clipped value gives the same numbers. Every token is finally
scaled by sqrt(emb_size).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from phoenix.production.inputs import (
    Array,
    HashedRows,
    PostSequence,
    RankingInputs,
    UserFeatures,
    post_valid,
)
from phoenix.production.params import ProductionWeights, SequenceTables

ENGAGEMENT_LOG2_SCALE = 32.0
SID_HASH_MULTIPLIER = 1540483477  # X's mixing constant for the semantic-id level from a hash


def lookup(table: jax.Array, values: Array) -> jax.Array:
    """table[clip(values)]: [..., D] (X clips every categorical value into its table)."""
    return jnp.take(table, jnp.clip(values.astype(jnp.int32), 0, table.shape[0] - 1), axis=0)


def add_projections(total: jax.Array, rows: Array, projections: jax.Array) -> jax.Array:
    """total [..., D] plus rows[..., i, :] @ projections[i] ([..., W] x [W, D]) for each hash i
    in turn, each product rounded to the total's dtype before it is added, as X adds them (the
    order of the additions changes the rounding)."""
    for i in range(projections.shape[0]):
        total = total + jnp.dot(rows[..., i, :].astype(total.dtype), projections[i])
    return total


def user_token(w: ProductionWeights, rows: HashedRows, dtype) -> jax.Array:
    """[B, 1, D]: the user's hashed rows, then the IP's, each through its projection."""
    token = jnp.zeros(rows.user.shape[:1] + w.user_hash.shape[-1:], dtype)  # [B, D]
    token = add_projections(token, rows.user, w.user_hash)
    token = add_projections(token, rows.user_ip, w.user_ip_hash)
    return token[:, None, :]


def location_features(latitude: Array, longitude: Array, frequencies: int) -> jax.Array:
    """[B, 4F] float32: sin and cos of latitude and longitude at F doubling frequencies."""
    lat = jnp.pi * latitude.astype(jnp.float32) / 90.0
    lon = jnp.pi * longitude.astype(jnp.float32) / 180.0
    bands = jnp.float32(2.0) ** jnp.arange(frequencies, dtype=jnp.float32)  # [F]
    lat, lon = lat[:, None] * bands, lon[:, None] * bands  # [B, F]
    return jnp.concatenate([jnp.sin(lat), jnp.cos(lat), jnp.sin(lon), jnp.cos(lon)], axis=-1)


def user_features_token(w: ProductionWeights, user: UserFeatures, config, dtype) -> jax.Array:
    """[B, 1, D]: country, language, location, installed apps, gender, age."""
    f32 = jnp.float32
    token = lookup(w.country, user.country)  # [B, D]
    token = token + lookup(w.language, user.language)
    geo = location_features(user.latitude, user.longitude, config.location_num_frequencies)
    token = token + jnp.dot(geo.astype(dtype), w.location).astype(dtype)
    apps = user.installed_apps.astype(f32).astype(dtype)  # [B, apps]
    token = token + jnp.dot(apps, w.installed_apps).astype(dtype)
    token = token + lookup(w.profile_gender, user.profile_gender)
    inferred = lookup(w.inferred_gender, user.inferred_gender).astype(f32)  # [B, D]
    score = user.inferred_gender_score.astype(f32)[:, None]
    token = token + (score * inferred).astype(dtype)
    token = token + lookup(w.age_bracket, user.age_bracket)
    log_age = jnp.log1p(user.age_years.astype(f32))[:, None]  # [B, 1]
    token = token + (log_age * w.age_years.astype(f32)).astype(dtype)
    return token[:, None, :]


def post_age_bucket(impression: Array, creation: Array, config) -> jax.Array:
    """[B, S] int32: hours old + 1 (granularity_mins), one overflow bucket, 0 when unknown."""
    impression, creation = impression.astype(jnp.int32), creation.astype(jnp.int32)
    minutes = (impression - creation) // 60
    buckets = config.post_age_max_mins // config.post_age_granularity_mins
    bucket = jnp.clip(minutes // config.post_age_granularity_mins + 1, 0, buckets + 1)
    unknown = (minutes < 0) | (impression == 0) | (creation == 0)
    return jnp.where(unknown, 0, bucket).astype(jnp.int32)


def engagement_embedding(counts: Array, t: SequenceTables, dtype) -> jax.Array:
    """[B, S, D]: log2(count + 1) / 32 of the five counts and a bias through a GELU MLP."""
    logs = jnp.log2(jnp.maximum(counts.astype(jnp.float32), 0.0) + 1.0) / ENGAGEMENT_LOG2_SCALE
    v = jnp.concatenate([logs, jnp.ones_like(logs[..., :1])], axis=-1)  # [B, S, 6]
    hidden = jax.nn.gelu(jnp.dot(v.astype(dtype), t.counts_in))  # [B, S, M]
    return jnp.dot(hidden, t.counts_out).astype(dtype)


def context_embedding(token, seq: PostSequence, t: SequenceTables, config, dtype, candidates):
    """``token`` plus surface, post age, timezone, hour, follow flags, counts (and staleness
    for candidates)."""
    token = token + lookup(t.product_surface, seq.product_surface)
    age = post_age_bucket(seq.impression_time, seq.creation_time, config)
    token = token + lookup(t.post_age, age)
    token = token + lookup(t.timezone, seq.timezone)
    token = token + lookup(t.hour_of_day, seq.hour_of_day)
    token = token + lookup(t.followed_by_viewer, seq.author_followed_by_viewer)
    token = token + lookup(t.following_viewer, seq.author_following_viewer)
    return token + engagement_embedding(seq.engagement_counts, t, dtype)


def sid_hash_code(post_hashes: Array, semantic_ids: Array, codebook: int) -> jax.Array:
    """[B, S] int32: the extra semantic-id level X derives from the first post hash (int32
    arithmetic wraps), 0 when the post has no semantic id."""
    mixed = post_hashes[..., 0].astype(jnp.int32) * jnp.int32(SID_HASH_MULTIPLIER)
    mixed = mixed ^ (mixed >> 16)
    code = jnp.abs(mixed) % codebook + 1
    return jnp.where(semantic_ids[..., 0] == 0, 0, code)


def sid_embedding(w: ProductionWeights, seq: PostSequence, config, dtype) -> jax.Array:
    """[B, S, D]: each level's code row (code 0 adds zero), summed, then projected."""
    codes = seq.semantic_ids.astype(jnp.int32)  # [B, S, L]
    if config.sid_hash_level:
        hashed = sid_hash_code(seq.post_hashes, codes, config.sid_codebook_size)
        codes = jnp.concatenate([codes, hashed[..., None]], axis=-1)  # [B, S, L + 1]
    size = config.sid_table_size
    inside = (codes >= 0) & (codes < size)  # a one-hot row of a code outside is all zero
    flat = jnp.clip(codes, 0, size - 1) + jnp.arange(codes.shape[-1]) * size
    rows = jnp.take(w.sid_table, flat, axis=0)  # [B, S, levels, E]
    summed = jnp.where(inside[..., None], rows, 0).sum(axis=-2)  # [B, S, E]
    if w.sid_proj is None:
        return summed.astype(dtype)
    return jnp.dot(summed.astype(dtype), w.sid_proj).astype(dtype)


def sequence_tokens(w, seq, posts, authors, t: SequenceTables, config, dtype, candidates):
    """[B, S, D] before the input scale: hashed post and author rows, context, semantic ids."""
    token = jnp.zeros(posts.shape[:2] + t.post_hash.shape[-1:], dtype)  # [B, S, D]
    token = add_projections(token, posts, t.post_hash)
    token = add_projections(token, authors, t.author_hash)
    token = context_embedding(token, seq, t, config, dtype, candidates)
    if candidates:
        token = token + lookup(w.stale, seq.stale)
    return token + sid_embedding(w, seq, config, dtype)


def history_tokens(w, seq: PostSequence, rows: HashedRows, config, dtype) -> jax.Array:
    """[B, H, D]: the post's token plus the viewer's actions on it and the dwell time."""
    token = sequence_tokens(
        w, seq, rows.history_posts, rows.history_authors, w.history, config, dtype, False
    )
    actions = seq.actions.astype(jnp.float32).astype(dtype)  # [B, H, A]
    token = token + jnp.dot(actions, w.history_actions).astype(dtype)
    scale = config.dwell_time_norm_scale
    dwell = jnp.clip(seq.dwell_time.astype(jnp.float32), 0.0, scale) / scale  # [B, H]
    return token + (dwell[..., None] * w.dwell.astype(jnp.float32)).astype(dtype)


def prefix_tokens(w: ProductionWeights, inputs: RankingInputs, rows: HashedRows, config):
    """The prefix: [B, P, D] tokens (user, user features, history; scaled) and [B, P] bool
    real tokens."""
    dtype = jnp.dtype(config.compute_dtype)
    tokens = jnp.concatenate(
        [
            user_token(w, rows, dtype),
            user_features_token(w, inputs.user, config, dtype),
            history_tokens(w, inputs.history, rows, config, dtype),
        ],
        axis=1,
    )  # [B, P, D]
    b = tokens.shape[0]
    valid = jnp.concatenate(
        [
            (inputs.user.hashes[:, 0] != 0)[:, None],  # the user token
            jnp.ones((b, 1), bool),  # the user-features token is always there
            post_valid(inputs.history),
        ],
        axis=1,
    )  # [B, P]
    return tokens * config.input_scale, valid


def candidate_tokens(w: ProductionWeights, inputs: RankingInputs, rows: HashedRows, config):
    """The candidates: [B, C, D] tokens (scaled) and [B, C] bool real candidates."""
    dtype = jnp.dtype(config.compute_dtype)
    seq = inputs.candidates
    tokens = sequence_tokens(
        w, seq, rows.candidate_posts, rows.candidate_authors, w.candidates, config, dtype, True
    )
    return tokens * config.input_scale, post_valid(seq)
