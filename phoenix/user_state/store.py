"""``UserStateStore``: a user's engagement history, follows, served posts and request log, and
authors' recent posts, in Redis or Redis Cluster (key layout: ``phoenix.user_state.keys``).

Writes (``apply``, ``mark_served``, ``log_request``, ``record_served``) send a whole batch in
one pipeline: one atomic script call per key touched (``phoenix.user_state.capped``), which
adds, trims to ``UserStateLimits`` and sets the key's TTL; every such write is idempotent (the
same events again, in any order, leave the same state). Two appends are not (what is written
twice is there twice): the served posts (``phoenix.user_state.served``, read as a set) and
the request log stream that ``record_served`` appends to. A profile replaces the user's
older one (``phoenix.user_state.profile``). Reads take a batch of users and cost one round
trip per pipeline (``in_network`` two: follows, then posts; ``state``, everything a recommend
by user id reads, two: histories, served posts, follows and profiles, then the followed
authors' posts); a cluster client's pipeline sends each node its commands together. The
histories' semantic IDs come from the store's ``semantic_ids`` look-up (the corpus store's, by
post id), one call per read. A pipeline is not a transaction: a failure part-way leaves the
keys already written (each consistent), and applying the batch again completes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

import numpy as np
import redis
from redis.exceptions import RedisClusterException

from phoenix.user_state import keys
from phoenix.user_state.actions import is_positive
from phoenix.user_state.capped import CappedSet, WriteBatch
from phoenix.user_state.client import (
    Client,
    Command,
    UserStateError,
    connect,
    describe,
    read_pipelined,
    unavailable_or_failed,
)
from phoenix.user_state.events import Engagement, Event, Follow, Post, Profile, Unfollow
from phoenix.user_state.history import History, UserHistories, decode, encode, time_ms
from phoenix.user_state.limits import UserStateLimits
from phoenix.user_state.profile import unpack
from phoenix.user_state.request_log import RequestRecord, queue_records
from phoenix.user_state.served import pack, queue_append, read_command, served_since


@dataclass(frozen=True)
class InNetworkPosts:
    """One user's in-network candidates, newest first."""

    post_ids: np.ndarray  # [N] int64
    author_ids: np.ndarray  # [N] int64
    created_at: np.ndarray  # [N] float64 Unix seconds

    def __len__(self) -> int:
        return len(self.post_ids)


@dataclass(frozen=True)
class UserState:
    """What a recommend-by-user-id request reads of one user (``UserStateStore.state``)."""

    histories: UserHistories
    served: np.ndarray  # [N] int64 post ids, newest first
    in_network: InNetworkPosts
    # The stored profile, packed; None: the user has none (every feature unknown). Decoded where
    # it is read (``profile.record_arrays`` for a batch), so reads that need none pay nothing.
    profile_record: Optional[bytes] = None


# post ids [N] int64 -> their semantic IDs [N, levels] int32 (zeros where unknown): the corpus
# store's look-up (``phoenix.corpus_store.Snapshot.semantic_ids``)
SemanticIdLookup = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class EngagementLog:
    """One user's engagements of a time range (``UserStateStore.engagement_log``)."""

    records: np.ndarray  # [N] history.MEMBER records, oldest first
    # Every engagement at or after this time is still kept (-inf: none was ever dropped);
    # before it the history cap may have dropped some.
    complete_from: float


@dataclass
class AppliedCounts:
    """The events one `apply` applied, by kind (what phoenix-events reports)."""

    engagements: int = 0
    follows: int = 0
    unfollows: int = 0
    posts: int = 0
    profiles: int = 0

    @property
    def total(self) -> int:
        return self.engagements + self.follows + self.unfollows + self.posts + self.profiles

    def add(self, other: AppliedCounts) -> None:
        """Count ``other``'s events too."""
        for kind in ("engagements", "follows", "unfollows", "posts", "profiles"):
            setattr(self, kind, getattr(self, kind) + getattr(other, kind))


def _seconds(ts: float) -> float:
    """The score of a time: milliseconds, as the history members keep it."""
    return time_ms(ts) / 1000.0


def _ids(members: Sequence[bytes]) -> np.ndarray:
    """Decimal members (followed author ids) -> [N] int64. Parsed by numpy in one call: a
    Python int() per member took 0.37 ms for 4,096 ids, this 0.10 ms (measured on this
    machine's 2 cores)."""
    if not members:
        return np.zeros(0, np.int64)
    joined = b" ".join(members)
    try:  # numpy stops at what is not a number (warning, or raising where warnings are errors)
        ids = np.fromstring(joined, dtype=np.int64, sep=" ")
    except (ValueError, DeprecationWarning):
        ids = None
    # a member holding a space would parse to two ids and could balance a bad one
    if ids is None or len(ids) != len(members) or joined.count(b" ") != len(members) - 1:
        raise ValueError(
            f"a member of {len(members)} is not a decimal id: not written by this store"
        )
    return ids


class UserStateStore:
    """User state in Redis; ``client`` from ``phoenix.user_state.client.connect``.
    ``semantic_ids``: the look-up that gives the histories' posts their semantic IDs (the
    corpus store's; None: every history's are zeros)."""

    def __init__(
        self,
        client: Client,
        limits: UserStateLimits = UserStateLimits(),
        *,
        name: str | None = None,
        semantic_ids: Optional[SemanticIdLookup] = None,
    ):
        self.client = client
        self.limits = limits
        self.name = name or describe(client)  # every error names it
        self.semantic_ids = semantic_ids
        self.kept = self._kept()

    # -- round trips ---------------------------------------------------------------------

    def _pipeline(self):
        return self.client.pipeline(transaction=False)

    def _execute(self, pipe, what: str) -> list:
        return self._answered(pipe.execute, what)

    def _read(self, commands: list[Command], what: str) -> list:
        """The replies of read-only ``commands``, in one round trip (``read_pipelined``)."""
        return self._answered(lambda: read_pipelined(self.client, commands), what)

    def _answered(self, round_trip: Callable[[], list], what: str) -> list:
        """``round_trip()``'s replies; Redis' errors as the store's, naming it and ``what``."""
        try:
            return round_trip()
        except (redis.RedisError, RedisClusterException) as error:
            raise unavailable_or_failed(self.name, what, error) from error

    def ping(self) -> None:
        """UserStateUnavailable naming the store unless it answers."""
        pipe = self._pipeline()
        pipe.ping()
        self._execute(pipe, "ping")

    # -- writes --------------------------------------------------------------------------

    def _kept(self) -> dict[str, CappedSet]:
        """What each kind of key keeps (UserStateLimits)."""
        lim = self.limits
        history = CappedSet(lim.history_cap, lim.history_window_s, lim.history_window_s)
        return {
            keys.SEQUENCE: history,
            keys.POSITIVE: history,
            keys.FOLLOWS: CappedSet(lim.follows_cap),
            keys.REQUESTS: CappedSet(
                lim.request_log_cap, lim.request_log_ttl_s, lim.request_log_ttl_s
            ),
            keys.AUTHOR_POSTS: CappedSet(
                lim.author_posts_cap, lim.author_posts_retention_s, lim.author_posts_retention_s
            ),
        }

    def apply(self, events: Iterable[Event]) -> AppliedCounts:
        """Apply ``events`` in one pipeline; applying them again, in any order, changes
        nothing (an unfollow applies after the follows before it in ``events``)."""
        batch, counts = WriteBatch(self.kept), AppliedCounts()
        for event in events:
            if isinstance(event, Engagement):
                member, score = encode(event), _seconds(event.ts)
                batch.add(keys.user_key(event.user_id, keys.SEQUENCE), keys.SEQUENCE, score, member)
                if is_positive(event.actions):
                    key = keys.user_key(event.user_id, keys.POSITIVE)
                    batch.add(key, keys.POSITIVE, score, member)
                counts.engagements += 1
            elif isinstance(event, Follow):
                key = keys.user_key(event.user_id, keys.FOLLOWS)
                batch.add(key, keys.FOLLOWS, _seconds(event.ts), event.author_id)
                counts.follows += 1
            elif isinstance(event, Unfollow):
                batch.remove(keys.user_key(event.user_id, keys.FOLLOWS), event.author_id)
                counts.unfollows += 1
            elif isinstance(event, Post):
                key = keys.author_posts_key(event.author_id)
                batch.add(key, keys.AUTHOR_POSTS, _seconds(event.ts), event.post_id)
                counts.posts += 1
            elif isinstance(event, Profile):
                batch.set_profile(keys.user_key(event.user_id, keys.PROFILE), event)
                counts.profiles += 1
            else:
                raise TypeError(f"not a user-state event: {event!r}")
        if counts.total:
            self._execute(batch.queue(self._pipeline()), f"applying {counts.total} events")
        return counts

    def mark_served(self, user_id: int, post_ids: Iterable[int], now: float) -> None:
        """Record posts served to a user at ``now`` (kept served_ttl_s, newest served_cap)."""
        records = pack(post_ids, now)
        if records:
            pipe = self._pipeline()
            self._queue_served_write(pipe, user_id, records)
            self._execute(pipe, f"marking posts served to user {user_id}")

    def _queue_served_write(self, pipe, user_id: int, records: bytes) -> None:
        key = keys.user_key(user_id, keys.SERVED)
        queue_append(pipe, key, records, self.limits.served_cap, self.limits.served_ttl_s)

    def log_request(self, user_id: int, request_id: str, now: float) -> None:
        """Record a request of a user (kept request_log_ttl_s, newest request_log_cap)."""
        batch = WriteBatch(self.kept)
        batch.add(keys.user_key(user_id, keys.REQUESTS), keys.REQUESTS, _seconds(now), request_id)
        self._execute(batch.queue(self._pipeline()), f"logging request {request_id!r}")

    def record_served(
        self,
        served: Sequence[tuple[int, Sequence[int] | np.ndarray, str]],
        now: float,
        log: Sequence[RequestRecord] = (),
    ) -> None:
        """In one pipeline: for each (user id, post ids, request id), the posts marked served
        and the request id logged for the user at ``now``, and the entries of ``log`` appended
        to the request log stream (``request_log``, trimmed in the same round trip)."""
        batch, pipe = WriteBatch(self.kept), self._pipeline()
        for user_id, post_ids, request_id in served:
            records = pack(post_ids, now)
            if records:
                self._queue_served_write(pipe, user_id, records)
            batch.add(keys.user_key(user_id, keys.REQUESTS), keys.REQUESTS, _seconds(now),
                      request_id)  # fmt: skip
        batch.queue(pipe)
        queue_records(pipe, log, now, self.limits)
        if served or log:
            self._execute(pipe, f"recording {len(served)} served requests")

    # -- reads ---------------------------------------------------------------------------

    @staticmethod
    def _newest(key: str, newest: float, oldest: float, count: int) -> Command:
        """Up to ``count`` members scored in [oldest, newest], newest first."""
        return ("ZRANGE", key, newest, oldest, "BYSCORE", "REV", "LIMIT", 0, count)

    def _histories_read(self, user_ids, now: float, seq_len: int) -> list[Command]:
        self.limits.check_seq_len(seq_len)
        newest, oldest = _seconds(now), _seconds(now) - self.limits.history_window_s
        return [
            self._newest(keys.user_key(user, kind), newest, oldest, seq_len)
            for user in user_ids
            for kind in (keys.SEQUENCE, keys.POSITIVE)
        ]

    def _histories_of(self, replies: list) -> list[UserHistories]:
        """The histories of the replies to ``_histories_read`` (two per user), their posts'
        semantic IDs looked up in one call."""
        # newest first -> oldest first
        read = [History.from_records(decode(members[::-1])) for members in replies]
        if self.semantic_ids is not None and read:
            codes = self.semantic_ids(np.concatenate([h.post_ids for h in read]))
            ends = np.cumsum([len(h) for h in read])[:-1]
            read = [h.with_semantic_ids(c) for h, c in zip(read, np.split(codes, ends))]
        return [
            UserHistories(ranking=read[i], retrieval=read[i + 1]) for i in range(0, len(read), 2)
        ]

    @staticmethod
    def _profiles_read(user_ids) -> list[Command]:
        return [("GET", keys.user_key(user, keys.PROFILE)) for user in user_ids]

    def _profiles_of(self, user_ids, replies: list) -> list[Optional[Profile]]:
        try:
            return [unpack(int(user), reply) for user, reply in zip(user_ids, replies)]
        except ValueError as error:
            raise UserStateError(f"user state store {self.name}: {error}") from None

    def profiles(self, user_ids: Sequence[int]) -> list[Optional[Profile]]:
        """Each user's newest profile (None: none was ever set), in one round trip."""
        replies = self._read(
            self._profiles_read(user_ids), f"reading the profiles of {len(user_ids)} users"
        )
        return self._profiles_of(user_ids, replies)

    def _served_read(self, user_ids) -> list[Command]:
        cap = self.limits.served_cap
        return [read_command(keys.user_key(user, keys.SERVED), cap) for user in user_ids]

    def _served_of(self, replies: list, now: float) -> list[np.ndarray]:
        lim = self.limits
        return [served_since(reply, now, lim.served_ttl_s, lim.served_cap) for reply in replies]

    @staticmethod
    def _follows_read(user_ids) -> list[Command]:
        return [("ZRANGE", keys.user_key(user, keys.FOLLOWS), 0, -1, "REV") for user in user_ids]

    def histories(self, user_ids: Sequence[int], now: float, seq_len: int) -> list[UserHistories]:
        """Each user's ranking and retrieval histories at ``now``: the newest ``seq_len``
        engagements of the last history_window_s, oldest first (one round trip)."""
        commands = self._histories_read(user_ids, now, seq_len)
        replies = self._read(commands, f"reading the histories of {len(user_ids)} users")
        return self._histories_of(replies)

    def engagement_log(
        self, user_ids: Sequence[int], since: float, until: float
    ) -> list[EngagementLog]:
        """Each user's kept engagements with a time in [since, until], oldest first, and from
        when on the kept ones are complete (a user at ``history_cap`` has lost older ones).
        One round trip (three commands a user): what a training export reads."""
        pipe = self._pipeline()
        for user in user_ids:
            key = keys.user_key(user, keys.SEQUENCE)
            pipe.zrange(key, _seconds(since), _seconds(until), byscore=True)
            pipe.zcard(key)
            pipe.zrange(key, 0, 0, withscores=True)
        replies = self._execute(pipe, f"reading the engagements of {len(user_ids)} users")
        out = []
        for members, count, oldest in zip(replies[::3], replies[1::3], replies[2::3]):
            at_cap = count >= self.limits.history_cap and oldest
            out.append(EngagementLog(decode(members), oldest[0][1] if at_cap else -np.inf))
        return out

    def follows(self, user_ids: Sequence[int]) -> list[np.ndarray]:
        """Each user's followed author ids [F] int64, most recently followed first."""
        commands = self._follows_read(user_ids)
        replies = self._read(commands, f"reading the follows of {len(user_ids)} users")
        return [_ids(reply) for reply in replies]

    def served(self, user_ids: Sequence[int], now: float) -> list[np.ndarray]:
        """Each user's post ids [N] int64 served within served_ttl_s of ``now``, newest first:
        of the last served_cap records written (``served.read_command``)."""
        commands = self._served_read(user_ids)
        replies = self._read(commands, f"reading the served posts of {len(user_ids)} users")
        return self._served_of(replies, now)

    def recent_requests(self, user_ids: Sequence[int], now: float) -> list[list[str]]:
        """Each user's request ids within request_log_ttl_s of ``now``, newest first."""
        newest, oldest = _seconds(now), _seconds(now) - self.limits.request_log_ttl_s
        cap = self.limits.request_log_cap
        commands = [
            self._newest(keys.user_key(user, keys.REQUESTS), newest, oldest, cap)
            for user in user_ids
        ]
        replies = self._read(commands, f"reading the requests of {len(user_ids)} users")
        return [[m.decode() for m in reply] for reply in replies]

    def author_posts(self, author_ids: Sequence[int], now: float, per_author_cap: int):
        """Each author's newest ``per_author_cap`` posts of the last author_posts_retention_s
        before ``now``: a list of [(post_id, created_at)], newest first (one round trip)."""
        newest = _seconds(now)
        oldest = newest - self.limits.author_posts_retention_s
        # The reply as Redis sends it (RESP3): [[member, score], ...]; redis-py's own
        # zrange(withscores=True) reformatted every score through a callback, a fifth of a
        # batch's read time with 200 follows each (one command per followed author).
        commands = [
            self._newest(keys.author_posts_key(author), newest, oldest, per_author_cap)
            + ("WITHSCORES",)
            for author in author_ids
        ]
        replies = self._read(commands, f"reading the posts of {len(author_ids)} authors")
        return [[(int(m), float(s)) for m, s in reply] for reply in replies]

    def in_network(
        self, user_ids: Sequence[int], per_author_cap: int, total_cap: int, now: float
    ) -> list[InNetworkPosts]:
        """Each user's in-network candidates: the newest ``per_author_cap`` posts of every
        followed author (within author_posts_retention_s of ``now``), the newest ``total_cap``
        of them, newest first. Two round trips for the whole batch: follows, then posts (each
        author read once however many users of the batch follow it)."""
        _check_caps(per_author_cap, total_cap)
        return self._posts_of_followed(self.follows(user_ids), now, per_author_cap, total_cap)

    def state(self, user_ids: Sequence[int], now: float, seq_len: int) -> list[UserState]:
        """Everything a recommend by user id reads of each user at ``now``: both histories
        (as ``histories``), the served posts (as ``served``), the in-network posts (as
        ``in_network``, capped by in_network_per_author and in_network_total) and the profile.

        One round trip reads the histories, served posts, follows and profiles of the whole
        batch; a
        second, only when a user of the batch follows someone, reads the followed authors'
        posts (each author once). The second cannot join the first: which authors to read is
        the first's answer, and an author's posts live in the author's hash slot, which a
        cluster serves from another node than the user's, so no one server-side script can
        read both."""
        lim = self.limits
        commands = [
            *self._histories_read(user_ids, now, seq_len),
            *self._served_read(user_ids),
            *self._follows_read(user_ids),
            *self._profiles_read(user_ids),
        ]
        replies = self._read(commands, f"reading the state of {len(user_ids)} users")
        users = len(user_ids)
        histories = self._histories_of(replies[: 2 * users])
        served = self._served_of(replies[2 * users : 3 * users], now)
        follows = [_ids(reply) for reply in replies[3 * users : 4 * users]]
        profiles = replies[4 * users :]
        in_network = self._posts_of_followed(
            follows, now, lim.in_network_per_author, lim.in_network_total
        )
        rows = zip(histories, served, in_network, profiles, strict=True)
        return [UserState(*row) for row in rows]

    def _posts_of_followed(
        self, follows: list[np.ndarray], now: float, per_author_cap: int, total_cap: int
    ) -> list[InNetworkPosts]:
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


def _check_caps(per_author_cap: int, total_cap: int) -> None:
    if per_author_cap < 1 or total_cap < 1:
        raise ValueError(
            f"per_author_cap and total_cap must be >= 1, got {per_author_cap}, {total_cap}"
        )


def reachability_check(url: str) -> Callable[[], str | None]:
    """The check serve's /ready runs on the store at ``url``: None while it answers a PING, else
    why not, naming the store. Short timeouts: a probe must never hang on a dead store."""
    client = connect(url, lazy=True, connect_timeout_s=0.2, socket_timeout_s=0.5)
    store = UserStateStore(client, name=url)

    def unreachable() -> str | None:
        try:
            store.ping()
        except UserStateError as error:
            return str(error)
        return None

    return unreachable
