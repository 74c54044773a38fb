"""One engagement as a sorted-set member, and a user's history as the ranker's input arrays.

A member packs the whole engagement into 36 bytes (little-endian, no padding): post id, author
id (int64), action bits (uint32), product surface (int32), dwell seconds (float32) and the time
in milliseconds (int64); an engagement that carries the production ranker's context (timezone,
hour of day, the post's creation time) packs into 46: the same, then the creation time in
seconds (int64), the timezone and the hour (uint8 each). One without them packs as before, so
events applied before the longer form existed, and applied again now, are the same members.
The same event always packs to the same bytes, so adding it to the sorted set again changes
nothing: applying an event is idempotent. Distinct events at the same post and time stay
distinct members.

A history's semantic IDs belong to its posts: the store fills them from a look-up by post id
(the corpus store's, ``UserStateStore(semantic_ids=...)``) as it reads; zeros without one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from phoenix.feed_features import HISTORY_NAMES, SID_NUM_LEVELS, local_hour
from phoenix.schema.contracts import RANKER, USER_HISTORY_NAMES
from phoenix.user_state.actions import action_flags
from phoenix.user_state.events import Engagement

# An engagement without the production ranker's context (36 bytes)
MEMBER_V1 = np.dtype(
    [
        ("post_id", "<i8"),
        ("author_id", "<i8"),
        ("actions", "<u4"),
        ("surface", "<i4"),
        ("dwell_seconds", "<f4"),
        ("ts_ms", "<i8"),
    ]
)
# ... and with it (46 bytes): what ``decode`` gives for either
MEMBER = np.dtype(
    MEMBER_V1.descr + [("post_created_s", "<i8"), ("timezone", "u1"), ("hour_of_day", "u1")]
)
# The ranker inputs a History fills, in this order (their dtypes come from the contract too).
HISTORY_INPUTS = USER_HISTORY_NAMES


def time_ms(ts: float) -> int:
    return int(round(ts * 1000))


def encode(event: Engagement) -> bytes:
    """The sorted-set member of ``event``: 36 bytes without the production context, else 46."""
    row = (
        event.post_id,
        event.author_id,
        event.actions,
        event.surface,
        event.dwell_seconds,
        time_ms(event.ts),
    )
    if not any(event.context):
        return np.array([row], MEMBER_V1).tobytes()
    context = (int(event.post_created_at), event.timezone, event.hour_of_day)
    return np.array([row + context], MEMBER).tobytes()


def decode(members: Sequence[bytes]) -> np.ndarray:
    """Members of either form -> a structured array [L] of MEMBER (the short form's context
    all 0)."""
    if not members:
        return np.zeros(0, MEMBER)
    data = b"".join(members)
    if len(data) == len(members) * MEMBER.itemsize:  # every member of the long form
        return np.frombuffer(data, MEMBER)
    records = np.zeros(len(members), MEMBER)
    if len(data) == len(members) * MEMBER_V1.itemsize:  # every one short
        short = np.frombuffer(data, MEMBER_V1)
        for name in MEMBER_V1.names or ():
            records[name] = short[name]
        return records
    sizes = np.array([len(m) for m in members])
    if not np.isin(sizes, (MEMBER_V1.itemsize, MEMBER.itemsize)).all():
        raise ValueError(
            f"a history member is not {MEMBER_V1.itemsize} or {MEMBER.itemsize} bytes: not "
            "written by this store"
        )
    for dtype in (MEMBER_V1, MEMBER):
        rows = np.flatnonzero(sizes == dtype.itemsize)
        part = np.frombuffer(b"".join(members[int(i)] for i in rows), dtype)
        for name in dtype.names or ():
            records[name][rows] = part[name]
    return records


@dataclass(frozen=True)
class History:
    """One user's history, oldest first: the ragged ranker / user-tower inputs of one row."""

    post_ids: np.ndarray  # [L] int64
    author_ids: np.ndarray  # [L] int64
    actions: np.ndarray  # [L, 19] float32 flags
    product_surface: np.ndarray  # [L] int32
    dwell_seconds: np.ndarray  # [L] float32
    times: np.ndarray  # [L] float64 Unix seconds (not a model input of the original family)
    # what X's production ranker reads beside them (phoenix.feed_features), 0 where unknown
    creation_time: np.ndarray  # [L] int64 the post's, Unix seconds
    timezone: np.ndarray  # [L] int32 the viewer's timezone
    hour_given: np.ndarray  # [L] int32 local hour + 1 as the event gave it (0: not given)
    semantic_ids: np.ndarray  # [L, SID levels] int32 the post's (filled by the store's look-up)

    def __len__(self) -> int:
        return len(self.post_ids)

    @property
    def hour_of_day(self) -> np.ndarray:
        """[L] int32 local hour + 1: as given, else from the time and timezone (computed when
        asked: the original family's reads never pay for it)."""
        derived = local_hour(self.times, self.timezone)
        return np.where(self.hour_given > 0, self.hour_given, derived).astype(np.int32)

    @classmethod
    def from_records(cls, records: np.ndarray) -> History:
        """A history from MEMBER records ordered oldest first (no semantic IDs yet)."""
        dtypes = {name: RANKER.input(name).dtype for name in HISTORY_INPUTS}
        return cls(
            post_ids=records["post_id"].astype(dtypes["history_post_ids"]),
            author_ids=records["author_id"].astype(dtypes["history_author_ids"]),
            actions=action_flags(records["actions"]).astype(dtypes["history_actions"]),
            product_surface=records["surface"].astype(dtypes["history_product_surface"]),
            dwell_seconds=records["dwell_seconds"].astype(dtypes["history_dwell_seconds"]),
            times=records["ts_ms"].astype(np.float64) / 1000.0,
            creation_time=records["post_created_s"].astype(np.int64),
            timezone=records["timezone"].astype(np.int32),
            hour_given=records["hour_of_day"].astype(np.int32),
            semantic_ids=np.zeros((len(records), SID_NUM_LEVELS), np.int32),
        )

    def with_semantic_ids(self, codes: np.ndarray) -> History:
        """This history with its posts' semantic IDs ``codes`` [L, levels]."""
        return dataclasses.replace(self, semantic_ids=np.asarray(codes, np.int32))

    def features(self) -> dict[str, np.ndarray]:
        """{feature name: array}: what X's production ranker reads of each item
        (``feed_features.HISTORY_FEATURES``, in that order)."""
        arrays = (
            self.product_surface,
            np.floor(self.times).astype(np.int64),
            self.creation_time,
            self.timezone,
            self.hour_of_day,
            self.dwell_seconds,
            self.semantic_ids,
        )
        return dict(zip(HISTORY_NAMES, arrays, strict=True))

    def inputs(self) -> dict[str, np.ndarray]:
        """{ranker input name: array}: history_post_ids, ..., history_dwell_seconds."""
        arrays = (
            self.post_ids,
            self.author_ids,
            self.actions,
            self.product_surface,
            self.dwell_seconds,
        )
        return dict(zip(HISTORY_INPUTS, arrays))


@dataclass(frozen=True)
class UserHistories:
    """A user's two histories: ``ranking`` (every engagement) and ``retrieval`` (positive)."""

    ranking: History
    retrieval: History
