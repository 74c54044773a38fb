"""The parts of bench_user_state that speak to the user-state store: the world's users loaded
into it and the requests for them, the freshness probes under Locust's by-id traffic (an
engagement until a feed's logged history holds it, a followed author's post until it is in the
follower's feed) and Redis killed under load."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np

from harness.loadgen import LoadRun, alternating_callers, percentiles_ms
from harness.locust_runs import finish_locust, locust_totals, start_locust
from phoenix.checkpoint import load_config, load_corpus
from phoenix.client.client import connect, infer
from phoenix.user_state import Engagement, Follow, Post, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.request_log import read_request_log
from phoenix.user_state.server import RedisServer
from phoenix.world.popularity import ZipfUsers, user_stream
from phoenix.world.users import WorldUsers, load_users

TOP_K = 50
PROBE_USER_BASE = 10**12  # probe users and authors: ids no world has
PROBE_POST_BASE = 10**15
PROBE_LIMIT_S = 15.0


# ----------------------------------------------------------------------------------------
# The world's users in the store, and the requests for them
# ----------------------------------------------------------------------------------------


def load_world(store: UserStateStore, world_dir: Path, population: int) -> tuple[WorldUsers, dict]:
    world = WorldUsers.from_artifacts(world_dir)
    loaded = load_users(store, world, world.population(population))
    print(loaded.summary("the store"), flush=True)
    return world, {
        "users": loaded.users,
        "seconds": round(loaded.seconds, 1),
        "engagements": loaded.applied.engagements,
    }


def by_id(user: int) -> dict[str, np.ndarray]:
    return {"user_id": np.array([[user]], np.int64), "top_k": np.array([[TOP_K]], np.int32)}


def with_history(store: UserStateStore, users, seq_len: int) -> list[dict[str, np.ndarray]]:
    """Each user's request carrying the ranking history the store holds for it (what the
    user_state step would read)."""
    states = store.histories([int(u) for u in users], time.time(), seq_len)
    return [
        {**by_id(int(user)), **{name: a[None] for name, a in state.ranking.inputs().items()}}
        for user, state in zip(users, states)
    ]


def drawn_users(store, world: WorldUsers, population: int, count: int, seq_len: int, seed: int):
    """``count`` Zipf draws of the population (repeats kept) among users with a history."""
    users = ZipfUsers(world.user_ids[world.population(population)])
    draws = users.draw(user_stream(seed, 0), 4 * count)
    states = store.histories([int(u) for u in draws], time.time(), seq_len)
    return [int(u) for u, s in zip(draws, states) if len(s.ranking)][:count]


def model_stats(http_url: str) -> dict[str, dict]:
    stats = connect(http_url).get_inference_statistics()
    return {
        m["name"]: {
            "inferences": int(m.get("inference_count", 0)),
            "executions": int(m.get("execution_count", 0)),
            "compute_ns": int(m["inference_stats"]["compute_infer"]["ns"]),
            "queue_ns": int(m["inference_stats"]["queue"]["ns"]),
        }
        for m in stats["model_stats"]
    }


# ----------------------------------------------------------------------------------------
# 2. Freshness under Locust's by-id traffic
# ----------------------------------------------------------------------------------------


def history_of(redis_client, after_ms: int, request_id: int) -> np.ndarray | None:
    """The ranking history the request ``request_id`` was served with, from the request log
    (entries after ``after_ms``), or None when it is not there."""
    for _, record in read_request_log(redis_client, after=f"{after_ms - 1}-0"):
        if record.request_id == request_id:
            return record.history_post_ids
    return None


def seconds_until(reflected, started: float) -> float | None:
    """Send by-id requests back to back until ``reflected(answer)``; seconds from ``started``
    to that answer, or None after PROBE_LIMIT_S."""
    while time.monotonic() - started < PROBE_LIMIT_S:
        if reflected():
            return time.monotonic() - started
    return None


def engagement_probe(
    client, store, redis_client, user: int, post: int, author: int
) -> float | None:
    written_ms = int(time.time() * 1000)
    started = time.monotonic()
    store.apply([Engagement.of(user, post, author, time.time(), ["favorite"])])

    def reflected() -> bool:
        answer = infer(client, "http", "recommend", by_id(user))
        history = history_of(redis_client, written_ms, int(answer["request_id"][0, 0]))
        return history is not None and post in history.tolist()

    return seconds_until(reflected, started)


def new_post_probe(client, store, follower: int, author: int, post: int) -> float | None:
    started = time.monotonic()
    store.apply([Post(post, author, time.time())])

    def reflected() -> bool:
        answer = infer(client, "http", "recommend", by_id(follower))
        return post in answer["ranked_post_ids"][0].tolist()

    return seconds_until(reflected, started)


def wait_for_load(http_url: str, requests: int, limit_s: float) -> bool:
    """Until `recommend` has answered ``requests`` more (Locust has started sending)."""
    start = model_stats(http_url)["recommend"]["inferences"]
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if model_stats(http_url)["recommend"]["inferences"] - start >= requests:
            return True
        time.sleep(0.5)
    return False


def summary_s(values: list) -> dict:
    found = [v for v in values if v is not None]
    return {
        "probes": len(values),
        "reflected": len(found),
        "median_s": round(float(np.median(found)), 3) if found else None,
        "max_s": round(max(found), 3) if found else None,
        "all_s": [None if v is None else round(v, 3) for v in values],
    }


def freshness(args, server, store, redis_url: str, artifacts: Path, work: Path) -> dict:
    client = connect(server.http_url)
    redis_client = connect_store(redis_url)
    corpus = load_corpus(artifacts, load_config(artifacts))
    author = PROBE_USER_BASE + 999_999
    followers = [PROBE_USER_BASE + 500 + i for i in range(args.probes)]
    store.apply([Follow(f, author, time.time() - 3600) for f in followers])
    urls = {"http": server.http_url, "grpc": server.grpc_url}
    extra = [
        "--tags",
        "recommend_by_id",
        "--by-id-world",
        str(args.world.resolve()),
        "--by-id-users",
        str(args.population),
        "--stop-timeout",
        "5",
    ]
    prefix = work / "locust"
    locust = start_locust(
        urls, prefix, users=args.locust_users, artifacts=artifacts, run_time="10m", extra=extra
    )
    try:
        loaded = wait_for_load(server.http_url, 20, 120)
        engaged, posted = [], []
        rng = np.random.default_rng(args.seed)
        for i in range(args.probes):
            row = int(rng.integers(len(corpus.post_ids)))
            post, post_author = int(corpus.post_ids[row]), int(corpus.author_ids[row])
            user = PROBE_USER_BASE + i  # a fresh user: its history is the probe's engagements
            engaged.append(engagement_probe(client, store, redis_client, user, post, post_author))
            posted.append(new_post_probe(client, store, followers[i], author, PROBE_POST_BASE + i))
            print(f"  probe {i + 1}: engagement {engaged[-1]}, new post {posted[-1]}", flush=True)
            time.sleep(
                args.probe_gap_s
            )  # the probes spread over the load, not bunched at its start
    finally:
        finish_locust(locust)
    totals = locust_totals(prefix)
    return {
        "locust_users": args.locust_users,
        "probe_gap_s": args.probe_gap_s,
        "locust_started_sending": loaded,
        "locust_requests": totals.requests,
        "locust_failures": totals.failures,
        "engagement_in_history": summary_s(engaged),
        "followed_authors_post_in_feed": summary_s(posted),
    }


# ----------------------------------------------------------------------------------------
# 3. Redis killed under load
# ----------------------------------------------------------------------------------------


def kill_redis(redis: RedisServer) -> None:
    assert redis.process is not None, "redis-server was not started"
    os.kill(redis.process.pid, signal.SIGKILL)
    redis.process.wait()
    redis.stop()  # its folder; the process is gone


def during(outcomes, start: float, end: float) -> list:
    return [o for o in outcomes if start <= o.started < end]


def kill_under_load(args, server, redis: RedisServer, store, users: list[int], seq_len: int):
    port = redis.port
    (history_request,) = with_history(store, users[:1], seq_len)
    runs = {
        "by_id": LoadRun(
            alternating_callers(
                server.http_url,
                server.grpc_url,
                "recommend",
                by_id(users[0]),
                outputs=["request_id"],
            ),
            workers=2,
            duration_s=1e6,
        ),
        "with_history": LoadRun(
            alternating_callers(
                server.http_url,
                server.grpc_url,
                "recommend",
                history_request,
                outputs=["request_id"],
            ),
            workers=2,
            duration_s=1e6,
        ),
    }
    for run in runs.values():
        run.start()
    time.sleep(args.phase_s)
    killed = time.monotonic()
    kill_redis(redis)
    time.sleep(args.phase_s)
    restarting = time.monotonic()
    restarted = RedisServer(port=port).start()
    up = time.monotonic()
    time.sleep(args.phase_s)
    for run in runs.values():
        run.stop()
    by_id_out, history_out = (runs[k].snapshot() for k in ("by_id", "with_history"))
    down_by_id = during(by_id_out, killed, restarting)
    failed = [o for o in down_by_id if not o.ok]
    naming = [o for o in failed if f":{port}" in o.error and "user state store" in o.error]
    first_ok = min((o.ended for o in by_id_out if o.ok and o.started >= restarting), default=None)
    after_first_ok = [o for o in by_id_out if first_ok is not None and o.started > first_ok]
    result = {
        "phase_s": args.phase_s,
        "redis_restart_s": round(up - restarting, 3),
        "with_history_while_down": {
            "requests": len(during(history_out, killed, up)),
            "failed": sum(not o.ok for o in during(history_out, killed, up)),
        },
        "with_history_whole_run": {
            "requests": len(history_out),
            "failed": sum(not o.ok for o in history_out),
        },
        "by_id_while_down": {
            "requests": len(down_by_id),
            "failed": len(failed),
            "failed_naming_the_store": len(naming),
            "failure_latency": percentiles_ms([o.ended - o.started for o in failed]),
            "example_error": failed[0].error if failed else None,
        },
        "by_id_before_kill": {
            "requests": len(during(by_id_out, 0, killed)),
            "failed": sum(not o.ok for o in during(by_id_out, 0, killed)),
        },
        "by_id_recovery": {
            "first_success_after_restart_began_s": (
                None if first_ok is None else round(first_ok - restarting, 3)
            ),
            "first_success_after_store_answered_s": (
                None if first_ok is None else round(first_ok - up, 3)
            ),
            "requests_after_first_success": len(after_first_ok),
            "failed_after_first_success": sum(not o.ok for o in after_first_ok),
        },
    }
    return result, restarted
