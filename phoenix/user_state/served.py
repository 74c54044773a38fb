"""The posts served to a user: one packed, append-only Redis string per user.

Every recommend by user id reads its last ``served_cap`` records (the retriever excludes those
posts), and a user of the Zipf-drawn load holds the full ``served_cap`` (4,096) within the TTL.
Kept as a sorted set of decimal ids, that read returned 4,096 members for Redis to write,
hiredis to turn into objects and us to parse: ``UserStateStore.state`` of 2 such users took
1.23 ms (with the ids parsed by numpy), against 0.47 ms as one string read into numpy (measured
on this machine's 2 cores, docs/user-state.md). Nothing ever asks for part of it by score,
which is what a sorted set would be for.

Layout: records of ``RECORD`` (served time in ms, post id; little-endian int64 each), in the
order written. A write appends one batch of records, cuts the value back to the newest ``cap``
records once it holds more than twice that, and renews the key's TTL, atomically (one script
on the key's node: ``APPEND_CAPPED``); a read asks for the last ``cap`` records written only
(GETRANGE: a hot user's value averages 1.5 caps, 96 KB, between cut-backs, and the cut-back
keeps the last written too) and keeps those served within the TTL, newest first. The TTL on
read is exact per post;
the key's expiry only frees the memory of a user no longer served. A write that repeats the
last one (a retried pipeline: the same posts at the same time) appends nothing, so writing
twice changes nothing; a post served twice otherwise (two requests of one user at once) is two
records: readers treat the ids as a set.
"""

from __future__ import annotations

import numpy as np

from phoenix.user_state import keys
from phoenix.user_state.history import time_ms

RECORD = np.dtype([("served_at_ms", "<i8"), ("post_id", "<i8")])
OLD_SERVED = "served"  # the sorted sets' key kind of earlier versions (migrate_sorted_sets)

# KEYS[1]: the user's served key; ARGV: cap (records), ttl (s), the packed records to append.
# Past twice the cap the value is cut back to the newest cap records: cutting at the cap itself
# rewrote the whole value (64 KB at the default cap) with every write of a user at the cap, and
# a script's writes reach replicas and the AOF as their effects, the whole value each time.
APPEND_CAPPED = """
local key = KEYS[1]
local most = tonumber(ARGV[1]) * 16
local size = redis.call('STRLEN', key)
local n = string.len(ARGV[3])
if size < n or redis.call('GETRANGE', key, size - n, -1) ~= ARGV[3] then
  size = redis.call('APPEND', key, ARGV[3])
end
if size > 2 * most then
  redis.call('SET', key, redis.call('GETRANGE', key, size - most, -1))
  size = most
end
redis.call('EXPIRE', key, tonumber(ARGV[2]))
return size / 16
"""


def pack(post_ids, served_at) -> bytes:
    """Records of ``post_ids`` (any iterable) served at ``served_at`` (Unix seconds: one time,
    or one per post), in that order."""
    ids = np.fromiter(post_ids, np.int64)
    records = np.empty(len(ids), RECORD)
    records["served_at_ms"] = np.round(np.asarray(served_at, np.float64) * 1000)  # as time_ms
    records["post_id"] = ids
    return records.tobytes()


def queue_append(pipe, key: str, records: bytes, cap: int, ttl_s: float) -> None:
    """Queue on ``pipe`` the atomic append of packed ``records`` to ``key``."""
    # execute_command: the cluster pipeline's eval() is a stub, but EVAL itself routes by key
    pipe.execute_command("EVAL", APPEND_CAPPED, 1, key, int(cap), max(1, int(ttl_s)), records)


def read_command(key: str, cap: int) -> tuple:
    """The read of the last ``cap`` records written to ``key`` (all of them when it holds
    fewer; b"" when there is no key)."""
    return ("GETRANGE", key, -cap * RECORD.itemsize, -1)


def served_since(data: bytes | None, now: float, ttl_s: float, cap: int) -> np.ndarray:
    """Post ids [N <= cap] int64 of the newest ``cap`` records in ``data`` served within
    ``ttl_s`` before ``now`` (none after it), newest first (equal times: the later written
    first). The store passes the last ``cap`` records written (``read_command``), the records the
    cut-back keeps too: a record written after one timed later (writers' clocks apart) can
    push an older-written one out of that read, and records timed after ``now`` (a reader's
    clock behind a writer's) take places in it: both by milliseconds of skew."""
    if not data:
        return np.zeros(0, np.int64)
    if len(data) % RECORD.itemsize:
        raise ValueError(
            f"a served-posts value of {len(data)} bytes is not {RECORD.itemsize}-byte records: "
            "not written by this store"
        )
    records = np.frombuffer(data, RECORD)  # [N] in the order written
    newest, oldest = time_ms(now), time_ms(now - ttl_s)
    at = records["served_at_ms"]
    if len(at) < 2 or (at[1:] >= at[:-1]).all():  # written in time order: the usual case
        # Those within the TTL are one run, found by binary search: 0.01 ms for a hot user's
        # 4,096 records, where masking every record took 0.045 ms (on this machine).
        first, end = np.searchsorted(at, oldest, "left"), np.searchsorted(at, newest, "right")
        records = records[first:end][::-1]  # [N] the later written first
    else:  # written out of time order (writers' clocks)
        records = records[::-1]
        at = records["served_at_ms"]
        records = records[(at >= oldest) & (at <= newest)]
        records = records[np.argsort(-records["served_at_ms"], kind="stable")]  # newest first
    # The newest cap records, a post served twice being two of them: removing the repeats
    # (an argsort of up to twice the cap ids) cost a hot user 0.17 ms a read, and repeats come
    # only from two requests of one user served at once.
    return records["post_id"][:cap].astype(np.int64)


def migrate_sorted_sets(client, ttl_s: float) -> int:
    """Rewrite every served-posts sorted set of earlier versions (``u:{<user>}:served``:
    decimal post ids scored by served time in seconds) as this module's string, keeping its
    remaining TTL, and delete it; returns the users migrated. Without it, the posts served
    before an upgrade are not excluded for up to ``ttl_s`` after it. Safe to run again: a user
    whose new key exists keeps its records, after the old ones, and the old key is gone."""
    moved = 0
    for key in client.scan_iter(match=f"u:{{*}}:{OLD_SERVED}", _type="zset"):
        pairs = client.zrange(key, 0, -1, withscores=True)  # oldest first
        new_key = key.decode()[: -len(OLD_SERVED)] + keys.SERVED
        if pairs:
            posts, times = zip(*pairs)
            left_ms = client.pttl(key)
            existing = client.get(new_key) or b""
            client.set(new_key, pack(map(int, posts), times) + existing)
            client.pexpire(new_key, left_ms if left_ms > 0 else int(ttl_s * 1000))
        client.delete(key)
        moved += 1
    return moved


def main(argv=None) -> int:
    """``python -m phoenix.user_state.served migrate URL``: ``migrate_sorted_sets`` on the store
    at URL (redis://, redis+cluster://, ...), once, after upgrading from a version that kept
    the served posts as sorted sets."""
    import argparse

    from phoenix.user_state.client import connect
    from phoenix.user_state.limits import UserStateLimits

    parser = argparse.ArgumentParser(
        prog="python -m phoenix.user_state.served",
        description=f"Move the served posts of the old sorted-set keys (u:{{user}}:{OLD_SERVED})"
        f" into the {keys.SERVED} strings, keeping their TTLs.",
    )
    parser.add_argument("action", choices=["migrate"])
    parser.add_argument("url", help="the user-state store's URL, as phoenix-serve --redis takes")
    args = parser.parse_args(argv)
    moved = migrate_sorted_sets(connect(args.url), UserStateLimits().served_ttl_s)
    print(f"{args.url}: the served posts of {moved} users moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
