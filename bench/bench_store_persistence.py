"""What the embedded user-state store's persistence costs: the store `phoenix-serve` starts
(``phoenix.user_state.embedded``) under each ``appendfsync`` policy, beside the throwaway store
without persistence (``--ephemeral-store``), side by side in one run.

    python -m bench.bench_store_persistence [--rounds 3] [--out FILE]

Each round measures every store in turn (a fresh folder under --work each time), so a busy
machine weighs on all of them alike:

- ``events_per_s``: engagement events through ``phoenix-events apply``'s code
  (``lines.apply_lines``, in this process) in its default batches of 1,000 (one pipeline each);
- ``events_per_s_batch_1``: the same, one event a round trip (``--batch-size 1``, or a client
  that writes each event as it comes);
- ``served_write_ms``: what recommend's last stage writes per request (``record_served``: a
  feed of 50 posts marked served and a request log entry), one client, one write at a time:
  p50 and p99 in ms;
- ``restart_s``, ``aof_bytes``: the time a store takes to load its file and answer again after
  a clean stop, and the file's size, after the round's writes.

Beside them, ``disk_fsync_ms``: the p50 and p99 of fdatasync() of a 4 KiB append in the work
folder, what one sync of the policy "always" costs at least. docs/user-state.md, "The store
serve starts", gives the figures and this command.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from harness.machine import machine
from harness.results import add_work_and_out, shown_path, write_results
from phoenix.user_state import UserStateStore, connect
from phoenix.user_state.embedded import FSYNC_POLICIES, EmbeddedStore
from phoenix.user_state.events import EventLimits
from phoenix.user_state.lines import apply_lines
from phoenix.user_state.request_log import RequestRecord
from phoenix.user_state.server import RedisServer, redis_binary

STORES = ("throwaway", *FSYNC_POLICIES)  # throwaway: no persistence (--ephemeral-store)
NOW = time.time()
FEED, CANDIDATES, HISTORY, ACTIONS = 50, 100, 127, 19
OUT = Path("bench/results/store-persistence.json")


def event_lines(count: int, seed: int) -> bytes:
    """``count`` engagement events as phoenix-events reads them: 200 users, a second apart."""
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(count):
        lines.append(json.dumps({
            "type": "engagement", "user_id": int(rng.integers(1, 201)),
            "post_id": int(rng.integers(1, 2**40)), "author_id": int(rng.integers(1, 5000)),
            "ts": NOW - count + i, "actions": ["favorite", "dwell"], "surface": 0,
            "dwell_seconds": 3.5,
        }))  # fmt: skip
    return ("\n".join(lines) + "\n").encode()


def served_record(user: int, request_id: int, rng: np.random.Generator) -> RequestRecord:
    """A request log entry of the size a by-id recommend writes (history, candidates, feed)."""
    posts = rng.integers(1, 2**40, CANDIDATES)
    authors = rng.integers(1, 5000, CANDIDATES)
    return RequestRecord(
        request_id=request_id, user_id=user, ts=NOW, own_history=False, num_actions=ACTIONS,
        history_post_ids=rng.integers(1, 2**40, HISTORY),
        history_author_ids=rng.integers(1, 5000, HISTORY),
        history_actions=np.full(HISTORY, 3, np.uint32),
        history_product_surface=np.zeros(HISTORY, np.int32),
        history_dwell_seconds=np.ones(HISTORY, np.float32), candidate_post_ids=posts,
        candidate_author_ids=authors, candidate_retrieval_scores=np.ones(CANDIDATES, np.float32),
        ranked_post_ids=posts[:FEED], ranked_author_ids=authors[:FEED],
        scores=np.ones(FEED, np.float32), retrieval_scores=np.ones(FEED, np.float32),
        action_probs=np.full((FEED, ACTIONS), 0.5, np.float32),
        in_network=np.zeros(FEED, np.int8),
    )  # fmt: skip


@contextmanager
def started(kind: str, folder: Path) -> Iterator[str]:
    """The URL of a store of ``kind`` on ``folder``, stopped after the block."""
    if kind == "throwaway":
        folder.mkdir(parents=True, exist_ok=True)
        with RedisServer(work_dir=folder) as server:
            yield server.url
        return
    with EmbeddedStore(folder, appendfsync=kind) as store:
        yield store.url


def percentiles(values: list[float]) -> dict:
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
    }


def measure_store(kind: str, folder: Path, lines: bytes, lines_1: bytes, writes: int) -> dict:
    shutil.rmtree(folder, ignore_errors=True)  # a fresh store: the file holds this round alone
    limits = EventLimits(max_surface=15, max_dwell_seconds=1e30, served="bench")
    result: dict = {}
    with started(kind, folder) as url:
        store = UserStateStore(connect(url))
        for key, data, batch in (
            ("events_per_s", lines, 1000),
            ("events_per_s_batch_1", lines_1, 1),
        ):
            began = time.perf_counter()
            counts = apply_lines(store, io.BytesIO(data), "bench", limits=limits, batch_size=batch)
            assert counts.sent == data.count(b"\n") and not counts.refused, counts
            result[key] = round(counts.sent / (time.perf_counter() - began), 1)
        rng = np.random.default_rng(1)
        latencies = []
        for i in range(writes):
            record = served_record(1 + i % 200, i + 1, rng)
            began = time.perf_counter()
            store.record_served([(record.user_id, record.ranked_post_ids, str(i + 1))], NOW,
                                [record])  # fmt: skip
            latencies.append((time.perf_counter() - began) * 1000)
        result["served_write_ms"] = percentiles(latencies)
        keys = store.client.dbsize()
    if kind != "throwaway":
        aof = folder / "appendonlydir"
        result["aof_bytes"] = sum(f.stat().st_size for f in aof.iterdir())
        began = time.perf_counter()
        with started(kind, folder) as url:
            result["restart_s"] = round(time.perf_counter() - began, 3)
            assert connect(url).dbsize() == keys, "the restarted store lost keys"
    return result


def redis_version() -> str:
    done = subprocess.run(
        [redis_binary("redis-server"), "--version"], capture_output=True, text=True
    )
    return done.stdout.split(" v=")[-1].split()[0] if " v=" in done.stdout else done.stdout.strip()


def disk_fsync_ms(folder: Path, count: int = 200) -> dict:
    path = folder / "fsync-probe"
    times = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(count):
            os.write(fd, b"x" * 4096)
            began = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return percentiles(times)


def filesystem(folder: Path) -> str:
    """The type of the filesystem holding ``folder`` (/proc/mounts' longest prefix)."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fs_type, *_ = line.split()
        if str(folder.resolve()).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fs_type
    return kind


def summarize(rounds: list[dict]) -> dict:
    """Medians over the rounds, and each store's ratio to the throwaway one."""
    summary: dict = {}
    for kind in STORES:
        runs = [r[kind] for r in rounds]
        summary[kind] = {
            "events_per_s": statistics.median(r["events_per_s"] for r in runs),
            "events_per_s_batch_1": statistics.median(r["events_per_s_batch_1"] for r in runs),
            "served_write_ms_p50": statistics.median(r["served_write_ms"]["p50"] for r in runs),
            "served_write_ms_p99": statistics.median(r["served_write_ms"]["p99"] for r in runs),
        }
    base = summary["throwaway"]
    for kind in STORES:
        row = summary[kind]
        row["ratio_events_per_s"] = round(row["events_per_s"] / base["events_per_s"], 3)
        row["ratio_events_per_s_batch_1"] = round(
            row["events_per_s_batch_1"] / base["events_per_s_batch_1"], 3
        )
        row["ratio_served_write_ms_p50"] = round(
            row["served_write_ms_p50"] / base["served_write_ms_p50"], 3
        )
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_store_persistence", description=__doc__.split("\n\n")[0]
    )
    add_work_and_out(parser, Path("build/bench-store"), OUT)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=20_000, help="events a round, in batches")
    parser.add_argument("--events-batch-1", type=int, default=2_000, help="events one at a time")
    parser.add_argument("--writes", type=int, default=1_000, help="served writes a round")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    lines, lines_1 = event_lines(args.events, 0), event_lines(args.events_batch_1, 1)
    results: dict = {
        "command": "python -m bench.bench_store_persistence " + " ".join(argv or sys.argv[1:]),
        "machine": machine(),
        "redis_server": redis_version(),
        "filesystem": filesystem(args.work),
        "disk_fsync_ms": disk_fsync_ms(args.work),
        "rounds": [],
    }
    for round_ in range(args.rounds):
        measured = {}
        for kind in STORES:
            folder = args.work / f"round-{round_}-{kind}"
            measured[kind] = measure_store(kind, folder, lines, lines_1, args.writes)
            print(f"round {round_ + 1} {kind}: {json.dumps(measured[kind])}", flush=True)
        results["rounds"].append(measured)
    results["summary"] = summarize(results["rounds"])
    results["machine_after"] = {"load_avg": machine()["load_avg"]}
    write_results(args.out, results)
    print(json.dumps(results["summary"], indent=1))
    print(f"written: {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
