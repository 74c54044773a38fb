"""`recommend`'s host path: the served chain against the same chain in one process, side by
side on the same requests, with the CPU every process spends per request.

    python -m bench.bench_recommend_host            # make bench-recommend-host

One redis-server holds the users of the trained world (`--world`); one tritonserver serves
`--artifacts` reading that store. For two workloads, `recommend` carrying the history the
store holds for the user (`with_history`) and `recommend` by user id (`by_id`: the history read
from Redis), in alternating rounds:

- in process: the recommend chain as the server builds it (its parameters asked from the
  server), recording as the server does (served posts, request log), 1 request a call and
  8 a call (what the dynamic batcher hands the chain at c=16); CPU: this process's and
  redis-server's;
- served: perf_analyzer over gRPC at c=1 and c=16; CPU: tritonserver's, each model's stubs'
  (by model) and redis-server's, per request answered.

The ratios it reports: served c=16 over in process at 8 a call (throughput), and the
served CPU per request over the in-process CPU per request. Written to run unchanged in an
older checkout too (its in-process side is then whatever that checkout's reference runs):

    (cd OLD && PYTHONPATH=. /path/to/.venv/bin/python /path/to/bench/bench_recommend_host.py \
        --out /tmp/old.json)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.serving_measure import Measurement, measure_served, write_input_data
from harness.process_cpu import cpu_ms_per_request, cpu_seconds, served_cpu_seconds
from harness.triton import start_triton
from phoenix.checkpoint import load_config
from phoenix.client.client import connect
from phoenix.client.inprocess import InProcessModels
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.server import RedisServer
from phoenix.world.users import WorldUsers, load_users

REPO_ROOT = Path(__file__).resolve().parents[1]
TOP_K = 100
BATCHED = 8  # requests a call in process: the chain's batches at c=16 (measured: 7-8)
KINDS = ("with_history", "by_id")


def by_id(user: int) -> dict[str, np.ndarray]:
    return {"user_id": np.array([[user]], np.int64), "top_k": np.array([[TOP_K]], np.int32)}


def with_history(store, users: list[int], seq_len: int) -> list[dict[str, np.ndarray]]:
    """Each user's request carrying the ranking history the store holds for it."""
    states = store.histories(users, time.time(), seq_len)
    return [
        {**by_id(user), **{name: a[None] for name, a in state.ranking.inputs().items()}}
        for user, state in zip(users, states)
    ]


def requests_of(store, world: WorldUsers, args, seq_len: int) -> dict[str, list[dict]]:
    """The same users for both workloads: the first users of the world with a history."""
    candidates = [int(u) for u in world.user_ids[world.population(args.population)]]
    states = store.histories(candidates, time.time(), seq_len)
    users = [u for u, s in zip(candidates, states) if len(s.ranking)][: args.users]
    return {"by_id": [by_id(u) for u in users], "with_history": with_history(store, users, seq_len)}


def reference(client, artifacts: Path):
    """The recommend chain in this process, built from the server's config, recording."""
    import inspect

    options: dict[str, Any] = {"batched": True}
    if "record" in inspect.signature(InProcessModels.like_server).parameters:
        options["record"] = True  # (an older checkout's reference records nothing)
    return InProcessModels.like_server(client, "http", artifacts, **options)


def in_process(models, requests: list[dict], per_call: int, seconds: float, redis_pid: int):
    """Requests a second and CPU-ms a request (this process + redis-server), ``per_call``
    requests a call, cycling through ``requests``."""
    me = os.getpid()
    models.run_many("recommend", requests[:per_call])  # warm
    before = {"process": cpu_seconds(me), "redis": cpu_seconds(redis_pid)}
    done, cursor, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds or done < 3 * per_call:
        batch = [requests[(cursor + i) % len(requests)] for i in range(per_call)]
        models.run_many("recommend", batch)
        cursor, done = cursor + per_call, done + per_call
    elapsed = time.perf_counter() - started
    after = {"process": cpu_seconds(me), "redis": cpu_seconds(redis_pid)}
    return {
        "throughput": round(done / elapsed, 1),
        "cpu_ms_per_request": cpu_ms_per_request(before, after, done),
    }


def inferences(client, model: str = "recommend") -> tuple[int, int]:
    """(requests answered, executions) of ``model`` so far."""
    try:
        stats = client.get_inference_statistics(model)
    except Exception:  # an older checkout serves no such model
        return 0, 0
    count = lambda key: sum(int(m.get(key, 0)) for m in stats["model_stats"])  # noqa: E731
    return count("inference_count"), count("execution_count")


def served(server, data: Path, concurrency: int, window: int, redis_pid: int) -> dict:
    """perf_analyzer over gRPC at ``concurrency``; CPU-ms a request of every process."""
    client = connect(server.http_url)
    m = Measurement("recommend", "recommend", "grpc", "dynamic", concurrency)
    count_before, _ = inferences(client)
    chain_before = inferences(client, "recommend_chain")
    cpu_before = served_cpu_seconds(server.process.pid, redis=redis_pid)
    measure_served(m, server.grpc_url, data, window, quick=True)
    cpu_after = served_cpu_seconds(server.process.pid, redis=redis_pid)
    answered = inferences(client)[0] - count_before
    chain = [
        after - before for after, before in zip(inferences(client, "recommend_chain"), chain_before)
    ]
    return {
        "chain_requests_per_batch": round(chain[0] / chain[1], 2) if chain[1] else None,
        "throughput": round(m.throughput, 1),
        "p50_ms": round(m.p50_ms, 2),
        "p99_ms": round(m.p99_ms, 2),
        "error": m.error,
        "requests": answered,
        "cpu_ms_per_request": cpu_ms_per_request(cpu_before, cpu_after, answered),
    }


def measure(args, server, redis_pid: int, requests: dict[str, list[dict]]) -> list[dict]:
    models = reference(connect(server.http_url, "http"), args.artifacts)
    rounds = []
    for round_number in range(1, args.rounds + 1):
        for kind in KINDS:
            data = write_input_data(args.work / f"{kind}.json", requests[kind])
            row: dict[str, Any] = {
                "round": round_number,
                "kind": kind,
                "in_process": {},
                "served": {},
            }
            for per_call in (1, BATCHED):
                row["in_process"][str(per_call)] = in_process(
                    models, requests[kind], per_call, args.seconds, redis_pid
                )
            for concurrency in (1, 16):
                row["served"][str(concurrency)] = served(
                    server, data, concurrency, args.window, redis_pid
                )
            row["ratios"] = ratios(row)
            print(summary_line(row), flush=True)
            rounds.append(row)
    return rounds


def ratios(row: dict) -> dict[str, float]:
    """Served c=16 over in process at 8 a call: throughput, and CPU per request (total)."""
    inside, outside = row["in_process"][str(BATCHED)], row["served"]["16"]
    return {
        "throughput_served_over_in_process": round(
            outside["throughput"] / max(inside["throughput"], 1e-9), 3
        ),
        "cpu_served_over_in_process": round(
            outside["cpu_ms_per_request"]["total"]
            / max(inside["cpu_ms_per_request"]["total"], 1e-9),
            3,
        ),
    }


def summary_line(row: dict) -> str:
    inside, outside = row["in_process"], row["served"]
    return (
        f"  round {row['round']} {row['kind']:<12} in process {inside['1']['throughput']:6.1f} / "
        f"{inside[str(BATCHED)]['throughput']:6.1f} req/s (1 / {BATCHED} a call, "
        f"{inside[str(BATCHED)]['cpu_ms_per_request']['total']:.2f} CPU-ms); served c=1 "
        f"{outside['1']['throughput']:6.1f}, c=16 {outside['16']['throughput']:6.1f} req/s "
        f"({outside['16']['cpu_ms_per_request']['total']:.2f} CPU-ms): "
        f"{row['ratios']['throughput_served_over_in_process']:.0%} of in process, CPU "
        f"{row['ratios']['cpu_served_over_in_process']:.2f}x"
    )


def medians(rounds: list[dict]) -> dict:
    """Per workload, the median over rounds of each throughput and ratio."""
    out = {}
    for kind in KINDS:
        mine = [r for r in rounds if r["kind"] == kind]
        out[kind] = {
            "in_process_req_per_s": {
                k: float(np.median([r["in_process"][k]["throughput"] for r in mine]))
                for k in ("1", str(BATCHED))
            },
            "served_req_per_s": {
                k: float(np.median([r["served"][k]["throughput"] for r in mine]))
                for k in ("1", "16")
            },
            **{
                name: float(np.median([r["ratios"][name] for r in mine]))
                for name in mine[0]["ratios"]
            },
        }
    return out


def plot(result: dict, path: Path) -> None:
    """Throughput side by side, and the served CPU a request by process, per workload."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rates, cpu) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = list(KINDS)
    x = np.arange(len(names))
    med = result["median"]
    bars = {
        "in process, 1 a call": [med[k]["in_process_req_per_s"]["1"] for k in names],
        f"in process, {BATCHED} a call": [
            med[k]["in_process_req_per_s"][str(BATCHED)] for k in names
        ],
        "served, c=1": [med[k]["served_req_per_s"]["1"] for k in names],
        "served, c=16": [med[k]["served_req_per_s"]["16"] for k in names],
    }
    for i, (label, heights) in enumerate(bars.items()):
        rates.bar(x + (i - 1.5) * 0.2, heights, 0.2, label=label)
    rates.set_xticks(x, names)
    rates.set_ylabel("requests / s")
    rates.set_title("recommend: served against the same chain in process")
    rates.legend(fontsize=8)
    last = {r["kind"]: r for r in result["rounds"]}
    spent = {k: last[k]["served"]["16"]["cpu_ms_per_request"] for k in names}
    processes = sorted(  # the processes that spent any CPU (idle models' stubs left out)
        {p for row in spent.values() for p, ms in row.items() if ms >= 0.02} - {"total"}
    )
    bottom = np.zeros(len(names))
    colors = plt.get_cmap("tab10")
    for i, process in enumerate(processes):
        values = np.array([spent[k].get(process, 0.0) for k in names])
        cpu.bar(x + 0.2, values, 0.35, bottom=bottom, color=colors(i), label=f"served: {process}")
        bottom += values
    inside = [last[k]["in_process"][str(BATCHED)]["cpu_ms_per_request"]["total"] for k in names]
    cpu.bar(x - 0.2, inside, 0.35, color="black", alpha=0.6, label="in process + redis-server")
    cpu.set_xticks(x, names)
    cpu.set_ylabel("CPU ms / request (c=16; in process 8 a call)")
    cpu.set_title("CPU a request, every process (last round)")
    cpu.legend(fontsize=7)
    fig.suptitle(result["machine"]["cpu_model"] + f", {result['machine']['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_recommend_host", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--artifacts", type=Path, default=REPO_ROOT / "artifacts/trained-demo")
    parser.add_argument("--world", type=Path, default=REPO_ROOT / "artifacts/trained-demo",
                        help="trained artifacts whose world's users are loaded")  # fmt: skip
    parser.add_argument("--population", type=int, default=1000, help="world users loaded")
    parser.add_argument("--users", type=int, default=256, help="distinct users requested")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="in process, per rate")
    parser.add_argument("--window", type=int, default=200, help="perf_analyzer's requests")
    parser.add_argument(
        "--instances",
        help="instances of named models, e.g. recommend_chain=1 (default: the CPU profile's)",
    )
    parser.add_argument("--work", type=Path, default=REPO_ROOT / "build/bench-recommend-host")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench/results/recommend-host.json")
    parser.add_argument("--plot", type=Path, help="PNG (default: --out with .png)")
    args = parser.parse_args(argv)
    args.artifacts, args.world = args.artifacts.resolve(), args.world.resolve()
    return args


def main(argv=None) -> int:
    import json

    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    seq_len = load_config(args.artifacts).history_seq_len
    redis = RedisServer().start()
    try:
        store = UserStateStore(connect_store(redis.url))
        world = WorldUsers.from_artifacts(args.world)
        loaded = load_users(store, world, world.population(args.population))
        print(loaded.summary("the store"), flush=True)
        requests = requests_of(store, world, args, seq_len)
        os.environ[USER_STATE_URL_ENV] = redis.url  # the in-process chain reads it too
        server = start_triton(
            measured_repository(args),
            args.artifacts,
            env={USER_STATE_URL_ENV: redis.url},
            log_path=args.work / "tritonserver.log",
            exit_timeout_secs=5,
        )
        assert redis.process is not None  # started above
        try:
            rounds = measure(args, server, redis.process.pid, requests)
        finally:
            server.stop()
    finally:
        redis.stop()
    result = {
        "what": "recommend served against the same chain in one process (bench_recommend_host)",
        "command": "python -m bench.bench_recommend_host "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine(),
        "artifacts": args.artifacts.name,
        "instances": args.instances or "the CPU profile's",
        "users": len(requests["by_id"]),
        "top_k": TOP_K,
        "rounds": rounds,
    }
    result["median"] = medians(rounds)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.plot or args.out.with_suffix(".png"))
    print(json.dumps(result["median"], indent=1))
    return 0


def measured_repository(args) -> Path:
    """The model repository of the checkout whose ``phoenix`` runs (an older one, by path),
    or a copy with other instance counts (``--instances``)."""
    import phoenix

    repository = Path(phoenix.__file__).resolve().parents[1] / "model_repository"
    if not args.instances:
        return repository
    from phoenix.ops.configs import variant_repository
    from phoenix.ops.profiles import instance_counts

    counts = instance_counts(args.instances)
    return variant_repository(repository, args.work, "cpu", instances=counts)


def machine() -> dict:
    try:
        from harness.machine import machine as described

        return described()
    except ImportError:  # an older checkout
        return {"cpu_model": "unknown", "cpus": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
