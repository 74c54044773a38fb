"""Benchmark: the ranker's prefix cache across requests (docs/performance.md, "The prefix
cache").

Run: ``make bench-prefix-cache`` or ``python -m bench.bench_prefix_cache`` (``--help``;
``--quick`` for a short run). Writes ``bench/results/prefix-cache.json`` (``--out``):

1. **engine**: the original ranker's architecture (the published mini shapes: emb 128,
   4 layers, 4 heads of 32, key/value heads 4; generated weights) at history 1,022 and 64
   candidates, in the device's dtype (float32 on a CPU, bfloat16 on a GPU), ranking padded
   request batches as the served ranker does (``DeviceRanker.rank``). Timed in alternating
   rounds, 1 and 8 users a call: the cache off, misses (every user new to the cache) and hits
   (the same users' next page: other candidates). ``hit_over_miss``: hits' over misses'
   throughput at one user a call. The bookkeeping (keys, lookups, stores, the misses' rows
   gathered) over a miss's time.
2. **memory**: the bytes a cached user holds at each geometry (mini and the GPU benchmark's
   large config, history 127 and 1,022, float32 and bfloat16), the measured entry checked
   against its formula.
3. **production**: X's production ranker at nano (bfloat16, random parameters of X's shapes)
   at history 1,022 x 64 candidates, timed the same way (``bench/prefix_cache_production.py``):
   ``production_hit_over_miss``, its bookkeeping, and the bytes a cached user holds, computed
   and measured.
4. **paged**: Locust's paged users (loadtest/paged.py: three pages a few seconds apart per
   user) against a server ranking with the cache and one without, one after the other in this
   run, history 1,022, the ranker alone with the CPU profile's instances (and, with the
   cache, one instance): the cache's hit rate (the server's own metrics), requests/s and each
   page's latency.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.prefix_cache_production import production_part
from harness import REPO_ROOT
from harness.bench_options import prefix_cache_args
from harness.locust_runs import TOTALS_SUFFIX, read_totals
from harness.machine import machine
from harness.results import command_line, shown_path, write_results
from harness.triton import start_triton
from phoenix.artifacts import generate
from phoenix.client.client import ranker_inputs
from phoenix.ops.configs import model_config, write_repository
from phoenix.ops.profiles import CPU, Profile
from phoenix.schema.contracts import RANKER
from phoenix.stub.request_metrics import CACHE_HITS, CACHE_MISSES, METRICS_INTERVAL_ENV
from phoenix.stub.services.common import ServiceSettings, config_parameters
from phoenix.stub.services.ranker import RankerService, request_batch
from phoenix.stub.services.resources import PhoenixResources

PAGED = REPO_ROOT / "loadtest" / "paged.py"
HISTORY = 1022
CANDIDATES = 64
# Transformer shapes (layers, key/value heads, key size) of the geometries the memory table
# lists: the published mini shapes and the GPU benchmark's large config.
GEOMETRIES = {"mini": (4, 4, 32), "large": (8, 4, 64)}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


# ----------------------------------------------------------------------------------------
# Artifacts: the mini shapes at history 1,022
# ----------------------------------------------------------------------------------------


def artifacts_at(work: Path, history: int) -> Path:
    """Generated mini-preset artifacts of ``history`` items (seed 0, 5,000 posts), once."""
    out = work / f"mini-h{history}"
    if not (out / "config.json").is_file():
        print(f"== generating {out} (mini shapes, history {history})", flush=True)
        generate("mini", out, seed=0, corpus_size=5_000, history_seq_len=history)
    return out


# ----------------------------------------------------------------------------------------
# 1. the engine: hits against misses
# ----------------------------------------------------------------------------------------


class Pages:
    """Sessions of one user each: a full history, pages of other candidates."""

    def __init__(self, config, corpus_ids: np.ndarray, authors: np.ndarray, seed: int = 0):
        self.config, self.posts, self.authors = config, corpus_ids, authors
        self.rng = np.random.default_rng(seed)
        self.next_user = 1

    def user(self) -> dict:
        size = self.config.history_seq_len
        picks = self.rng.choice(len(self.posts), size, replace=False)
        user_id, self.next_user = self.next_user, self.next_user + 1
        return {
            "user_id": user_id,
            "history_post_ids": self.posts[picks],
            "history_author_ids": self.authors[picks],
            "history_actions": (self.rng.random((size, self.config.num_actions)) < 0.1).astype(
                np.float32
            ),
            "history_product_surface": self.rng.integers(0, 4, size),
            "history_dwell_seconds": self.rng.exponential(8.0, size).astype(np.float32),
        }

    def page(self, user: dict):
        picks = self.rng.choice(len(self.posts), CANDIDATES, replace=False)
        values = {
            **user,
            "candidate_post_ids": self.posts[picks],
            "candidate_author_ids": self.authors[picks],
        }
        return ranker_inputs(values)


def timed(rank, batch, rows: int) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds: every thread's) of one ranking call. On a
    machine shared with other work the CPU seconds are the steadier measure of the work."""
    started, cpu = time.perf_counter(), time.process_time()
    rank(batch, rows)
    return time.perf_counter() - started, time.process_time() - cpu


def engine_part(artifacts: Path, args) -> dict:
    from phoenix.checkpoint import load_corpus
    from phoenix.schema.request_types import RankerRequest
    from phoenix.schema.requests import parse

    resources = PhoenixResources(artifacts)
    config = resources.config
    corpus = load_corpus(artifacts / "corpus.npz", config)
    weights = RANKER.parameter("score_weights").default
    batch_buckets, candidate_buckets = (1, 8), (CANDIDATES,)
    off = RankerService(
        resources, weights, prefix_cache_mib=0,
        batch_buckets=batch_buckets, candidate_buckets=candidate_buckets,
    ).ranker  # fmt: skip
    budget = 4 * 1024  # MiB: every user of a round stays held
    on = RankerService(
        resources, weights, prefix_cache_mib=budget,
        batch_buckets=batch_buckets, candidate_buckets=candidate_buckets,
    ).ranker  # fmt: skip
    assert on.prefix is not None
    cache = on.prefix.cache
    pages = Pages(config, corpus.post_ids, corpus.author_ids)

    def batch_of(requests, users):
        typed = [parse(RankerRequest, r, config) for r in requests]
        return request_batch(typed, config, users, CANDIDATES)

    points = {}
    for users in (1, 8):
        calls = args.calls if users == 1 else max(2, args.calls // 3)
        times: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}
        cpu: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}

        def record(mode: str, rank, batch, users=users, times=times, cpu=cpu) -> None:
            wall, spent = timed(rank, batch, users)
            times[mode].append(wall)
            cpu[mode].append(spent)

        book: dict[str, list[float]] = {"miss": [], "hit": []}
        warm = [pages.user() for _ in range(users)]
        for ranker in (off, on):  # programs loaded and caches warm before timing
            ranker.rank(batch_of([pages.page(u) for u in warm], users), users)
        for round_ in range(args.rounds * calls):
            # one call of each mode on the same users, in turn: a user new to the cache (a
            # miss), the same user's next page (a hit), the cache off, the cache off first
            # every other time, so that the machine's drift meets every mode alike
            people = [pages.user() for _ in range(users)]
            first = batch_of([pages.page(u) for u in people], users)
            second = batch_of([pages.page(u) for u in people], users)
            if round_ % 2 == 0:
                record("off", off.rank, first)
            spent, before = on.prefix.bookkeeping_s, cache.stats()
            record("miss", on.rank, first)
            book["miss"].append(on.prefix.bookkeeping_s - spent)
            spent = on.prefix.bookkeeping_s
            record("hit", on.rank, second)
            book["hit"].append(on.prefix.bookkeeping_s - spent)
            after = cache.stats()
            assert (after.misses - before.misses, after.hits - before.hits) == (users, users)
            if round_ % 2 == 1:
                record("off", off.rank, first)
        median = {mode: statistics.median(values) for mode, values in times.items()}
        cpu_median = {mode: statistics.median(values) for mode, values in cpu.items()}
        per_s = {mode: users / seconds for mode, seconds in median.items()}
        bookkeeping = {mode: statistics.median(values) for mode, values in book.items()}
        points[f"{users}x{CANDIDATES}"] = {
            "users_per_call": users,
            "call_ms": {mode: round(1e3 * s, 3) for mode, s in median.items()},
            "users_per_s": {mode: round(v, 2) for mode, v in per_s.items()},
            "candidates_per_s": {mode: round(v * CANDIDATES, 1) for mode, v in per_s.items()},
            "hit_over_miss": round(per_s["hit"] / per_s["miss"], 2),
            "hit_over_off": round(per_s["hit"] / per_s["off"], 2),
            "miss_over_off": round(per_s["miss"] / per_s["off"], 3),
            "bookkeeping_ms": {mode: round(1e3 * s, 3) for mode, s in bookkeeping.items()},
            "bookkeeping_share_of_miss": round(bookkeeping["miss"] / median["miss"], 4),
            "bookkeeping_share_of_hit": round(bookkeeping["hit"] / median["hit"], 4),
            "calls": len(times["off"]),
            "cpu_ms_per_call": {mode: round(1e3 * s, 3) for mode, s in cpu_median.items()},
            "cpu_miss_over_hit": round(cpu_median["miss"] / cpu_median["hit"], 2),
            "cpu_miss_over_off": round(cpu_median["miss"] / cpu_median["off"], 3),
            "best_call_ms": {mode: round(1e3 * min(v), 3) for mode, v in times.items()},
        }
        print(
            f"   {users} user(s) x {CANDIDATES}: off {1e3 * median['off']:.1f} ms, miss "
            f"{1e3 * median['miss']:.1f} ms, hit {1e3 * median['hit']:.1f} ms a call: hits "
            f"{per_s['hit'] / per_s['miss']:.1f}x misses; bookkeeping "
            f"{100 * bookkeeping['miss'] / median['miss']:.2f}% of a miss",
            flush=True,
        )
    (key,) = cache.keys()[-1:]
    entry = cache.peek(key)
    return {
        "config": {
            "emb_size": config.emb_size,
            "num_layers": config.num_layers,
            "num_heads": config.num_heads,
            "num_kv_heads": config.num_kv_heads,
            "key_size": config.key_size,
            "history_seq_len": config.history_seq_len,
            "candidates": CANDIDATES,
            "dtype": served_dtype(),
            "weights": "generated (phoenix.artifacts, mini preset, seed 0)",
        },
        "points": points,
        "entry_bytes": entry_bytes_measured(entry),
    }


def served_dtype() -> str:
    """The dtype the served ranker computes in on this device (float32 on a CPU, bfloat16 on a
    GPU), which its cache entries hold."""
    import jax.numpy as jnp

    from phoenix.engine.batching import default_compute_dtype

    return jnp.dtype(default_compute_dtype()).name


def entry_bytes_measured(entry) -> int:
    from phoenix.engine.prefix_ranking import entry_bytes

    return entry_bytes(entry)


# ----------------------------------------------------------------------------------------
# 2. memory per cached user
# ----------------------------------------------------------------------------------------


def entry_bytes_of(layers: int, kv_heads: int, key_size: int, history: int, dtype: str) -> int:
    """Each layer's keys and values of 1 + history tokens, and the context mask."""
    tokens = 1 + history
    return layers * 2 * tokens * kv_heads * key_size * DTYPE_BYTES[dtype] + tokens


def memory_table() -> list[dict]:
    rows = []
    for name, (layers, kv_heads, key_size) in GEOMETRIES.items():
        for history in (127, HISTORY):
            for dtype in DTYPE_BYTES:
                size = entry_bytes_of(layers, kv_heads, key_size, history, dtype)
                rows.append(
                    {
                        "config": name,
                        "history": history,
                        "dtype": dtype,
                        "bytes": size,
                        "mib": round(size / 2**20, 3),
                        "users_per_gib": int(2**30 // size),
                    }
                )
    return rows


# ----------------------------------------------------------------------------------------
# 3. Locust's paged users against the cache on and off
# ----------------------------------------------------------------------------------------


def deployment_with_cache(mib: int) -> Profile:
    """The CPU profile with the ranker's cache at ``mib`` and only the candidate bucket the
    paged users need (fewer programs to compile at history 1,022)."""
    values = {"candidate_buckets": (CANDIDATES,), "prefix_cache_mib": mib}
    return CPU.with_parameters(RANKER.name, values)


def compile_ranker(artifacts: Path, deployment: Profile) -> None:
    """The ranker's programs of ``deployment`` into the store beside ``artifacts``, in this
    process, as phoenix-compile builds the profile's: the server's instances then load them."""
    from google.protobuf.json_format import MessageToDict

    config = MessageToDict(model_config(RANKER, deployment), preserving_proto_field_name=True)
    settings = ServiceSettings.parsed(
        RANKER.name, artifacts, int(config["max_batch_size"]), config_parameters(config)
    )
    RankerService.from_settings(settings).warm_up()


def scrape(url: str, family: str, model: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    total = 0.0
    for labels, value in re.findall(rf"^{family}\{{([^}}]*)\}} (\S+)$", text, re.M):
        if f'model="{model}"' in labels:
            total += float(value)
    return total


def page_rows(prefix: Path) -> dict[str, dict]:
    import csv

    with Path(f"{prefix}_stats.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    return {
        row["Name"]: {
            "requests": int(row["Request Count"]),
            "failures": int(row["Failure Count"]),
            "p50_ms": float(row["50%"]),
            "p95_ms": float(row["95%"]),
            "requests_per_s": round(float(row["Requests/s"]), 2),
        }
        for row in rows
    }


def paged_run(server, artifacts: Path, prefix: Path, args) -> dict:
    url = server.metrics_url
    before = [scrape(url, family, RANKER.name) for family in (CACHE_HITS, CACHE_MISSES)]
    command = [
        sys.executable, "-m", "locust", "-f", str(PAGED), "--headless", "--only-summary",
        "--users", str(args.locust_users), "--spawn-rate", str(spawn_rate(args)),
        "--run-time", f"{args.load_seconds}s", "--host", f"http://{server.http_url}",
        "--artifacts", str(artifacts), "--page-interval", args.page_interval,
        "--csv", str(prefix),
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    subprocess.run(command, cwd=REPO_ROOT, env=env, check=False, capture_output=True)
    after = [scrape(url, family, RANKER.name) for family in (CACHE_HITS, CACHE_MISSES)]
    hits, misses = (a - b for a, b in zip(after, before))
    totals = read_totals(Path(f"{prefix}{TOTALS_SUFFIX}"))
    rows = page_rows(prefix)
    return {
        "requests": totals.requests if totals else rows["Aggregated"]["requests"],
        "failures": totals.failures if totals else rows["Aggregated"]["failures"],
        "requests_per_s": rows["Aggregated"]["requests_per_s"],
        "hits": int(hits),
        "misses": int(misses),
        "hit_rate": round(hits / (hits + misses), 3) if hits + misses else None,
        "pages": {name: row for name, row in rows.items() if name.startswith("page")},
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
    }


def paged_part(artifacts: Path, args) -> dict:
    instances = CPU.models[RANKER.name].instances
    results: dict = {
        "workload": "loadtest/paged.py: per Locust user, a new user of history "
        f"{HISTORY} and three pages of {CANDIDATES} other candidates, {args.page_interval} s "
        "apart (then the next user); the ranker served alone",
        "locust_users": args.locust_users,
        "spawn_rate": spawn_rate(args),
        "seconds_per_setting": args.load_seconds,
        "settings": {},
    }
    # the cache off and on with the CPU profile's instances; on with one instance: a user's
    # pages then always meet the instance that holds their prefix
    settings = [("off", 0, instances), ("on", args.cache_mib, instances)]
    if instances > 1 and not args.skip_one_instance:
        settings.append(("on-1-instance", args.cache_mib, 1))
    for setting, mib, count in settings:
        deployment = deployment_with_cache(mib).with_instances({RANKER.name: count})
        compile_ranker(artifacts, deployment)
        repository = write_repository(args.work / f"model_repository-{setting}", deployment)
        log = args.work / f"tritonserver-{setting}.log"
        print(f"== paged users, cache {setting}: starting tritonserver (log {log})", flush=True)
        server = start_triton(
            repository, artifacts, log_path=log, exit_timeout_secs=5,
            model_control_mode="explicit", load_model=[RANKER.name],
            env={METRICS_INTERVAL_ENV: "0"}, ready_timeout=900,
        )  # fmt: skip
        try:
            run = paged_run(server, artifacts, args.work / f"locust-{setting}", args)
        finally:
            server.stop()
        results["settings"][setting] = {"prefix_cache_mib": mib, "ranker_instances": count, **run}
        print(
            f"   cache {setting}: {run['requests_per_s']} requests/s, {run['failures']} failed, "
            f"hit rate {run['hit_rate']}",
            flush=True,
        )
    on, off = results["settings"]["on"], results["settings"]["off"]
    if off["requests_per_s"]:
        results["throughput_on_over_off"] = round(on["requests_per_s"] / off["requests_per_s"], 2)
    return results


def spawn_rate(args) -> int:
    """Locust users started per second: spread over about 8 s, not all asking at once."""
    return max(1, args.locust_users // 8)


def main(argv=None) -> int:
    args = prefix_cache_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    artifacts = artifacts_at(args.work, HISTORY)
    started = machine()
    print("== engine: hits against misses at history 1,022 x 64 candidates", flush=True)
    engine = engine_part(artifacts, args)
    memory = memory_table()
    dtype = engine["config"]["dtype"]
    mini = next(
        r for r in memory if (r["config"], r["history"], r["dtype"]) == ("mini", HISTORY, dtype)
    )
    assert engine["entry_bytes"] == mini["bytes"], (engine["entry_bytes"], mini["bytes"])
    production = None
    if not args.skip_production:
        print("== production nano: hits against misses at history 1,022 x 64", flush=True)
        production = production_part(args.rounds, args.calls)
    paged = None if args.skip_paged else paged_part(artifacts, args)
    point = engine["points"][f"1x{CANDIDATES}"]
    results = {
        "what": "the ranker's prefix cache: engine throughput on hits and misses, memory per "
        "cached user, the same for the production nano ranker, Locust's paged users with the "
        "cache on and off",
        "command": command_line("bench.bench_prefix_cache", argv),
        "machine": {**started, "load_avg_end": [round(x, 2) for x in os.getloadavg()]},
        "artifacts": shown_path(artifacts),
        "hit_over_miss": point["hit_over_miss"],
        "bookkeeping_share_of_miss": point["bookkeeping_share_of_miss"],
        "production_hit_over_miss": production and production["points"]["1x64"]["hit_over_miss"],
        "production_bookkeeping_share_of_miss": production
        and production["points"]["1x64"]["bookkeeping_share_of_miss"],
        "engine": engine,
        "memory_per_user": memory,
        "production": production,
        "paged": paged,
    }
    write_results(args.out, results)
    print(f"hit_over_miss {point['hit_over_miss']}x; wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
