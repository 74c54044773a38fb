"""The posts served to a user: one packed, append-only Redis string per user.

Every recommend by user id reads the whole of it (the retriever excludes those posts), and a
user of the Zipf-drawn load holds the full ``served_cap`` (4,096) within the TTL. Kept as a
sorted set of decimal ids, that read returned 4,096 members for Redis to write, hiredis to
turn into objects and numpy to parse: 0.36 ms per user of the user_state step's wall time,
against about 0.05 ms for one string read into numpy (measured on this machine's 2 cores,
docs/user-state.md). Nothing ever asks for part of it by score, which is what a sorted set
would be for.

Layout: records of ``RECORD`` (served time in ms, post id; little-endian int64 each), in the
order written. A write appends one batch of records, keeps the newest ``cap`` records and
renews the key's TTL, atomically (one script on the key's node: ``APPEND_CAPPED``); a read
keeps the records served within the TTL, newest first. The TTL on read is exact per post;
the key's expiry only frees the memory of a user no longer served. A write that repeats the
last one (a retried pipeline: the same posts at the same time) appends nothing, so writing
twice changes nothing; a post served twice otherwise (two requests of one user at once) is two
records: readers treat the ids as a set.
"""

from __future__ import annotations

import numpy as np

from phoenix.user_state.history import time_ms

RECORD = np.dtype([("served_at_ms", "<i8"), ("post_id", "<i8")])

# KEYS[1]: the user's served key; ARGV: cap (records), ttl (s), the packed records to append.
APPEND_CAPPED = """
local key = KEYS[1]
local most = tonumber(ARGV[1]) * 16
local size = redis.call('STRLEN', key)
local n = string.len(ARGV[3])
if size < n or redis.call('GETRANGE', key, size - n, -1) ~= ARGV[3] then
  size = redis.call('APPEND', key, ARGV[3])
end
if size > most then
  redis.call('SET', key, redis.call('GETRANGE', key, size - most, -1))
end
redis.call('EXPIRE', key, tonumber(ARGV[2]))
return math.min(size, most) / 16
"""


def pack(post_ids, now: float) -> bytes:
    """Records of ``post_ids`` served at ``now`` (Unix seconds)."""
    ids = np.asarray(list(post_ids) if not isinstance(post_ids, np.ndarray) else post_ids)
    records = np.empty(len(ids), RECORD)
    records["served_at_ms"] = time_ms(now)
    records["post_id"] = ids
    return records.tobytes()


def queue_append(pipe, key: str, records: bytes, cap: int, ttl_s: float) -> None:
    """Queue on ``pipe`` the atomic append of packed ``records`` to ``key``."""
    # execute_command: the cluster pipeline's eval() is a stub, but EVAL itself routes by key
    pipe.execute_command("EVAL", APPEND_CAPPED, 1, key, int(cap), max(1, int(ttl_s)), records)


def served_since(data: bytes | None, now: float, ttl_s: float) -> np.ndarray:
    """Post ids [N] int64 of the records in ``data`` served within ``ttl_s`` before ``now``
    (none after it), newest first (equal times: the later written first)."""
    if not data:
        return np.zeros(0, np.int64)
    if len(data) % RECORD.itemsize:
        raise ValueError(
            f"a served-posts value of {len(data)} bytes is not {RECORD.itemsize}-byte records: "
            "not written by this store"
        )
    records = np.frombuffer(data, RECORD)[::-1]  # the later written first
    newest, oldest = time_ms(now), time_ms(now - ttl_s)
    at = records["served_at_ms"]
    records = records[(at >= oldest) & (at <= newest)]
    at = records["served_at_ms"]
    if len(at) > 1 and (at[1:] > at[:-1]).any():  # written out of time order (writers' clocks)
        records = records[np.argsort(-at, kind="stable")]  # [N] newest first
    return records["post_id"].astype(np.int64)
