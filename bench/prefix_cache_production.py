"""The prefix cache benchmark's production part (bench/bench_prefix_cache.py runs it): X's
production ranker at nano (``phoenix.production.NANO``: 4 layers, 2 key/value heads of 128,
emb 512, bfloat16; random parameters of X's shapes, ``init_params``, seed 0) at history
1,022 x 64 candidates, ranking with ``ProductionRanker.rank_ids`` as its service does.

Timed in alternating rounds, 1 and 8 users a call: the cache off, misses (every user new to
the cache) and hits (the same users' next page: other candidates), each call's outputs
fetched to the host. Then the memory a cached user holds: the entry's arrays against the
formula (``production_prefix.entry_bytes_of``), and what holding more users costs: the
growth of the live device buffers per user.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Optional

import jax

from phoenix.engine.prefix_cache import MIB, PrefixCache
from phoenix.engine.production_prefix import entry_bytes, entry_bytes_of
from phoenix.engine.production_ranking import ProductionRanker
from phoenix.production import NANO, RankingInputs, init_params
from phoenix.production.examples import example_inputs

BATCHES = (1, 8)
HELD_USERS = 16  # users cached for the memory measurement
BUDGET_MIB = 1024  # every user of a round stays held (4 MiB each at nano in bfloat16)


class Sessions:
    """Users of full histories (1,022 posts) and pages of 64 other candidates, seeded."""

    def __init__(self, seed: int = 0):
        self.next_seed = seed

    def users(self, count: int) -> RankingInputs:
        self.next_seed += 1
        return example_inputs(NANO, count, seed=self.next_seed)

    def page(self, users: RankingInputs) -> RankingInputs:
        """The same users' next page: other candidates."""
        self.next_seed += 1
        other = example_inputs(NANO, len(users.user.hashes), seed=self.next_seed)
        return users._replace(candidates=other.candidates)


def timed(rank: Callable[[RankingInputs], object], inputs: RankingInputs) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one call, its outputs on the host."""
    started, cpu = time.perf_counter(), time.process_time()
    jax.device_get(rank(inputs))
    return time.perf_counter() - started, time.process_time() - cpu


def point(users: int, times: dict, cpu: dict, book: dict, candidates: int) -> dict:
    """The figures of one batch size from each mode's calls."""
    median = {mode: statistics.median(values) for mode, values in times.items()}
    cpu_median = {mode: statistics.median(values) for mode, values in cpu.items()}
    per_s = {mode: users / seconds for mode, seconds in median.items()}
    bookkeeping = {mode: statistics.median(values) for mode, values in book.items()}
    return {
        "users_per_call": users,
        "call_ms": {mode: round(1e3 * s, 3) for mode, s in median.items()},
        "users_per_s": {mode: round(v, 2) for mode, v in per_s.items()},
        "candidates_per_s": {mode: round(v * candidates, 1) for mode, v in per_s.items()},
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


def throughput(off: ProductionRanker, on: ProductionRanker, rounds: int, calls: int) -> dict:
    """Hits against misses against the cache off, per batch size."""
    family, cache = on.cached, on.prefix_cache
    assert family is not None and cache is not None
    sessions = Sessions()
    points = {}
    for users in BATCHES:
        count = calls if users == 1 else max(2, calls // 3)
        times: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}
        cpu: dict[str, list[float]] = {"off": [], "miss": [], "hit": []}
        book: dict[str, list[float]] = {"miss": [], "hit": []}

        def record(mode: str, ranker: ProductionRanker, inputs, times=times, cpu=cpu) -> None:
            wall, spent = timed(ranker.rank_ids, inputs)
            times[mode].append(wall)
            cpu[mode].append(spent)

        warm = sessions.users(users)
        for ranker in (off, on):  # programs compiled before timing
            ranker.rank_ids(warm)
        on.rank_ids(sessions.page(warm))  # the candidates' program on a hit
        for round_ in range(rounds * count):
            # one call of each mode on the same users, in turn: new users (misses), their
            # next page (hits), the cache off first every other time, so that the
            # machine's drift meets every mode alike
            people = sessions.users(users)
            first, second = sessions.page(people), sessions.page(people)
            if round_ % 2 == 0:
                record("off", off, first)
            before, spent = cache.stats(), family.bookkeeping_s
            record("miss", on, first)
            book["miss"].append(family.bookkeeping_s - spent)
            spent = family.bookkeeping_s
            record("hit", on, second)
            book["hit"].append(family.bookkeeping_s - spent)
            after = cache.stats()
            assert (after.misses - before.misses, after.hits - before.hits) == (users, users)
            if round_ % 2 == 1:
                record("off", off, first)
        points[f"{users}x{NANO.candidate_seq_len}"] = figures = point(
            users, times, cpu, book, NANO.candidate_seq_len
        )
        print(
            f"   production nano, {users} user(s) x {NANO.candidate_seq_len}: off "
            f"{figures['call_ms']['off']:.1f} ms, miss {figures['call_ms']['miss']:.1f} ms, "
            f"hit {figures['call_ms']['hit']:.1f} ms a call: hits {figures['hit_over_miss']}x "
            f"misses; bookkeeping {100 * figures['bookkeeping_share_of_miss']:.2f}% of a miss",
            flush=True,
        )
    return points


def live_bytes() -> int:
    return sum(int(a.nbytes) for a in jax.live_arrays())


def device_bytes_in_use() -> Optional[int]:
    """The device allocator's bytes in use (GPUs), else None (CPUs keep no such count)."""
    stats = jax.devices()[0].memory_stats()
    return None if not stats or "bytes_in_use" not in stats else int(stats["bytes_in_use"])


def memory(params: dict, users: int = HELD_USERS) -> dict:
    """What a cached user holds: the entry against its formula, and the growth of the live
    device buffers (JAX's arrays; and the device allocator's bytes in use, on a GPU) while a
    fresh ranker caches ``users`` more users, after 8 (the programs compiled)."""
    store = PrefixCache(BUDGET_MIB * MIB, ttl_s=3600)
    ranker = ProductionRanker(NANO, params, prefix_cache=store, miss_buckets=(8,))
    sessions = Sessions(seed=10_000)
    # Each call waited for: on a GPU the allocator still counts a running call's buffers.
    jax.block_until_ready(ranker.rank_ids(sessions.users(8)))  # compiled, the allocator warm
    live, in_use = live_bytes(), device_bytes_in_use()
    for _ in range(users // 8):
        jax.block_until_ready(ranker.rank_ids(sessions.users(8)))
    held = store.stats()
    assert held.entries == 8 + users, held
    entry = store.peek(store.keys()[-1])
    assert entry is not None
    formula = entry_bytes_of(NANO)
    assert entry_bytes(entry) == formula and held.bytes == (8 + users) * formula
    in_use_after = device_bytes_in_use()
    float32 = dataclasses.replace(NANO, compute_dtype="float32")
    return {
        "formula": "2 x layers x P x kv heads x key size x dtype bytes + P (the key flags)",
        "bytes_per_user": formula,
        "mib_per_user": round(formula / MIB, 4),
        "users_per_gib": int(2**30 // formula),
        "float32_bytes_per_user": entry_bytes_of(float32),
        "measured_entry_bytes": entry_bytes(entry),
        "users_measured": users,
        "store_bytes": held.bytes,
        "live_device_bytes_per_user": round((live_bytes() - live) / users),
        "device_in_use_bytes_per_user": None
        if in_use is None or in_use_after is None
        else round((in_use_after - in_use) / users),
    }


def production_part(rounds: int, calls: int) -> dict:
    params = init_params(NANO, seed=0, table_rows=NANO.hashes.num_rows)
    off = ProductionRanker(NANO, params)
    store = PrefixCache(BUDGET_MIB * MIB, ttl_s=3600)
    on = ProductionRanker(NANO, params, prefix_cache=store, miss_buckets=BATCHES)
    points = throughput(off, on, rounds, calls)
    del off, on, store  # their entries freed before the memory part counts
    c = NANO
    return {
        "config": {
            "model": "X's production ranker (xrex), nano",
            "emb_size": c.emb_size,
            "num_layers": c.num_layers,
            "num_q_heads": c.num_q_heads,
            "num_kv_heads": c.num_kv_heads,
            "key_size": c.key_size,
            "history_seq_len": c.history_seq_len,
            "prefix_len": c.prefix_len,
            "candidates": c.candidate_seq_len,
            "dtype": c.compute_dtype,
            "weights": "random (phoenix.production.init_params, X's shapes, seed 0)",
            "device": str(jax.devices()[0].device_kind),
        },
        "points": points,
        "memory": memory(params),
    }
