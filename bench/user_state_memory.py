"""Measure the memory of user state and the time of its batch reads on a local redis-server.

    python -m bench.user_state_memory [--users 1000] [--listpack-entries N] [--out FILE]

Starts its own redis-server (``server.RedisServer``), fills ``--users`` users to the default
caps (UserStateLimits: full histories, follows, served posts, request log) and 2,000 authors to
author_posts_cap, and prints JSON: the command and the machine (CPUs, load average), ``MEMORY
USAGE <key> SAMPLES 0`` per key kind (mean bytes of a key, and per member), the ``used_memory``
the fill added, and the wall time of pipelined batch reads. ``--listpack-entries`` sets
zset-max-listpack-entries (Redis's default: 128), the size up to which a sorted set is stored
compactly; ``--out`` also writes the JSON to a file. The reads include what the ``user_state``
serving step reads per batch (``UserStateStore.state``: both histories at the demo artifact's
history_seq_len, served posts, in-network posts) beside the same reads made separately.
docs/user-state.md, "Reads and memory", gives the numbers measured.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from phoenix.user_state import keys
from phoenix.user_state.client import connect
from phoenix.user_state.events import Engagement, Follow, Post
from phoenix.user_state.limits import UserStateLimits
from phoenix.user_state.served import RECORD
from phoenix.user_state.server import RedisServer
from phoenix.user_state.store import UserStateStore

NOW = 1_700_000_000.0
FOLLOWS_PER_USER = 200  # a typical account; the cap (5,000) is measured apart
AUTHORS = 2_000
STEP_SEQ_LEN = 127  # artifacts/demo's history_seq_len: what the served step reads


def _fill(store: UserStateStore, users: int, rng: np.random.Generator) -> None:
    lim = store.limits
    for author in range(1, AUTHORS + 1):
        created = NOW - rng.uniform(0, lim.author_posts_retention_s / 2, lim.author_posts_cap)
        ids = rng.integers(10**11, 10**12, lim.author_posts_cap)
        store.apply(Post(int(p), author, float(t)) for p, t in zip(ids, created))
    for user in range(users):
        times = NOW - rng.uniform(0, lim.history_window_s / 2, lim.history_cap)
        negative = rng.random(lim.history_cap) < 0.1
        store.apply(
            Engagement.of(user, int(rng.integers(10**11, 10**12)), int(rng.integers(1, AUTHORS)),
                          float(t), ["not_interested"] if neg else ["favorite", "dwell"],
                          surface=int(rng.integers(0, 5)), dwell_seconds=float(rng.uniform(0, 60)))
            for t, neg in zip(times, negative)
        )  # fmt: skip
        followed = rng.choice(AUTHORS, FOLLOWS_PER_USER, replace=False) + 1
        store.apply(Follow(user, int(a), NOW - 1000) for a in followed)
        store.mark_served(user, rng.integers(10**11, 10**12, 1_000), NOW - 10)
        for r in range(lim.request_log_cap):
            store.log_request(user, f"{user:x}-{r:04x}-{rng.integers(2**48):012x}", NOW - r)


def _members(client, key: str) -> int:
    """Members of a sorted set; records of the served posts' string."""
    if key.endswith(keys.SERVED):
        return client.strlen(key) // RECORD.itemsize
    return client.zcard(key)


def _usage(client, keys_: list[str]) -> dict:
    sizes = [client.memory_usage(k, samples=0) for k in keys_]
    members = [_members(client, k) for k in keys_]
    return {
        "keys": len(keys_),
        "members_per_key": float(np.mean(members)),
        "bytes_per_key": float(np.mean(sizes)),
        "bytes_per_member": float(np.sum(sizes) / max(np.sum(members), 1)),
        "encoding": client.object("encoding", keys_[0]).decode(),
    }


def _timed(call, repeat: int = 20) -> float:
    call()
    started = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - started) / repeat * 1000


def measure(users: int, listpack_entries: int | None) -> dict:
    extra = (
        () if listpack_entries is None else ("--zset-max-listpack-entries", str(listpack_entries))
    )
    with RedisServer(extra_args=extra) as server:
        client = connect(server.url)
        store = UserStateStore(client, UserStateLimits())
        base = client.info("memory")["used_memory"]
        _fill(store, users, np.random.default_rng(0))
        used = client.info("memory")["used_memory"] - base
        sample = range(min(users, 200))
        listpack = client.config_get("zset-max-listpack-entries")["zset-max-listpack-entries"]
        assert listpack is not None  # a parameter every redis-server 7+ has
        report = {
            "redis_version": client.info("server")["redis_version"],
            "zset_max_listpack_entries": int(listpack),
            "users": users,
            "authors": AUTHORS,
            "used_memory_bytes_total": used,
            "per_key_kind": {
                kind: _usage(client, [keys.user_key(u, kind) for u in sample])
                for kind in keys.USER_KEY_KINDS
            }
            | {"author posts": _usage(client, [keys.author_posts_key(a) for a in range(1, 201)])},
        }
        batch = list(range(min(users, 64)))
        report["read_ms"] = {
            f"histories of {len(batch)} users (seq_len 128)": _timed(
                lambda: store.histories(batch, NOW, 128)
            ),
            "histories of 1 user (seq_len 128)": _timed(lambda: store.histories([0], NOW, 128)),
            "in_network of 1 user (200 follows, 2/author, 200 total)": _timed(
                lambda: store.in_network([0], 2, 200, NOW)
            ),
            f"served of {len(batch)} users": _timed(lambda: store.served(batch, NOW)),
        }
        lim = store.limits
        for users_ in (1, 8):
            step = list(range(min(users, users_)))
            report["read_ms"] |= {
                f"state of {len(step)} users (the step's read: 2 round trips)": _timed(
                    lambda step=step: store.state(step, NOW, STEP_SEQ_LEN)
                ),
                f"histories, served, in_network of {len(step)} users apart (4 round trips)": (
                    _timed(
                        lambda step=step: (
                            store.histories(step, NOW, STEP_SEQ_LEN),
                            store.served(step, NOW),
                            store.in_network(
                                step, lim.in_network_per_author, lim.in_network_total, NOW
                            ),
                        )
                    )
                ),
            }
        client.close()
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1_000)
    parser.add_argument("--listpack-entries", type=int, default=None)
    parser.add_argument("--out", default=None, help="also write the JSON report to this file")
    args = parser.parse_args(argv)
    command = " ".join(
        ["python -m bench.user_state_memory", *(sys.argv[1:] if argv is None else argv)]
    )
    machine = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start"
    report = {"command": command, "machine": machine}
    text = json.dumps(report | measure(args.users, args.listpack_entries), indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as file:
            file.write(text + "\n")


if __name__ == "__main__":
    main()
