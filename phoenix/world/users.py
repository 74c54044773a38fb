"""The users of a trained synthetic world as user-state events, and loading them into a store.

A trained artifact directory's ``training.json`` names the world it was trained on (spec and
seed); ``phoenix.world.synthetic.generate_logs`` rebuilds it, and its logged impressions,
exactly. Each user then gets:

- engagements: the user's impressions with at least one action before the held-out days
  (what training and the evaluation take as the history), the newest ``history_cap`` of them,
  with their action flags, product surface, dwell seconds and time, and what the production
  ranker reads beside: the user's timezone, the local hour the logs have (the world's clock:
  the shift below is no whole number of days) and the post's creation time;
- follows: the authors the world has the user follow;
- a profile (``phoenix.world.features``), dated at the logs' first second;

and each author its recent posts: the retrieval corpus's posts created before the held-out
days (the corpus the served retriever searches, so an in-network post is a known post).

The world's clock is years old, and the store reads histories within a window of now: every
time is shifted by ``shift`` seconds so that the held-out days begin at the moment of loading
(the newest engagement just before now). Follows are dated at the logs' first second.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import numpy as np
from tqdm import tqdm

from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.files import TRAINING_FILE
from phoenix.user_state.actions import action_bits
from phoenix.user_state.events import Engagement, Event, Follow, Post, Profile
from phoenix.user_state.limits import UserStateLimits
from phoenix.user_state.store import AppliedCounts, UserStateStore

if TYPE_CHECKING:  # numpy only, but slow to build: imported on demand
    from phoenix.world.synthetic import World

LOAD_BATCH_USERS = 500  # users per pipeline: about 15,000 events, one round trip


@dataclass
class WorldUsers:
    """A trained world's users and their engagements, as events (times shifted to now)."""

    world: World
    user: np.ndarray  # [N] int32 user index of each engagement, sorted by (user, time)
    post: np.ndarray  # [N] int32 post index
    ts: np.ndarray  # [N] int64 world seconds
    surface: np.ndarray  # [N] int8
    dwell_seconds: np.ndarray  # [N] float32
    action_bits: np.ndarray  # [N] uint32, bit i = ACTION_NAMES[i]
    timezone: np.ndarray  # [N] int32 the viewer's
    hour_of_day: np.ndarray  # [N] int32 local hour + 1, on the world's clock
    starts: np.ndarray  # [U + 1] offsets of each user's engagements
    shift: float  # seconds added to every world time
    followed_at: float  # when every follow is dated: the logs' first second, shifted

    @classmethod
    def from_artifacts(
        cls, artifact_dir: str | Path, now: Optional[float] = None, keep: Optional[int] = None
    ) -> WorldUsers:
        """The world of ``artifact_dir``'s training.json, its users' newest ``keep``
        engagements (default: ``UserStateLimits().history_cap``) before the held-out days."""
        from phoenix.world import synthetic  # numpy only, but slow to build: on demand

        spec, seed = read_world_spec(artifact_dir)
        world, imp = synthetic.generate_logs(spec, seed)
        engaged = np.flatnonzero(imp.actions.any(axis=1) & (imp.ts < spec.split_ts))
        keep = UserStateLimits().history_cap if keep is None else keep
        engaged = engaged[newest_per_group(imp.user[engaged], keep)]
        bits = action_bits(imp.actions[engaged])  # [N] uint32
        user = imp.user[engaged]
        starts = np.searchsorted(user, np.arange(spec.num_users + 1))
        now = time.time() if now is None else now
        return cls(
            world=world,
            user=user,
            post=imp.post[engaged],
            ts=imp.ts[engaged],
            surface=imp.surface[engaged],
            dwell_seconds=imp.dwell_seconds[engaged],
            action_bits=bits,
            timezone=imp.timezone(world)[engaged],
            hour_of_day=imp.hour_of_day(world)[engaged],
            starts=starts,
            shift=float(now - spec.split_ts),
            followed_at=float(synthetic.START_TS + now - spec.split_ts),
        )

    @property
    def user_ids(self) -> np.ndarray:
        return self.world.user_ids

    def engagement_counts(self) -> np.ndarray:
        """[U] engagements of each user."""
        return np.diff(self.starts)

    def most_active(self, count: int) -> np.ndarray:
        """The ``count`` user indices with the most engagements (ties: the lower index)."""
        return np.argsort(-self.engagement_counts(), kind="stable")[:count]

    def population(self, count: Optional[int] = None) -> np.ndarray:
        """The first ``count`` user indices (default: all): the users `phoenix-events
        load-world --users`, the demo and Locust's by-id mode take. The world draws its users
        independently, so the first ones are a random sample of them."""
        return np.arange(len(self.user_ids) if count is None else min(count, len(self.user_ids)))

    def index_of(self, user_id: int) -> int:
        found = np.flatnonzero(self.world.user_ids == user_id)
        if not len(found):
            raise KeyError(f"user {user_id} is not a user of this world")
        return int(found[0])

    def user_events(self, index: int) -> list[Event]:
        """User ``index``'s engagements (oldest first), follows and profile."""
        w, lo, hi = self.world, self.starts[index], self.starts[index + 1]
        user_id = int(w.user_ids[index])
        posts = self.post[lo:hi]
        authors = w.author_ids[w.post_author[posts]]
        created = w.post_created_ts[posts] + self.shift
        events: list[Event] = [
            Engagement(user_id, int(w.post_ids[p]), int(a), float(t) + self.shift, int(bits),
                       int(surface), float(dwell), int(zone), int(hour), float(made))  # fmt: skip
            for p, a, t, bits, surface, dwell, zone, hour, made in zip(
                posts.tolist(), authors.tolist(), self.ts[lo:hi].tolist(),
                self.action_bits[lo:hi].tolist(), self.surface[lo:hi].tolist(),
                self.dwell_seconds[lo:hi].tolist(), self.timezone[lo:hi].tolist(),
                self.hour_of_day[lo:hi].tolist(), created.tolist(),
            )
        ]  # fmt: skip
        followed = np.unique(w.follows[index])
        events += [Follow(user_id, int(w.author_ids[a]), self.followed_at) for a in followed]
        return events + [self.profile(index)]

    def profile(self, index: int) -> Profile:
        """User ``index``'s profile event, dated when the follows are."""
        values = {name: array[index] for name, array in self.world.profiles.arrays().items()}
        apps = tuple(np.flatnonzero(values.pop("installed_apps")).tolist())
        plain = {name: value.item() for name, value in values.items()}
        user_id = int(self.world.user_ids[index])
        return Profile(user_id, self.followed_at, installed_apps=apps, **plain)

    def author_posts(self) -> list[Post]:
        """The corpus's posts created before the held-out days, as Post events."""
        w, spec = self.world, self.world.spec
        first = spec.split_ts - int(spec.corpus_days * 86_400)
        rows = np.flatnonzero((w.post_created_ts >= first) & (w.post_created_ts < spec.split_ts))
        return [
            Post(
                int(w.post_ids[p]),
                int(w.author_ids[w.post_author[p]]),
                float(w.post_created_ts[p]) + self.shift,
            )  # fmt: skip
            for p in rows.tolist()
        ]


def newest_per_group(groups: np.ndarray, keep: int) -> np.ndarray:
    """Mask of the last ``keep`` items of each run of equal ``groups`` (sorted by group)."""
    n = len(groups)
    if n == 0:
        return np.zeros(0, bool)
    run_end = np.r_[np.flatnonzero(groups[1:] != groups[:-1]), n - 1]  # last index of each run
    end_of = np.repeat(run_end, np.diff(np.r_[-1, run_end]))
    return end_of - np.arange(n) < keep


def read_world_spec(artifact_dir: str | Path):
    """(WorldSpec, seed) of the world ``artifact_dir`` was trained on."""
    from phoenix.world.synthetic import WorldSpec

    path = Path(artifact_dir) / TRAINING_FILE
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in dataclasses.fields(WorldSpec)}
        spec = WorldSpec(**{k: v for k, v in summary["world"].items() if k in known})
    except OSError as error:
        raise ArtifactError(f"{path}: cannot be read ({error.strerror}); a trained artifact "
                            "directory has one (python -m phoenix.training)") from None  # fmt: skip
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ArtifactError(f"{path}: no usable 'world' spec ({error!r})") from None
    return spec, int(summary.get("seed", 0))


@dataclass
class Loaded:
    users: int = 0
    applied: AppliedCounts = dataclasses.field(default_factory=AppliedCounts)
    seconds: float = 0.0

    def summary(self, where: str) -> str:
        a = self.applied
        return (
            f"{self.users:,} users loaded into {where} in {self.seconds:.1f} s: "
            f"{a.engagements:,} engagements, {a.follows:,} follows, {a.posts:,} authors' posts, "
            f"{a.profiles:,} profiles"
        )


def _batches(indices: Sequence[int], size: int) -> Iterator[Sequence[int]]:
    for start in range(0, len(indices), size):
        yield indices[start : start + size]


def load_users(
    store: UserStateStore,
    world: WorldUsers,
    users: Optional[Sequence[int] | np.ndarray] = None,
    *,
    batch_users: int = LOAD_BATCH_USERS,
    progress: bool = False,
) -> Loaded:
    """Apply the events of ``users`` (indices; default: every user) and the authors' recent
    posts to ``store``, ``batch_users`` users per pipeline."""
    started = time.perf_counter()
    indices = np.arange(len(world.user_ids)) if users is None else np.asarray(users)
    loaded = Loaded(users=len(indices))
    add = loaded.applied.add
    add(store.apply(world.author_posts()))
    with tqdm(total=len(indices), unit=" users", desc="load users", disable=not progress or None,
              mininterval=1.0) as bar:  # fmt: skip
        for batch in _batches(indices.tolist(), batch_users):
            add(store.apply([e for index in batch for e in world.user_events(index)]))
            bar.update(len(batch))
    loaded.seconds = time.perf_counter() - started
    return loaded
