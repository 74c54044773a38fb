"""Seeded values of the feed's features for X's production ranker, as a request carries them
(JSON values, the ranker's input names): semantic IDs by post id, a profile, a request's
impression context. The artifacts' example request, the clients' generated users, Locust and
the benchmarks draw them here; numpy only."""

from __future__ import annotations

from typing import Any

import numpy as np

from phoenix.feed_features import PROFILE_FEATURES, SID_CODEBOOK_SIZE, SID_NUM_LEVELS, local_hour

REFERENCE_TIME = 1_755_000_000  # a request's "now" unless given, Unix seconds


def post_semantic_ids(post_ids) -> np.ndarray:
    """[..., SID_NUM_LEVELS] int32 codes in [1, 256] drawn from each post id (a post keeps its
    codes in every request that names it; 0 ids get 0, missing)."""
    ids = np.asarray(post_ids, np.int64)
    levels = np.arange(SID_NUM_LEVELS, dtype=np.uint64)
    with np.errstate(over="ignore"):  # the mix wraps by design (splitmix64's constants)
        x = ids.astype(np.uint64)[..., None] + (levels + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    codes = (x % np.uint64(SID_CODEBOOK_SIZE)).astype(np.int32) + 1
    return np.where(ids[..., None] == 0, 0, codes).astype(np.int32)


def random_profile(rng: np.random.Generator) -> dict[str, Any]:
    """One user's profile features as JSON values (feed_features' names and ranges)."""
    out: dict[str, Any] = {}
    for f in PROFILE_FEATURES:
        if f.kind == "apps":
            out[f.name] = (rng.random(f.width) < 0.2).astype(int).tolist()
        elif f.kind == "float":
            out[f.name] = round(float(rng.uniform(f.low, f.high)), 4)
        else:
            out[f.name] = int(rng.integers(int(f.low), int(f.high) + 1))
    return out


def production_features(
    rng: np.random.Generator,
    history_post_ids,
    candidate_post_ids,
    now: int = REFERENCE_TIME,
) -> dict[str, Any]:
    """A request's production features as JSON values: impressions over the week before
    ``now`` (oldest first) of posts created up to three days before each, the viewer's
    timezone and local hours, semantic IDs by post (``post_semantic_ids``), the candidates'
    ages and the profile."""
    profile = random_profile(rng)
    zone = int(profile["timezone"])
    count, candidates = len(history_post_ids), len(candidate_post_ids)
    impressions = np.sort(now - rng.integers(60, 7 * 86_400, count))
    created = impressions - rng.integers(0, 3 * 86_400, count)
    zones = np.full(count, zone)
    return {
        "history_impression_time": impressions.tolist(),
        "history_creation_time": created.tolist(),
        "history_timezone": zones.tolist(),
        "history_hour_of_day": local_hour(impressions, zones).tolist(),
        "history_semantic_ids": post_semantic_ids(history_post_ids).tolist(),
        "candidate_timezone": [zone] * candidates,
        "candidate_hour_of_day": [int(local_hour(now, zone))] * candidates,
        "candidate_semantic_ids": post_semantic_ids(candidate_post_ids).tolist(),
        "candidate_post_age_seconds": rng.integers(0, 3 * 86_400, candidates).tolist(),
        **profile,
    }
