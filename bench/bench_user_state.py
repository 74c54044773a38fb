"""recommend by user id, measured against a real tritonserver reading a real redis-server
(docs/user-state.md, "Measured under load"):

1. throughput: perf_analyzer sends `recommend` by `user_id` and then `recommend` carrying the
   same users' histories (read from the store), back to back, twice, on the same server; the
   per-model compute time of each run from Triton's statistics (the user_state step's is the
   Redis read), and the CPU each step's stubs and redis-server spent per request;
2. freshness under Locust's by-id traffic: a user's engagement, written through the event path
   (`UserStateStore.apply`), until a feed's logged history holds it; a followed author's new
   post until it is in the follower's feed;
3. Redis killed under load: requests carrying their history, by-id requests (how fast and how
   they fail), and how soon by-id requests succeed after Redis restarts on the same port.

The by-id users are the first --population users of the trained world of --world (Zipf's law
draws which of them send), loaded into the store once.

    python -m bench.bench_user_state --artifacts artifacts/trained-demo,artifacts/demo
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from bench.serving_measure import Measurement, measure_served, write_input_data
from harness import REPO_ROOT
from harness.loadgen import LoadRun, alternating_callers, percentiles_ms
from harness.locust_runs import finish_locust, locust_totals, start_locust
from harness.process_cpu import cpu_ms_per_request, served_cpu_seconds
from harness.results import shown_path, write_results
from harness.triton import start_triton
from phoenix.checkpoint import load_config, load_corpus
from phoenix.client.client import connect, infer
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import Engagement, Follow, Post, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.request_log import read_request_log
from phoenix.user_state.server import RedisServer
from phoenix.util.command_line import command_parser
from phoenix.world.popularity import ZipfUsers, user_stream
from phoenix.world.users import WorldUsers, load_users

RESULTS = REPO_ROOT / "bench" / "results"
WORK = REPO_ROOT / "build" / "bench-user-state"
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


# ----------------------------------------------------------------------------------------
# 1. Throughput by id vs with history
# ----------------------------------------------------------------------------------------


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


def stats_between(before: dict, after: dict) -> dict[str, dict]:
    """Per model: batches, requests and the compute / queue time per batch of the interval."""
    out = {}
    for name, end in after.items():
        start = before.get(name, {k: 0 for k in end})
        batches = end["executions"] - start["executions"]
        if batches <= 0:
            continue
        out[name] = {
            "batches": batches,
            "requests": end["inferences"] - start["inferences"],
            "compute_ms_per_batch": round(
                (end["compute_ns"] - start["compute_ns"]) / batches / 1e6, 2
            ),
            "queue_ms_per_request": round(
                (end["queue_ns"] - start["queue_ns"])
                / max(1, end["inferences"] - start["inferences"])
                / 1e6,
                2,
            ),
        }
    return out


def runs_by_kind(runs: list[dict]) -> dict[str, list[dict]]:
    return {kind: [r for r in runs if r["kind"] == kind] for kind in ("by_id", "with_history")}


def mean_in_network(store: UserStateStore, users: list[int], seq_len: int) -> float:
    """In-network posts not yet served to the user, per request of ``users`` now (the mean
    over the list): the candidates a by-id request adds before ranking, at a run's start
    (they fall as the run serves them)."""
    states = store.state(users, time.time(), seq_len)
    return float(
        np.mean([np.isin(s.in_network.post_ids, s.served, invert=True).sum() for s in states])
    )


def throughput(args, server, redis_pid: int, store, world, artifacts: Path, work: Path) -> dict:
    seq_len = load_config(artifacts).history_seq_len
    users = drawn_users(store, world, args.population, args.requests, seq_len, args.seed)
    data = {
        "by_id": write_input_data(work / "by_id.json", [by_id(u) for u in users]),
        "with_history": write_input_data(
            work / "history.json", with_history(store, users, seq_len)
        ),
    }
    runs = []
    for round_number in range(args.rounds):
        for kind in ("by_id", "with_history"):
            m = Measurement(kind, "recommend", "grpc", "dynamic", args.concurrency)
            # the ranker's extra candidates in the by-id requests of this run
            in_network = mean_in_network(store, users, seq_len) if kind == "by_id" else 0.0
            before = model_stats(server.http_url)
            cpu_before = served_cpu_seconds(server.process.pid, redis=redis_pid)
            measure_served(m, server.grpc_url, data[kind], args.window, quick=True)
            cpu_after = served_cpu_seconds(server.process.pid, redis=redis_pid)
            steps = stats_between(before, model_stats(server.http_url))
            served = steps.get("recommend", {}).get("requests", 0)
            runs.append(
                {
                    "round": round_number + 1,
                    "kind": kind,
                    "throughput": round(m.throughput, 2),
                    "p50_ms": round(m.p50_ms, 1),
                    "p99_ms": round(m.p99_ms, 1),
                    "unstable": m.unstable,
                    "error": m.error,
                    "steps": steps,
                    "cpu_ms_per_request": cpu_ms_per_request(cpu_before, cpu_after, served),
                    "in_network_candidates_mean": round(in_network, 1),
                }
            )
            cpu = runs[-1]["cpu_ms_per_request"]
            print(
                f"  {kind}: {m.throughput:.1f} req/s, p50 {m.p50_ms:.0f} ms, "
                f"{cpu['total']:.1f} CPU-ms per request (ranker {cpu.get('ranker', 0):.1f}), "
                f"in-network {in_network:.1f}"
                f"{' (unstable)' if m.unstable else ''}{' ' + m.error if m.error else ''}",
                flush=True,
            )
    mean = {
        kind: float(np.mean([r["throughput"] for r in of_kind]))
        for kind, of_kind in runs_by_kind(runs).items()
    }
    return {
        "users": len(users),
        "distinct_users": len(set(users)),
        "concurrency": args.concurrency,
        "runs": runs,
        "mean_req_per_s": {k: round(v, 2) for k, v in mean.items()},
        "by_id_over_with_history": round(mean["by_id"] / max(mean["with_history"], 1e-9), 3),
        "cpu_ms_per_request_mean": {
            kind: round(float(np.mean([r["cpu_ms_per_request"]["total"] for r in of_kind])), 2)
            for kind, of_kind in runs_by_kind(runs).items()
        },
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


# ----------------------------------------------------------------------------------------
# One server per artifact directory
# ----------------------------------------------------------------------------------------


def measure_artifacts(args, artifacts: Path, full: bool) -> dict:
    work = args.work / artifacts.name
    work.mkdir(parents=True, exist_ok=True)
    redis = RedisServer().start()
    try:
        store = UserStateStore(connect_store(redis.url))
        world, loaded = load_world(store, args.world, args.population)
        env = {USER_STATE_URL_ENV: redis.url}
        server = start_triton(
            REPO_ROOT / "model_repository",
            artifacts,
            env=env,
            log_path=work / "tritonserver.log",
            exit_timeout_secs=5,
        )
        try:
            row = {"artifacts": shown_path(artifacts), "loaded": loaded}
            print(f"{shown_path(artifacts)}: throughput by id vs with history", flush=True)
            row["throughput"] = throughput(
                args, server, redis.process.pid, store, world, artifacts, work
            )
            if full:
                print("freshness under Locust", flush=True)
                row["freshness"] = freshness(args, server, store, redis.url, artifacts, work)
                print("Redis killed under load", flush=True)
                seq_len = load_config(artifacts).history_seq_len
                users = drawn_users(store, world, args.population, 1, seq_len, args.seed)
                row["redis_killed"], redis = kill_under_load(
                    args, server, redis, store, users, seq_len
                )
            return row
        finally:
            server.stop()
    finally:
        redis.stop()


def parse_args(argv=None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.bench_user_state",
        "recommend by user id against a real tritonserver and redis-server: throughput by id "
        "vs with history (perf_analyzer), freshness of events under Locust's by-id traffic, "
        "and Redis killed under load. Writes --out (JSON).",
        "Examples:\n"
        "  python -m bench.bench_user_state\n"
        "  python -m bench.bench_user_state --artifacts artifacts/trained-demo --probes 3",
    )
    parser.add_argument(
        "--artifacts",
        default="artifacts/trained-demo,artifacts/demo",
        help="served artifact directories, comma-separated; the first also gets "
        "the freshness and Redis-kill measurements (default: %(default)s)",
    )
    parser.add_argument(
        "--world",
        type=Path,
        default=Path("artifacts/trained-demo"),
        help="trained artifacts whose world's users are loaded (%(default)s)",
    )
    parser.add_argument("--population", type=int, default=1000, help="world users loaded")
    parser.add_argument("--requests", type=int, default=128, help="perf_analyzer's requests")
    parser.add_argument("--concurrency", type=int, default=4, help="perf_analyzer's")
    parser.add_argument("--window", type=int, default=100, help="requests per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="by id / with history pairs")
    parser.add_argument("--probes", type=int, default=5, help="freshness probes of each kind")
    parser.add_argument("--locust-users", type=int, default=4)
    parser.add_argument("--probe-gap-s", type=float, default=3.0, help="seconds between probes")
    parser.add_argument(
        "--phase-s",
        type=float,
        default=5.0,
        help="seconds before the kill, while down, and after the restart",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=WORK)
    parser.add_argument("--out", type=Path, default=RESULTS / "user_state_load.json")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    dirs = [Path(d).resolve() for d in args.artifacts.split(",") if d]
    rows = [measure_artifacts(args, d, full=(i == 0)) for i, d in enumerate(dirs)]
    result = {
        "what": "recommend by user id under load (bench/bench_user_state.py)",
        "command": "python -m bench.bench_user_state "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "world": shown_path(args.world.resolve()),
        "population": args.population,
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs, shared with other work",
        "servers": rows,
    }
    write_results(args.out, result)
    print(json.dumps(result, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
