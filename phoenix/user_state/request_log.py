"""The request log: every served ``recommend`` row, kept complete and bounded in one Redis Stream.

X caches each request's exact model inputs after scoring (a side effect of the request, with a
TTL) so that served traffic can become training data. Here the ``served_log`` step (the last of
``recommend``) appends one entry per user row to the stream ``requests:log``
(``keys.REQUEST_LOG_STREAM``) holding what the models used and what the user was shown:

- the request id (int64, what ``recommend`` returns and ``impressions.request_id`` holds), the
  user id, the time, and whether the request carried its own history;
- the ranking history the ranker read (post, author, action bits, surface, dwell seconds);
- the candidates the retriever returned (post, author, retrieval score);
- the feed returned, in order (post, author, score, retrieval score, action probabilities).

Arrays travel as little-endian bytes (``ARRAYS`` gives each dtype); padding (post id 0) is left
out. The stream is bounded twice in the same round trip as the write: ``XADD MAXLEN`` keeps
the newest ``request_stream_cap`` entries, ``XTRIM MINID`` drops those older than
``request_log_ttl_s`` (``UserStateLimits``); both exact (each entry is removed once, so the
cost is one removal per add at most, and the bound holds to the entry). Entry ids are Redis
times, so a reader pages through the log in time order from the id it stopped at
(``read_request_log``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import cast

import numpy as np
import redis
from redis.exceptions import RedisClusterException

from phoenix.user_state.client import Client, describe, unavailable_or_failed
from phoenix.user_state.keys import REQUEST_LOG_STREAM
from phoenix.user_state.limits import UserStateLimits

# Each array of an entry and its dtype on the wire (little-endian, no header).
ARRAYS = {
    "history_post_ids": "<i8",
    "history_author_ids": "<i8",
    "history_actions": "<u4",  # action bits: bit i = ACTION_NAMES[i]
    "history_product_surface": "<i4",
    "history_dwell_seconds": "<f4",
    "candidate_post_ids": "<i8",
    "candidate_author_ids": "<i8",
    "candidate_retrieval_scores": "<f4",
    "ranked_post_ids": "<i8",  # the feed, in the order shown
    "ranked_author_ids": "<i8",
    "scores": "<f4",
    "retrieval_scores": "<f4",
    "action_probs": "<f4",  # [C', num_actions], flattened row by row
    "in_network": "<i1",  # 1: the post came from the in-network source
}
SCALARS = ("request_id", "user_id", "ts", "own_history", "num_actions")
READ_PAGE = 1_000  # entries per XRANGE: bounded replies however long the log


@dataclass(frozen=True)
class RequestRecord:
    """One served user row: its id, what the models used and what was returned."""

    request_id: int
    user_id: int
    ts: float  # Unix seconds, when the step wrote it
    own_history: bool  # the request carried its history (else it was read by user_id)
    num_actions: int
    history_post_ids: np.ndarray
    history_author_ids: np.ndarray
    history_actions: np.ndarray
    history_product_surface: np.ndarray
    history_dwell_seconds: np.ndarray
    candidate_post_ids: np.ndarray
    candidate_author_ids: np.ndarray
    candidate_retrieval_scores: np.ndarray
    ranked_post_ids: np.ndarray
    ranked_author_ids: np.ndarray
    scores: np.ndarray
    retrieval_scores: np.ndarray
    action_probs: np.ndarray  # [C', num_actions]
    in_network: np.ndarray  # [C'] int8

    def fields(self) -> dict[str, bytes | str]:
        """The stream entry's fields."""
        entry: dict[str, bytes | str] = {
            "request_id": str(int(self.request_id)),
            "user_id": str(int(self.user_id)),
            "ts": repr(float(self.ts)),
            "own_history": "1" if self.own_history else "0",
            "num_actions": str(int(self.num_actions)),
        }
        for name, dtype in ARRAYS.items():
            entry[name] = np.ascontiguousarray(getattr(self, name), dtype).tobytes()
        return entry

    @classmethod
    def from_fields(cls, entry: Mapping[bytes, bytes]) -> RequestRecord:
        """The record of a stream entry (as redis-py returns it: bytes keys and values)."""
        text = {key.decode(): value for key, value in entry.items()}
        missing = [name for name in (*SCALARS, *ARRAYS) if name not in text]
        if missing:
            raise ValueError(f"request log entry without {missing}")
        num_actions = int(text["num_actions"])
        arrays = {name: np.frombuffer(text[name], dtype).copy() for name, dtype in ARRAYS.items()}
        arrays["action_probs"] = arrays["action_probs"].reshape(-1, num_actions)
        return cls(
            request_id=int(text["request_id"]),
            user_id=int(text["user_id"]),
            ts=float(text["ts"]),
            own_history=text["own_history"] == b"1",
            num_actions=num_actions,
            **arrays,
        )

    def __eq__(self, other) -> bool:
        if not isinstance(other, RequestRecord):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)
        )


def queue_records(
    pipe, records: Sequence[RequestRecord], now: float, limits: UserStateLimits
) -> None:
    """Queue on ``pipe`` the entries of ``records`` and the trims that keep the log bounded:
    about ``request_stream_cap`` entries, none much older than ``request_log_ttl_s``."""
    for record in records:
        pipe.xadd(
            REQUEST_LOG_STREAM,
            record.fields(),
            maxlen=limits.request_stream_cap,
            approximate=False,  # exact: O(1) amortized per add, and the bound is exact
        )
    if records:
        oldest_ms = max(0, int((now - limits.request_log_ttl_s) * 1000))
        pipe.xtrim(REQUEST_LOG_STREAM, minid=f"{oldest_ms}-0", approximate=False)


def read_request_log(
    client: Client, after: str = "-", count: int | None = None
) -> Iterator[tuple[str, RequestRecord]]:
    """(entry id, record) of the log's entries after entry id ``after`` ("-": from the oldest
    kept), oldest first, at most ``count``; a reader resumes from the last id it got."""
    start, left = after, count
    while left is None or left > 0:
        page = READ_PAGE if left is None else min(READ_PAGE, left)
        lower = start if start == "-" else f"({start}"  # exclusive after the first page
        try:
            # redis-py types a reply as any form a sync or async client gives; XRANGE's, for
            # a sync client without decode_responses, is a list of (bytes id, bytes fields)
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                client.xrange(REQUEST_LOG_STREAM, min=lower, max="+", count=page),
            )
        except (redis.RedisError, RedisClusterException) as error:
            what = "reading the request log"
            raise unavailable_or_failed(describe(client), what, error) from error
        for entry_id, entry in entries:
            start = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            yield start, RequestRecord.from_fields(entry)
        if left is not None:
            left -= len(entries)
        if len(entries) < page:
            return
