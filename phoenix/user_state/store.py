"""``UserStateStore``: a user's engagement history, follows, served posts and request log, and
authors' recent posts, in Redis or Redis Cluster (key layout: ``phoenix.user_state.keys``).

Writes (``apply``, ``mark_served``, ``log_request``) send a whole batch in one pipeline; every
write is idempotent (the same event or call twice leaves the same state) and trims what it
touched to ``UserStateLimits`` in the same pipeline, and sets the key's TTL. Reads take a batch
of users and cost one round trip per pipeline (``in_network`` two: follows, then posts): a
cluster client's pipeline sends each node its commands together.

Writes are not transactions: a reader may see a set one item over its cap between the add and
the trim of the same pipeline, which the reads' own caps hide; a writer that dies between them
leaves the trim to the next write or the key's expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import redis
from redis.exceptions import RedisClusterException

from phoenix.user_state import keys
from phoenix.user_state.actions import is_positive
from phoenix.user_state.client import Client, describe, unavailable_or_failed
from phoenix.user_state.events import Engagement, Event, Follow, Post, Unfollow
from phoenix.user_state.history import History, UserHistories, decode, encode, time_ms
from phoenix.user_state.limits import UserStateLimits


@dataclass(frozen=True)
class InNetworkPosts:
    """One user's in-network candidates, newest first."""

    post_ids: np.ndarray  # [N] int64
    author_ids: np.ndarray  # [N] int64
    created_at: np.ndarray  # [N] float64 Unix seconds

    def __len__(self) -> int:
        return len(self.post_ids)


@dataclass
class AppliedCounts:
    engagements: int = 0
    follows: int = 0
    unfollows: int = 0
    posts: int = 0

    @property
    def total(self) -> int:
        return self.engagements + self.follows + self.unfollows + self.posts


def _seconds(ts: float) -> float:
    """The score of a time: milliseconds, as the history members keep it."""
    return time_ms(ts) / 1000.0


def _below(score: float) -> str:
    """ZREMRANGEBYSCORE's bound for 'strictly below ``score``'."""
    return f"({score!r}"


def _ids(members: Sequence[bytes]) -> np.ndarray:
    return np.array([int(m) for m in members], np.int64)


class UserStateStore:
    """User state in Redis; ``client`` from ``phoenix.user_state.client.connect``."""

    def __init__(
        self,
        client: Client,
        limits: UserStateLimits = UserStateLimits(),
        *,
        name: str | None = None,
    ):
        self.client = client
        self.limits = limits
        self.name = name or describe(client)  # every error names it

    # -- round trips ---------------------------------------------------------------------

    def _pipeline(self):
        return self.client.pipeline(transaction=False)

    def _execute(self, pipe, what: str) -> list:
        try:
            return pipe.execute()
        except (redis.RedisError, RedisClusterException) as error:
            raise unavailable_or_failed(self.name, what, error) from error

    def ping(self) -> None:
        """UserStateUnavailable naming the store unless it answers."""
        pipe = self._pipeline()
        pipe.ping()
        self._execute(pipe, "ping")

    # -- writes --------------------------------------------------------------------------

    def _add_capped(
        self, pipe, key: str, member, score: float, cap: int, keep_after=None, ttl=None
    ):
        """ZADD, then drop members scored below ``keep_after`` and all but the newest ``cap``."""
        pipe.zadd(key, {member: score})
        if keep_after is not None:
            pipe.zremrangebyscore(key, "-inf", _below(keep_after))
        pipe.zremrangebyrank(key, 0, -(cap + 1))
        if ttl is not None:
            pipe.expire(key, max(1, int(ttl)))

    def _add_engagement(self, pipe, event: Engagement) -> None:
        lim, score, member = self.limits, _seconds(event.ts), encode(event)
        kinds = [keys.SEQUENCE] + ([keys.POSITIVE] if is_positive(event.actions) else [])
        for kind in kinds:
            self._add_capped(
                pipe,
                keys.user_key(event.user_id, kind),
                member,
                score,
                lim.history_cap,
                keep_after=score - lim.history_window_s,
                ttl=lim.history_window_s,
            )

    def _add_event(self, pipe, event: Event, counts: AppliedCounts) -> None:
        if isinstance(event, Engagement):
            self._add_engagement(pipe, event)
            counts.engagements += 1
        elif isinstance(event, Follow):
            key = keys.user_key(event.user_id, keys.FOLLOWS)
            self._add_capped(
                pipe, key, event.author_id, _seconds(event.ts), self.limits.follows_cap
            )
            counts.follows += 1
        elif isinstance(event, Unfollow):
            pipe.zrem(keys.user_key(event.user_id, keys.FOLLOWS), event.author_id)
            counts.unfollows += 1
        elif isinstance(event, Post):
            created = _seconds(event.ts)
            self._add_capped(
                pipe,
                keys.author_posts_key(event.author_id),
                event.post_id,
                created,
                self.limits.author_posts_cap,
                keep_after=created - self.limits.author_posts_retention_s,
                ttl=self.limits.author_posts_retention_s,
            )
            counts.posts += 1
        else:
            raise TypeError(f"not a user-state event: {event!r}")

    def apply(self, events: Iterable[Event]) -> AppliedCounts:
        """Apply ``events`` in order, in one pipeline; applying them again changes nothing."""
        pipe, counts = self._pipeline(), AppliedCounts()
        for event in events:
            self._add_event(pipe, event, counts)
        if counts.total:
            self._execute(pipe, f"applying {counts.total} events")
        return counts

    def mark_served(self, user_id: int, post_ids: Iterable[int], now: float) -> None:
        """Record posts served to a user at ``now`` (kept served_ttl_s, newest served_cap)."""
        lim, score = self.limits, _seconds(now)
        key = keys.user_key(user_id, keys.SERVED)
        members = {int(p): score for p in post_ids}
        if not members:
            return
        pipe = self._pipeline()
        pipe.zadd(key, members)
        pipe.zremrangebyscore(key, "-inf", _below(score - lim.served_ttl_s))
        pipe.zremrangebyrank(key, 0, -(lim.served_cap + 1))
        pipe.expire(key, int(lim.served_ttl_s))
        self._execute(pipe, f"marking {len(members)} posts served to user {user_id}")

    def log_request(self, user_id: int, request_id: str, now: float) -> None:
        """Record a request of a user (kept request_log_ttl_s, newest request_log_cap)."""
        pipe = self._pipeline()
        self._add_capped(
            pipe,
            keys.user_key(user_id, keys.REQUESTS),
            request_id,
            _seconds(now),
            self.limits.request_log_cap,
            keep_after=_seconds(now) - self.limits.request_log_ttl_s,
            ttl=self.limits.request_log_ttl_s,
        )
        self._execute(pipe, f"logging request {request_id!r} of user {user_id}")

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def _newest(pipe, key: str, newest: float, oldest: float, count: int, withscores=False):
        """Queue: up to ``count`` members scored in [oldest, newest], newest first."""
        pipe.zrange(key, newest, oldest, desc=True, byscore=True, offset=0, num=count,
                    withscores=withscores)  # fmt: skip

    def histories(self, user_ids: Sequence[int], now: float, seq_len: int) -> list[UserHistories]:
        """Each user's ranking and retrieval histories at ``now``: the newest ``seq_len``
        engagements of the last history_window_s, oldest first (one round trip)."""
        self.limits.check_seq_len(seq_len)
        newest, oldest = _seconds(now), _seconds(now) - self.limits.history_window_s
        pipe = self._pipeline()
        for user in user_ids:
            for kind in (keys.SEQUENCE, keys.POSITIVE):
                self._newest(pipe, keys.user_key(user, kind), newest, oldest, seq_len)
        replies = self._execute(pipe, f"reading the histories of {len(user_ids)} users")

        def history(members: list[bytes]) -> History:
            return History.from_records(decode(members[::-1]))  # newest first -> oldest first

        return [
            UserHistories(ranking=history(replies[2 * i]), retrieval=history(replies[2 * i + 1]))
            for i in range(len(user_ids))
        ]

    def follows(self, user_ids: Sequence[int]) -> list[np.ndarray]:
        """Each user's followed author ids [F] int64, most recently followed first."""
        pipe = self._pipeline()
        for user in user_ids:
            pipe.zrange(keys.user_key(user, keys.FOLLOWS), 0, -1, desc=True)
        replies = self._execute(pipe, f"reading the follows of {len(user_ids)} users")
        return [_ids(reply) for reply in replies]

    def served(self, user_ids: Sequence[int], now: float) -> list[np.ndarray]:
        """Each user's post ids [N] int64 served within served_ttl_s of ``now``, newest first."""
        newest, oldest = _seconds(now), _seconds(now) - self.limits.served_ttl_s
        pipe = self._pipeline()
        for user in user_ids:
            key = keys.user_key(user, keys.SERVED)
            self._newest(pipe, key, newest, oldest, self.limits.served_cap)
        replies = self._execute(pipe, f"reading the served posts of {len(user_ids)} users")
        return [_ids(reply) for reply in replies]

    def recent_requests(self, user_ids: Sequence[int], now: float) -> list[list[str]]:
        """Each user's request ids within request_log_ttl_s of ``now``, newest first."""
        newest, oldest = _seconds(now), _seconds(now) - self.limits.request_log_ttl_s
        pipe = self._pipeline()
        for user in user_ids:
            key = keys.user_key(user, keys.REQUESTS)
            self._newest(pipe, key, newest, oldest, self.limits.request_log_cap)
        replies = self._execute(pipe, f"reading the requests of {len(user_ids)} users")
        return [[m.decode() for m in reply] for reply in replies]

    def author_posts(self, author_ids: Sequence[int], now: float, per_author_cap: int):
        """Each author's newest ``per_author_cap`` posts of the last author_posts_retention_s
        before ``now``: a list of [(post_id, created_at)], newest first (one round trip)."""
        newest = _seconds(now)
        oldest = newest - self.limits.author_posts_retention_s
        pipe = self._pipeline()
        for author in author_ids:
            key = keys.author_posts_key(author)
            self._newest(pipe, key, newest, oldest, per_author_cap, withscores=True)
        replies = self._execute(pipe, f"reading the posts of {len(author_ids)} authors")
        return [[(int(m), score) for m, score in reply] for reply in replies]

    def in_network(
        self, user_ids: Sequence[int], per_author_cap: int, total_cap: int, now: float
    ) -> list[InNetworkPosts]:
        """Each user's in-network candidates: the newest ``per_author_cap`` posts of every
        followed author (within author_posts_retention_s of ``now``), the newest ``total_cap``
        of them, newest first. Two round trips for the whole batch: follows, then posts (each
        author read once however many users of the batch follow it)."""
        if per_author_cap < 1 or total_cap < 1:
            raise ValueError(
                f"per_author_cap and total_cap must be >= 1, got {per_author_cap}, {total_cap}"
            )
        follows = self.follows(user_ids)
        authors = sorted({int(a) for f in follows for a in f})
        posts = (
            dict(zip(authors, self.author_posts(authors, now, per_author_cap))) if authors else {}
        )
        return [self._newest_of(followed, posts, total_cap) for followed in follows]

    @staticmethod
    def _newest_of(followed: np.ndarray, posts: dict, total_cap: int) -> InNetworkPosts:
        rows = [(created, post, int(a)) for a in followed for post, created in posts[int(a)]]
        rows.sort(reverse=True)  # newest first; equal times: the larger post id first
        rows = rows[:total_cap]
        return InNetworkPosts(
            post_ids=np.array([r[1] for r in rows], np.int64),
            author_ids=np.array([r[2] for r in rows], np.int64),
            created_at=np.array([r[0] for r in rows], np.float64),
        )
