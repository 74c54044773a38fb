"""How a synthetic world's user reacts to a post: the world's engagement model (numpy only).

``world`` below is a ``synthetic.World`` (not annotated: that module imports this one). One
model, used both by the log generator (``synthetic.make_impressions``) and by the simulated
users of a load test (``phoenix.world.simulate``), so an online metric measures the world the
models were trained on. Users and posts are indices into the world's arrays; ``ts`` is the view
time (a post's age at view time is ``ts`` minus its creation time); ``surface`` indexes
``SURFACE_NAMES``.

- the affinity of user u for post p is
      a = 2.5 interest[u, topic] + 0.8 follows(u, author) + 0.4 (author + post quality)
          - 0.35 age_days - 0.8 dislike[u, topic] + surface offset
- each positive action fires with probability sigmoid(base + slope * a) (photo_expand only on
  photos, vqv only on videos, follow_author only for authors not yet followed); the negative
  actions (not_interested, block_author, mute_author, report) fire with
  sigmoid(base - slope * a + weight * dislike[u, topic]);
- dwell seconds are log-normal with a median of exp(1.3 + 0.5 a), at most 600 s; ``dwell`` is
  dwell >= 8 s and ``dwell_time`` dwell >= 20 s (their probabilities are the log-normal's tails).

``sample_reactions`` draws actions and dwell from a generator in one fixed order (uniforms for
the 19 actions, then one normal per view), the order the log generator has always used.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from phoenix.config import ACTION_NAMES

DAY = 86_400
SURFACE_NAMES = ("home_for_you", "home_following", "search", "profile", "notifications")
DWELL_THRESHOLD_S = 8.0  # ``dwell``
LONG_DWELL_THRESHOLD_S = 20.0  # ``dwell_time``
MAX_DWELL_S = 600.0

# Ground-truth weights of the affinity (see the module docstring).
W_INTEREST = 2.5
W_FOLLOW = 0.8
W_QUALITY = 0.4
W_AGE_PER_DAY = 0.35
W_DISLIKE = 0.8
SURFACE_OFFSET = np.array([0.0, 0.2, 0.4, -0.2, 0.1], np.float32)  # per SURFACE_NAMES
DWELL_MU, DWELL_SLOPE, DWELL_SIGMA = 1.3, 0.5, 0.7

# (base, slope on affinity, weight of dislike) per action; dwell columns come from dwell seconds.
ACTION_PARAMS = {
    "favorite": (-3.5, 1.6, 0.0),
    "reply": (-5.8, 1.6, 0.0),
    "repost": (-5.3, 1.6, 0.0),
    "photo_expand": (-2.2, 0.9, 0.0),
    "click": (-2.5, 0.9, 0.0),
    "profile_click": (-4.5, 0.8, 0.0),
    "vqv": (-1.6, 1.0, 0.0),
    "share": (-5.5, 1.3, 0.0),
    "share_via_dm": (-6.0, 1.3, 0.0),
    "share_via_copy_link": (-6.5, 1.2, 0.0),
    "quote": (-6.0, 1.5, 0.0),
    "quoted_click": (-6.0, 0.8, 0.0),
    "follow_author": (-6.5, 1.2, 0.0),
    "not_interested": (-4.5, -0.8, 2.5),
    "block_author": (-7.5, -0.6, 2.0),
    "mute_author": (-7.0, -0.6, 2.0),
    "report": (-8.0, -0.5, 1.8),
}
ACTION_INDEX = {name: i for i, name in enumerate(ACTION_NAMES)}
DWELL_COLUMNS = (("dwell", DWELL_THRESHOLD_S), ("dwell_time", LONG_DWELL_THRESHOLD_S))


class Reactions(NamedTuple):
    """What users did on the posts they viewed (index-aligned with the views)."""

    probs: np.ndarray  # float32 [..., 19]: the probabilities the actions were drawn with
    actions: np.ndarray  # uint8 [..., 19]
    dwell_seconds: np.ndarray  # float32 [...]


def follows_author(world, users: np.ndarray, posts: np.ndarray) -> np.ndarray:
    """Whether each user follows the author of each post (broadcasting)."""
    author = world.post_author[posts]
    followed = np.zeros(np.broadcast_shapes(np.shape(users), np.shape(posts)), bool)
    for f in range(world.follows.shape[1]):
        followed |= world.follows[users, f] == author
    return followed


def affinity(
    world, users: np.ndarray, posts: np.ndarray, ts: np.ndarray | np.integer, surface=0
) -> np.ndarray:
    """Ground-truth affinity of user indices and post indices (same shape; broadcasting)."""
    topic = world.post_topic[posts]
    author = world.post_author[posts]
    age_days = np.maximum(ts - world.post_created_ts[posts], 0) / DAY
    return (
        W_INTEREST * world.interest[users, topic]
        + W_FOLLOW * follows_author(world, users, posts)
        + W_QUALITY * (world.author_quality[author] + world.post_quality[posts])
        - W_AGE_PER_DAY * age_days
        - W_DISLIKE * world.dislike[users, topic]
        + SURFACE_OFFSET[surface]
    ).astype(np.float32)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _normal_sf(z: np.ndarray) -> np.ndarray:
    from scipy.special import ndtr  # the standard normal's CDF, vectorised

    return 1.0 - ndtr(z)


def action_probabilities(
    world, users: np.ndarray, posts: np.ndarray, ts: np.ndarray, surface=0
) -> np.ndarray:
    """Ground-truth probability of every action, float32 [..., 19] (the ceiling's scores)."""
    a = affinity(world, users, posts, ts, surface).astype(np.float64)
    dislike = world.dislike[users, world.post_topic[posts]]
    media = world.post_media[posts]
    followed = follows_author(world, users, posts)
    probs = np.zeros(a.shape + (len(ACTION_NAMES),), np.float32)
    for name, (base, slope, dislike_weight) in ACTION_PARAMS.items():
        p = _sigmoid(base + slope * a + dislike_weight * dislike)
        if name == "photo_expand":
            p = np.where(media == 1, p, 0.0)
        elif name == "vqv":
            p = np.where(media == 2, p, 0.0)
        elif name == "follow_author":
            p = np.where(followed, 0.0, p)
        probs[..., ACTION_INDEX[name]] = p
    mu = DWELL_MU + DWELL_SLOPE * a
    for name, threshold in DWELL_COLUMNS:
        probs[..., ACTION_INDEX[name]] = _normal_sf((np.log(threshold) - mu) / DWELL_SIGMA)
    return probs


def sample_reactions(
    world,
    users: np.ndarray,
    posts: np.ndarray,
    ts: np.ndarray,
    surface,
    rng: np.random.Generator,
) -> Reactions:
    """Actions and dwell seconds of users viewing posts (1-d, index-aligned), drawn from
    ``rng``: the actions with ``action_probabilities``, dwell from the log-normal; the two dwell
    columns then say whether dwell passed their thresholds."""
    probs = action_probabilities(world, users, posts, ts, surface)
    actions = (rng.random(probs.shape, dtype=np.float32) < probs).astype(np.uint8)
    a = affinity(world, users, posts, ts, surface)
    dwell = np.exp(DWELL_MU + DWELL_SLOPE * a + DWELL_SIGMA * rng.standard_normal(len(a)))
    dwell = np.round(np.minimum(dwell, MAX_DWELL_S), 2).astype(np.float32)
    for name, threshold in DWELL_COLUMNS:
        actions[:, ACTION_INDEX[name]] = dwell >= threshold
    return Reactions(probs, actions, dwell)
