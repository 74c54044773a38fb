"""One engagement as a sorted-set member, and a user's history as the ranker's input arrays.

A member packs the whole engagement into 36 bytes (little-endian, no padding): post id, author
id (int64), action bits (uint32), product surface (int32), dwell seconds (float32) and the time
in milliseconds (int64). The same event always packs to the same bytes, so adding it to the
sorted set again changes nothing: applying an event is idempotent. Distinct events at the same
post and time stay distinct members.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from phoenix.schema.contracts import RANKER, USER_HISTORY_NAMES
from phoenix.user_state.actions import action_flags
from phoenix.user_state.events import Engagement

MEMBER = np.dtype(
    [
        ("post_id", "<i8"),
        ("author_id", "<i8"),
        ("actions", "<u4"),
        ("surface", "<i4"),
        ("dwell_seconds", "<f4"),
        ("ts_ms", "<i8"),
    ]
)
# The ranker inputs a History fills, in this order (their dtypes come from the contract too).
HISTORY_INPUTS = USER_HISTORY_NAMES


def time_ms(ts: float) -> int:
    return int(round(ts * 1000))


def encode(event: Engagement) -> bytes:
    """The sorted-set member of ``event``."""
    record = np.array(
        [
            (
                event.post_id,
                event.author_id,
                event.actions,
                event.surface,
                event.dwell_seconds,
                time_ms(event.ts),
            )
        ],
        MEMBER,
    )
    return record.tobytes()


def decode(members: Sequence[bytes]) -> np.ndarray:
    """Members -> a structured array [L] of MEMBER."""
    if not members:
        return np.zeros(0, MEMBER)
    data = b"".join(members)
    if len(data) != len(members) * MEMBER.itemsize:
        raise ValueError(
            f"a history member is not {MEMBER.itemsize} bytes: not written by this store"
        )
    return np.frombuffer(data, MEMBER)


@dataclass(frozen=True)
class History:
    """One user's history, oldest first: the ragged ranker / user-tower inputs of one row."""

    post_ids: np.ndarray  # [L] int64
    author_ids: np.ndarray  # [L] int64
    actions: np.ndarray  # [L, 19] float32 flags
    product_surface: np.ndarray  # [L] int32
    dwell_seconds: np.ndarray  # [L] float32
    times: np.ndarray  # [L] float64 Unix seconds (not a model input)

    def __len__(self) -> int:
        return len(self.post_ids)

    @classmethod
    def from_records(cls, records: np.ndarray) -> History:
        """A history from MEMBER records ordered oldest first."""
        dtypes = {name: RANKER.input(name).dtype for name in HISTORY_INPUTS}
        return cls(
            post_ids=records["post_id"].astype(dtypes["history_post_ids"]),
            author_ids=records["author_id"].astype(dtypes["history_author_ids"]),
            actions=action_flags(records["actions"]).astype(dtypes["history_actions"]),
            product_surface=records["surface"].astype(dtypes["history_product_surface"]),
            dwell_seconds=records["dwell_seconds"].astype(dtypes["history_dwell_seconds"]),
            times=records["ts_ms"].astype(np.float64) / 1000.0,
        )

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
