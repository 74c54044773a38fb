"""Synthetic engagement logs with a planted structure (numpy only, no file I/O).

A small world of users, authors and posts, and the impressions a feed showed them over some
days, each with a product surface, dwell seconds and the 19 actions of the original's ACTIONS
list. The actions are drawn from a known ground-truth model, so the trained towers can be
judged against its own ranking (the ceiling):

- every author writes about one home topic; a post has a topic (usually its author's), an
  author, a media type (text, photo, video), a creation time and a quality;
- every user likes one or two topics (``interest`` 1.0 and 0.6), may dislike one, and follows a
  few authors of the topics they like;
- users react to a post by the world's engagement model, ``phoenix.world.reactions`` (an
  affinity from interest, follows, quality, age, dislike and surface; 17 actions drawn from it,
  dwell seconds log-normal around it), the one model simulated users of a load test share;
- the feed that produced the impressions (the logging policy) mixes posts of the topics a user
  likes (55%), posts of followed authors (10%) and recent posts of any topic (35%), favouring
  recent posts (age ~ exponential with a mean of 18 hours, at most ``max_post_age_days``);
- for X's production ranker, posts have semantic IDs and users profiles (a home timezone among
  them; an impression's timezone is its user's, its local hour follows from its time):
  ``phoenix.world.features``. The engagement model reads none of them.

Generation is vectorised and deterministic for a seed: every array comes from its own named
stream (``phoenix.artifact_parts.stream``). ``phoenix.world.logs`` writes and reads the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from phoenix.artifact_parts import stream, unique_positive_ids
from phoenix.config import NEGATIVE_ACTIONS
from phoenix.feed_features import local_hour
from phoenix.world.features import UserProfiles, draw_profiles, draw_semantic_ids
from phoenix.world.reactions import (  # noqa: F401  (the world's model, re-exported)
    ACTION_INDEX,
    DAY,
    DWELL_THRESHOLD_S,
    LONG_DWELL_THRESHOLD_S,
    SURFACE_NAMES,
    action_probabilities,
    affinity,
    sample_reactions,
)

START_TS = 1_700_000_000  # first second of day 0 of the logs
TOPIC_NAMES = (
    "sports", "politics", "music", "tech", "gaming", "food", "science", "movies",
    "travel", "fashion", "finance", "health", "art", "books", "pets", "cars",
)  # fmt: skip
MEDIA_NAMES = ("text", "photo", "video")
POSITIVE_ACTIONS = ("favorite", "reply", "repost", "quote")  # a retrieval "positive"
SECONDARY_INTEREST = 0.6
POST_QUALITY_STD = 0.3
AUTHOR_QUALITY_STD = 0.5
POST_AGE_SCALE_DAYS = 0.75  # logging policy: age of a shown post ~ exponential

# Logging policy: where an impression's post comes from.
SOURCE_LIKED, SOURCE_FOLLOWED = 0.55, 0.10  # the rest: recent posts of any topic


@dataclass(frozen=True)
class WorldSpec:
    """Sizes of a synthetic world and its logs."""

    num_users: int
    num_authors: int
    num_posts: int
    num_topics: int = 16
    num_days: int = 8  # days of impressions: 0 .. num_days - 1
    held_out_days: int = 1  # the last days, for evaluation only
    sessions_per_day: float = 0.8  # mean over users (log-normal activity)
    impressions_per_session: float = 8.0  # mean (1 + Poisson)
    max_impressions_per_session: int = 16
    follows_per_user: int = 5
    max_post_age_days: float = 2.0  # the feed shows no older post
    pre_days: float = 2.0  # posts exist from day -pre_days on
    corpus_days: float = 1.0  # the retrieval corpus: posts of the last days, and new ones

    def __post_init__(self):
        if not 1 <= self.num_topics <= len(TOPIC_NAMES):
            raise ValueError(f"num_topics must lie in [1, {len(TOPIC_NAMES)}]")
        if not 0 < self.held_out_days < self.num_days:
            raise ValueError("held_out_days must lie in [1, num_days)")

    @property
    def split_ts(self) -> int:
        """First second of the held-out days."""
        return START_TS + (self.num_days - self.held_out_days) * DAY

    @property
    def end_ts(self) -> int:
        return START_TS + self.num_days * DAY


@dataclass
class World:
    """Users, authors and posts with their planted ground truth (index-aligned arrays)."""

    spec: WorldSpec
    user_ids: np.ndarray  # int64 [U]
    interest: np.ndarray  # float32 [U, T]: 1.0 primary, 0.6 secondary, else 0
    dislike: np.ndarray  # float32 [U, T]: 1.0 for the disliked topic
    follows: np.ndarray  # int32 [U, F] author indices
    activity: np.ndarray  # float32 [U] sessions per day
    author_ids: np.ndarray  # int64 [A]
    author_topic: np.ndarray  # int32 [A]
    author_quality: np.ndarray  # float32 [A]
    post_ids: np.ndarray  # int64 [P]
    post_author: np.ndarray  # int32 [P] author index
    post_topic: np.ndarray  # int32 [P]
    post_media: np.ndarray  # int8 [P]
    post_created_ts: np.ndarray  # int64 [P]
    post_quality: np.ndarray  # float32 [P]
    post_semantic_ids: np.ndarray  # int32 [P, SID_NUM_LEVELS], codes 1..256 (0: none)
    profiles: UserProfiles  # every user's profile (features.py)
    topic_names: tuple[str, ...] = field(default=())

    @property
    def author_handles(self) -> np.ndarray:
        """'@<topic>_<n>' per author: readable names for the demo."""
        counts: dict[int, int] = {}
        handles = []
        for topic in self.author_topic.tolist():
            counts[topic] = counts.get(topic, 0) + 1
            handles.append(f"@{self.topic_names[topic]}_{counts[topic]}")
        return np.array(handles)


@dataclass
class Impressions:
    """What the feed showed, sorted by (user, time); one session shares one timestamp."""

    user: np.ndarray  # int32 [N] user index
    post: np.ndarray  # int32 [N] post index
    ts: np.ndarray  # int64 [N] impression time (seconds)
    request: np.ndarray  # int64 [N] session id (one feed request)
    surface: np.ndarray  # int8 [N]
    dwell_seconds: np.ndarray  # float32 [N]
    actions: np.ndarray  # uint8 [N, 19]

    def __len__(self) -> int:
        return int(self.user.shape[0])

    def timezone(self, world: World) -> np.ndarray:
        """int32 [N]: each impression's timezone (its user's home timezone)."""
        return world.profiles.timezone[self.user]

    def hour_of_day(self, world: World) -> np.ndarray:
        """int32 [N]: each impression's local hour + 1 (1..24; ``local_hour``)."""
        return local_hour(self.ts, self.timezone(world))


# ----------------------------------------------------------------------------------------
# The world
# ----------------------------------------------------------------------------------------


def make_world(spec: WorldSpec, seed: int) -> World:
    """Users, authors and posts of ``spec`` drawn from ``seed``."""
    authors = _draw_authors(spec, seed)
    users = _draw_users(spec, seed)
    posts = _draw_posts(spec, seed, authors["author_topic"], authors["author_quality"])
    sids = draw_semantic_ids(
        seed,
        spec.num_topics,
        posts["post_topic"],
        posts["post_media"],
        posts["post_author"],
        posts["post_quality"],
        spec.num_authors,
    )
    return World(
        spec=spec,
        follows=_draw_follows(spec, seed, authors["author_topic"], users["interest"]),
        topic_names=TOPIC_NAMES[: spec.num_topics],
        post_semantic_ids=sids,
        profiles=draw_profiles(seed, users["interest"]),
        **authors,
        **posts,
        **users,
    )


# Each part of the world comes from a stream of its own (``stream(seed, part)``), so the
# parts are independent of the order they are drawn in; each returns World's fields.


def _draw_authors(spec: WorldSpec, seed: int) -> dict[str, np.ndarray]:
    rng = stream(seed, "authors")
    return dict(
        author_ids=unique_positive_ids(rng, spec.num_authors),
        author_topic=rng.integers(0, spec.num_topics, spec.num_authors).astype(np.int32),
        author_quality=rng.normal(0.0, AUTHOR_QUALITY_STD, spec.num_authors).astype(np.float32),
    )


def _draw_posts(
    spec: WorldSpec, seed: int, author_topic: np.ndarray, author_quality: np.ndarray
) -> dict[str, np.ndarray]:
    T = spec.num_topics
    rng = stream(seed, "posts")
    post_ids = unique_positive_ids(rng, spec.num_posts)
    prolific = np.exp(author_quality.astype(np.float64))
    post_author = rng.choice(spec.num_authors, spec.num_posts, p=prolific / prolific.sum())
    post_topic = np.where(
        rng.random(spec.num_posts) < 0.85,
        author_topic[post_author],
        rng.integers(0, T, spec.num_posts),
    ).astype(np.int32)
    post_media = rng.choice(3, spec.num_posts, p=[0.5, 0.3, 0.2]).astype(np.int8)
    first = START_TS - int(spec.pre_days * DAY)
    post_created_ts = np.sort(rng.integers(first, spec.end_ts, spec.num_posts)).astype(np.int64)
    return dict(
        post_ids=post_ids,
        post_author=post_author.astype(np.int32),
        post_topic=post_topic,
        post_media=post_media,
        post_created_ts=post_created_ts,
        post_quality=rng.normal(0.0, POST_QUALITY_STD, spec.num_posts).astype(np.float32),
    )


def _draw_users(spec: WorldSpec, seed: int) -> dict[str, np.ndarray]:
    T = spec.num_topics
    rng = stream(seed, "users")
    U = spec.num_users
    user_ids = unique_positive_ids(rng, U)
    primary = rng.integers(0, T, U)
    secondary = (primary + rng.integers(1, max(T, 2), U)) % T
    has_secondary = (rng.random(U) < 0.7) & (T > 1)
    disliked = (primary + rng.integers(1, max(T, 2), U)) % T
    has_dislike = (rng.random(U) < 0.6) & (disliked != secondary) & (T > 1)
    interest = np.zeros((U, T), np.float32)
    interest[np.arange(U), primary] = 1.0
    interest[np.arange(U)[has_secondary], secondary[has_secondary]] = SECONDARY_INTEREST
    dislike = np.zeros((U, T), np.float32)
    dislike[np.arange(U)[has_dislike], disliked[has_dislike]] = 1.0
    activity = (spec.sessions_per_day * rng.lognormal(-0.32, 0.8, U)).astype(np.float32)
    return dict(user_ids=user_ids, interest=interest, dislike=dislike, activity=activity)


def _draw_follows(
    spec: WorldSpec, seed: int, author_topic: np.ndarray, interest: np.ndarray
) -> np.ndarray:
    """Authors of a liked topic (sampled by topic weight), 10% of any topic: int32 [U, F]."""
    rng = stream(seed, "follows")
    by_topic = _group_members(author_topic, spec.num_topics)
    F = spec.follows_per_user
    liked_topic = _sample_rows(rng, interest, F)  # [U, F]
    follows = _pick_members(rng, by_topic, liked_topic)
    anyone = rng.random((spec.num_users, F)) < 0.1
    follows[anyone] = rng.integers(0, spec.num_authors, int(anyone.sum()))
    return follows.astype(np.int32)


def _group_members(groups: np.ndarray, num_groups: int) -> list[np.ndarray]:
    return [np.flatnonzero(groups == g) for g in range(num_groups)]


def _sample_rows(rng: np.random.Generator, weights: np.ndarray, count: int) -> np.ndarray:
    """``count`` column indices per row of ``weights`` [R, K], drawn by weight (>= 0)."""
    cumulative = np.cumsum(weights, axis=1)
    draws = rng.random((weights.shape[0], count)) * cumulative[:, -1:]
    return np.minimum((draws[:, :, None] >= cumulative[:, None, :]).sum(-1), weights.shape[1] - 1)


def _pick_members(rng, members: list[np.ndarray], groups: np.ndarray) -> np.ndarray:
    """One random member of each group in ``groups`` (any shape); -1 for an empty group."""
    out = np.full(groups.shape, -1, np.int64)
    for g, pool in enumerate(members):
        where = groups == g
        if pool.size and where.any():
            out[where] = pool[rng.integers(0, pool.size, int(where.sum()))]
    return out


# ----------------------------------------------------------------------------------------
# Engagement masks
# ----------------------------------------------------------------------------------------


def positive_mask(actions: np.ndarray) -> np.ndarray:
    """Impressions [N, 19] with a positive engagement (retrieval targets)."""
    return np.any(actions[:, [ACTION_INDEX[n] for n in POSITIVE_ACTIONS]], axis=1)


def negative_mask(actions: np.ndarray) -> np.ndarray:
    return np.any(actions[:, [ACTION_INDEX[n] for n in NEGATIVE_ACTIONS]], axis=1)


# ----------------------------------------------------------------------------------------
# Impressions
# ----------------------------------------------------------------------------------------


def _latest_before(keys: np.ndarray, group_of_key: np.ndarray, groups, targets) -> np.ndarray:
    """Index of the last key <= (group, target) inside the same group; -1 if none."""
    idx = np.searchsorted(keys, (groups.astype(np.int64) << 40) + targets, side="right") - 1
    ok = idx >= 0
    ok[ok] = group_of_key[idx[ok]] == groups[ok]
    return np.where(ok, idx, -1)


def make_impressions(world: World, seed: int) -> Impressions:
    """Sessions of every user over the spec's days, with actions from the ground truth."""
    spec = world.spec
    rng = stream(seed, "sessions")
    U = spec.num_users
    sessions_per_user = rng.poisson(world.activity * spec.num_days)
    session_user = np.repeat(np.arange(U, dtype=np.int32), sessions_per_user)
    session_ts = rng.integers(START_TS, spec.end_ts, session_user.shape[0]).astype(np.int64)
    sizes = np.minimum(
        1 + rng.poisson(spec.impressions_per_session - 1, session_user.shape[0]),
        spec.max_impressions_per_session,
    )
    user = np.repeat(session_user, sizes)
    ts = np.repeat(session_ts, sizes)
    request = np.repeat(np.arange(session_user.shape[0], dtype=np.int64), sizes)
    n = user.shape[0]

    # logging policy: a source per impression, then the latest post before a target time
    rng = stream(seed, "policy")
    source = rng.choice(3, n, p=[SOURCE_LIKED, SOURCE_FOLLOWED, 1 - SOURCE_LIKED - SOURCE_FOLLOWED])
    max_age = spec.max_post_age_days * DAY
    age = np.minimum(rng.exponential(POST_AGE_SCALE_DAYS * DAY, n), max_age).astype(np.int64)
    target = ts - age - (world.post_created_ts[0] - 1)  # >= 1: seconds since the first post
    created = world.post_created_ts - (world.post_created_ts[0] - 1)
    post = np.full(n, -1, np.int64)

    liked = source == 0
    topic = _sample_rows(rng, world.interest[user[liked]], 1)[:, 0]
    order = np.lexsort((created, world.post_topic))
    keys = (world.post_topic[order].astype(np.int64) << 40) + created[order]
    found = _latest_before(keys, world.post_topic[order], topic, target[liked])
    post[np.flatnonzero(liked)] = np.where(found >= 0, order[np.maximum(found, 0)], -1)

    followed = source == 1
    author = world.follows[user[followed], rng.integers(0, world.follows.shape[1], followed.sum())]
    order = np.lexsort((created, world.post_author))
    keys = (world.post_author[order].astype(np.int64) << 40) + created[order]
    found = _latest_before(keys, world.post_author[order], author, target[followed])
    post[np.flatnonzero(followed)] = np.where(found >= 0, order[np.maximum(found, 0)], -1)

    # any topic, and every impression whose source had no post recent enough
    rest = post < 0
    found = np.searchsorted(created, target[rest], side="right") - 1
    post[np.flatnonzero(rest)] = found
    too_old = (post < 0) | (ts - world.post_created_ts[np.maximum(post, 0)] > max_age)
    too_old |= world.post_created_ts[np.maximum(post, 0)] > ts

    surface = np.where(
        source == 1,
        np.where(rng.random(n) < 0.7, 1, 0),
        rng.choice(len(SURFACE_NAMES), n, p=[0.8, 0.05, 0.05, 0.05, 0.05]),
    ).astype(np.int8)

    # a user sees a post once: keep the first impression of each (user, post)
    keep = ~too_old
    pair = user.astype(np.int64) * spec.num_posts + post
    by_time = np.lexsort((ts, pair))
    first = np.ones(n, bool)
    first[1:] = pair[by_time[1:]] != pair[by_time[:-1]]
    seen_before = np.ones(n, bool)
    seen_before[by_time[first]] = False
    keep &= ~seen_before
    order = np.lexsort((np.arange(n), ts, user))
    order = order[keep[order]]
    user, post, ts, request, surface = (x[order] for x in (user, post, ts, request, surface))
    post = post.astype(np.int32)

    # actions and dwell from the ground truth
    _, actions, dwell = sample_reactions(world, user, post, ts, surface, stream(seed, "actions"))
    return Impressions(user, post, ts, request, surface, dwell, actions)  # fields in order


def generate_logs(spec: WorldSpec, seed: int) -> tuple[World, Impressions]:
    """The world and its impressions for ``spec`` and ``seed``."""
    world = make_world(spec, seed)
    return world, make_impressions(world, seed)
