"""Simulated users of a synthetic world: they view a served feed and react by the world's model.

A ``SimulatedUser`` is one of the world's users (its planted interests, follows and dislikes). It
views the top posts of a feed it was served and draws its actions and dwell with
``reactions.sample_reactions``, the function the log generator draws the training logs with, so
an online metric measures the world the models were trained on. What it did comes back as
``Engagement`` events (``phoenix.user_state.events``), ready for the user-state event path.

Times: the engagements carry the wall-clock time (``now``), as production events would; the age
of a post at view time is taken on the world's clock (``WorldClock``), which starts where the
world's logs end (``spec.end_ts``, where the served corpus is fresh) and then runs with the wall
clock. Posts the world does not know (not among its post ids) are skipped and counted.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from phoenix.artifact_parts import stream
from phoenix.user_state.actions import action_bits
from phoenix.user_state.events import Engagement
from phoenix.world.reactions import SURFACE_NAMES, Reactions, sample_reactions
from phoenix.world.synthetic import World

HOME_FOR_YOU = SURFACE_NAMES.index("home_for_you")


def index_of(known_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Index of each id in ``known_ids`` (unique ids, any order); -1 where it is unknown."""
    order = np.argsort(known_ids, kind="stable")
    ids = np.asarray(ids, np.int64)
    at = np.minimum(np.searchsorted(known_ids, ids, sorter=order), len(known_ids) - 1)
    found = order[at]
    return np.where(known_ids[found] == ids, found, -1)


def draw_user_ids(world: World, count: int, seed: int) -> np.ndarray:
    """``count`` distinct world users (as many as there are, at most), drawn reproducibly for
    ``seed`` by the world's activity: users who open the app more are likelier to be simulated."""
    count = min(count, len(world.user_ids))
    weights = world.activity.astype(np.float64)
    rng = stream(seed, "simulated-users")
    picked = rng.choice(len(world.user_ids), count, replace=False, p=weights / weights.sum())
    return world.user_ids[picked]


@dataclass(frozen=True)
class WorldClock:
    """World time of a wall-clock time: ``start_world_ts`` at ``start_wall_ts``, then the same
    pace as the wall clock."""

    start_wall_ts: float
    start_world_ts: float

    @classmethod
    def after_logs(cls, world: World, start_wall_ts: Optional[float] = None) -> WorldClock:
        """The clock that starts where the world's logs end."""
        wall = time.time() if start_wall_ts is None else start_wall_ts
        return cls(wall, float(world.spec.end_ts))

    def world_ts(self, wall_ts: float) -> int:
        return int(self.start_world_ts + (wall_ts - self.start_wall_ts))


@dataclass(frozen=True)
class FeedReaction:
    """What a user did on the top of a feed: one row per viewed post the world knows."""

    user_id: int
    post_ids: np.ndarray  # int64 [V] the viewed posts, in feed order
    in_network: Optional[np.ndarray]  # bool [V] when the feed said so
    reactions: Reactions  # probs and actions [V, 19], dwell_seconds [V]
    events: list[Engagement]  # the views with at least one action
    unknown_posts: int  # posts among the top that the world does not know (skipped)

    @property
    def impressions(self) -> int:
        return len(self.post_ids)


class SimulatedUser:
    """One of the world's users, reacting to feeds with its own seeded generator."""

    def __init__(self, world: World, user_id: int, seed: int, clock: WorldClock):
        (index,) = index_of(world.user_ids, np.array([user_id]))
        if index < 0:
            raise ValueError(f"user {user_id} is not one of the world's users")
        self.world, self.user_id, self.index, self.clock = world, int(user_id), int(index), clock
        self.rng = stream(seed, "simulated-user", str(user_id))

    def react(
        self,
        post_ids: Sequence[int],
        in_network: Optional[Sequence[bool]] = None,
        top_n: int = 10,
        now: Optional[float] = None,
    ) -> FeedReaction:
        """View the top ``top_n`` of a served feed (ranked post ids) and react to each post."""
        now = time.time() if now is None else now
        top = np.asarray(post_ids, np.int64)[:top_n]
        posts = index_of(self.world.post_ids, top)
        known = posts >= 0
        posts = posts[known]
        users = np.full(len(posts), self.index)
        ts = np.full(len(posts), self.clock.world_ts(now), np.int64)
        drawn = sample_reactions(self.world, users, posts, ts, HOME_FOR_YOU, self.rng)
        flags = None if in_network is None else np.asarray(in_network, bool)[:top_n][known]
        return FeedReaction(
            self.user_id,
            top[known],
            flags,
            drawn,
            self.engagements(posts, drawn, now),
            int((~known).sum()),
        )

    def engagements(self, posts: np.ndarray, drawn: Reactions, now: float) -> list[Engagement]:
        """The events of the views with at least one action."""
        bits = action_bits(drawn.actions).tolist()  # [views] action masks
        world = self.world
        return [
            Engagement(
                user_id=self.user_id,
                post_id=int(world.post_ids[post]),
                author_id=int(world.author_ids[world.post_author[post]]),
                ts=now,
                actions=int(mask),
                surface=HOME_FOR_YOU,
                dwell_seconds=float(dwell),
            )
            for post, mask, dwell in zip(posts, bits, drawn.dwell_seconds)
            if mask
        ]
