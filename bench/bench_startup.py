"""Start-up: what each ranker bucket costs and buys, how fast a server answers, how fast a
killed model answers again. What `make bench-startup` runs.

    python -m bench.bench_startup --artifacts artifacts/demo [--steps buckets,serve,heal]

Steps:
  buckets  in process, for every (batch, candidates) bucket of the CPU ranker profile: seconds
           to compile its two programs into an empty store, seconds to load them from the
           store, milliseconds per call; the share of requests each candidate bucket gets in
           the project's traffic (clients/workload.py: recommend asks for 10-200 posts, a
           direct ranker call sends 1-512 candidates); and what removing the bucket would
           cost: its requests padded to the next bucket, over one hour at REFERENCE_RPS,
           against the load seconds it saves at every start of every instance.
  serve    the serve command (store built, as `make serve` runs it) from start to /ready 200,
           --starts times.
  heal     under a recommend load, kill -9 every ranker stub at once: seconds until /ready is
           200 again and until answers are good again, and the failed requests.

Figures: bench/results/startup.json and startup.png (the bucket table as bars). Timings are
printed and written, never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.loadgen import LoadRun, alternating_callers
from harness.polling import wait_until
from harness.results import write_results
from harness.serve_process import ServeProcess
from phoenix.util.command_line import command_parser
from phoenix.util.processes import http_get_status

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
STEPS = ("buckets", "serve", "heal")
REFERENCE_RPS = 100.0  # requests/s one replica serves, for the padding side of the table
CALLS_PER_BUCKET = 7  # timed calls per bucket (the fastest is kept)
TOP_K = 50
DRAIN_S = 0.5  # serve's drain at each stop: nothing is under load then
READY_TIMEOUT_S = 600.0


# ----------------------------------------------------------------------------------------
# buckets
# ----------------------------------------------------------------------------------------


def candidate_shares(buckets: tuple[int, ...]) -> dict[str, dict[int, float]]:
    """Share of requests per candidate bucket in each workload of clients/workload.py."""
    from clients.workload import MAX_RANDOM_CANDIDATES
    from phoenix.engine.batching import bucket_for

    workloads = {
        "recommend": np.arange(10, 201),  # top_k drawn uniformly from 10..200
        "rank": np.arange(1, MAX_RANDOM_CANDIDATES + 1),  # 1..512 candidates
    }
    shares = {}
    for name, counts in workloads.items():
        chosen = [bucket_for(int(c), buckets) for c in counts]
        shares[name] = {b: chosen.count(b) / len(chosen) for b in buckets}
    return shares


def time_buckets(artifacts: Path) -> list[dict]:
    """Compile, load and call seconds of every ranker bucket of the CPU profile."""
    from phoenix.engine.programs import STORE_ENV, ProgramStore
    from phoenix.ops.compile import service_settings
    from phoenix.stub.services.catalog import build_service

    settings = service_settings("ranker", artifacts, "cpu")
    batch_buckets = settings.batch_buckets
    candidate_buckets = settings.parameters["candidate_buckets"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="startup-store-") as empty:
        os.environ[STORE_ENV] = empty  # the artifacts' own store stays as it is
        try:
            for users in batch_buckets:
                for width in candidate_buckets:
                    rows.append(time_one_bucket(settings, users, width, build_service))
                    print(_bucket_line(rows[-1]), flush=True)
        finally:
            del os.environ[STORE_ENV]
            ProgramStore.forget_open()
    return rows


def time_one_bucket(settings, users: int, width: int, build_service) -> dict:
    """One bucket's programs compiled, then loaded by a second ranker, then called."""
    from dataclasses import replace

    from phoenix.engine.programs import ProgramStore
    from phoenix.stub.services.ranker import empty_request_batch

    one = replace(
        settings,
        max_batch_size=users,
        parameters={
            **settings.parameters,
            "batch_buckets": (users,),
            "candidate_buckets": (width,),
        },
    )
    ProgramStore.forget_open()
    started = time.perf_counter()
    build_service(one).warm_up()
    compile_s = time.perf_counter() - started
    ProgramStore.forget_open()
    service = build_service(one)
    started = time.perf_counter()
    service.warm_up()
    load_s = time.perf_counter() - started
    ranker = service.ranker
    batch = empty_request_batch(ranker.config, users, width)
    ranker.rank(batch)  # the first call of a loaded program pays a little extra
    calls = []
    for _ in range(CALLS_PER_BUCKET):
        started = time.perf_counter()
        ranker.rank(batch)
        calls.append(time.perf_counter() - started)
    return {
        "users": users,
        "candidates": width,
        "compile_s": round(compile_s, 3),
        "load_s": round(load_s, 3),
        "call_ms": round(1e3 * min(calls), 2),  # the least disturbed call of a busy machine
    }


def _bucket_line(row: dict) -> str:
    return (
        f"  bucket {row['users']} x {row['candidates']:>4}: compile {row['compile_s']:5.2f} s, "
        f"load {row['load_s']:5.3f} s, call {row['call_ms']:7.2f} ms"
    )


def bucket_decisions(rows: list[dict], instances: int) -> list[dict]:
    """Whether each candidate bucket and each batch bucket earns its place (a profile chooses
    the two sets, not single pairs). Removing one pads its calls to the next larger bucket:
    the extra call time, over an hour of REFERENCE_RPS calls (spread evenly over the batch
    buckets, over candidate counts as the two workloads' average share), against the load
    seconds every start of every instance saves (its programs at every size of the other
    dimension). The largest bucket of each set is the limit and stays."""
    call = {(r["users"], r["candidates"]): r["call_ms"] for r in rows}
    load = {(r["users"], r["candidates"]): r["load_s"] for r in rows}
    users = sorted({u for u, _ in call})
    widths = sorted({w for _, w in call})
    shares = candidate_shares(tuple(widths))
    share = {w: (shares["recommend"][w] + shares["rank"][w]) / 2 for w in widths}
    calls_per_hour = REFERENCE_RPS * 3600 / len(users)  # per batch bucket

    def decide(kind, value, pairs_now, pairs_padded, weights):
        saved = sum(load[p] for p in pairs_now) * instances
        padding_s = sum(
            weight * max(call[padded] - call[now], 0.0) / 1e3 * calls_per_hour
            for now, padded, weight in zip(pairs_now, pairs_padded, weights)
        )
        keep = padding_s >= saved
        return {"dimension": kind, "bucket": value, "saved_s_per_start": round(saved, 2),
                "padding_s_per_hour": round(padding_s, 1), "keep": keep}  # fmt: skip

    out = []
    for i, w in enumerate(widths[:-1]):
        nxt = widths[i + 1]
        out.append(decide("candidates", w, [(u, w) for u in users], [(u, nxt) for u in users],
                          [share[w]] * len(users)))  # fmt: skip
    for i, u in enumerate(users[:-1]):
        nxt = users[i + 1]
        out.append(decide("users", u, [(u, w) for w in widths], [(nxt, w) for w in widths],
                          [share[w] for w in widths]))  # fmt: skip
    return out


def bucket_table(rows: list[dict]) -> str:
    lines = ["| bucket (users x candidates) | compile s | load s | call ms |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['users']} x {r['candidates']} | {r['compile_s']:.2f} | "
                     f"{r['load_s']:.3f} | {r['call_ms']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def decision_table(decisions: list[dict]) -> str:
    lines = [
        "| bucket removed | start-up saved per start (s) | padding added per hour (s) | keep |",
        "|---|---|---|---|",
    ]
    for d in decisions:
        keep = "yes" if d["keep"] else "no"
        lines.append(f"| {d['dimension']} {d['bucket']} | {d['saved_s_per_start']:.2f} | "
                     f"{d['padding_s_per_hour']:.1f} | {keep} |")  # fmt: skip
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# serve and heal
# ----------------------------------------------------------------------------------------


def time_serve_starts(artifacts: Path, work: Path, starts: int) -> list[float]:
    seconds = []
    for index in range(starts):
        serve = ServeProcess(artifacts, work / f"start-{index}", DRAIN_S).start()
        try:
            seconds.append(round(serve.wait_ready(READY_TIMEOUT_S), 2))
            print(f"  start {index + 1}: ready after {seconds[-1]:.1f} s", flush=True)
        finally:
            serve.stop()
    return seconds


def recommend_load(serve: ServeProcess, artifacts: Path, duration_s: float) -> LoadRun:
    from phoenix.checkpoint import load_example_sequence
    from phoenix.client.client import recommend_inputs

    inputs = recommend_inputs(load_example_sequence(artifacts).to_dict(), top_k=TOP_K)
    make = alternating_callers(serve.http_url, serve.grpc_url, "recommend", inputs,
                               outputs=["ranked_post_ids"], timeout_s=60)  # fmt: skip
    return LoadRun(make, workers=4, duration_s=duration_s, pause_after_error_s=0.05)


def kill_all_ranker_stubs(serve: ServeProcess, artifacts: Path) -> dict:
    """Under load, kill -9 every ranker stub; when answers and /ready are good again."""
    with recommend_load(serve, artifacts, duration_s=120) as run:
        time.sleep(5)
        pids = [int(p) for p, name in serve.status()["stub_pids"].items()
                if name.startswith("ranker_")]  # fmt: skip
        killed = time.monotonic()
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        ready = wait_until(lambda: http_get_status(serve.ready_url) == 200
                           and time.monotonic() > killed + 0.5, 120, 0.05)  # fmt: skip
        time.sleep(5)
        run.stop()
    outcomes = run.snapshot()
    failed = [o for o in outcomes if not o.ok and o.ended >= killed]
    last_failure = max((o.started for o in failed), default=killed)
    good_again = min((o.ended for o in outcomes if o.ok and o.started > last_failure),
                     default=None)  # fmt: skip
    return {
        "stubs_killed": len(pids),
        "ready_again_s": round(ready - killed, 2) if ready else None,
        "good_answers_again_s": round(good_again - killed, 2) if good_again else None,
        "requests": len(outcomes),
        "failed": len(failed),
        "ok_after": sum(o.ok and o.started > last_failure for o in outcomes),
    }


def time_heals(artifacts: Path, work: Path, kills: int) -> list[dict]:
    serve = ServeProcess(artifacts, work / "heal", DRAIN_S).start()
    rows = []
    try:
        serve.wait_ready(READY_TIMEOUT_S)
        for index in range(kills):
            rows.append(kill_all_ranker_stubs(serve, artifacts))
            print(f"  kill {index + 1}: {json.dumps(rows[-1])}", flush=True)
    finally:
        serve.stop()
    return rows


# ----------------------------------------------------------------------------------------
# report
# ----------------------------------------------------------------------------------------


def write_plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{v['users']}x{v['candidates']}" for v in rows]
    x = np.arange(len(labels))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    top.bar(x - 0.2, [v["compile_s"] for v in rows], 0.4, label="compile (empty store)")
    top.bar(x + 0.2, [v["load_s"] for v in rows], 0.4, label="load (built store)")
    top.set_ylabel("seconds per instance start")
    top.legend()
    top.set_title("Ranker buckets: start-up cost and call time (2-core CPU)")
    bottom.bar(x, [v["call_ms"] for v in rows], 0.6, color="tab:green")
    bottom.set_ylabel("ms per call")
    bottom.set_xticks(x, labels, rotation=45)
    bottom.set_xlabel("bucket (users x candidates)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv):
    parser = command_parser("python -m bench.bench_startup", __doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--artifacts", type=Path, default=Path("artifacts/demo"), help="(%(default)s)")
    add("--steps", default=",".join(STEPS), help="comma-separated: %(default)s")
    add("--starts", type=int, default=3, help="serve starts to time (%(default)s)")
    add("--kills", type=int, default=2, help="kills of every ranker stub (%(default)s)")
    add("--results", type=Path, default=RESULTS / "startup.json", help="(%(default)s)")
    args = parser.parse_args(argv)
    args.steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    args.artifacts = args.artifacts.resolve()
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    from phoenix.ops.compile import ensure_programs
    from phoenix.ops.profiles import CPU

    results = json.loads(args.results.read_text()) if args.results.is_file() else {}
    results["machine"] = f"{os.cpu_count()} cores"
    results["artifacts"] = str(args.artifacts.relative_to(REPO_ROOT))
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        if "buckets" in args.steps:
            print("== buckets (in process)", flush=True)
            os.environ.setdefault("JAX_PLATFORMS", "cpu")
            instances = CPU.models["ranker"].instances
            rows = time_buckets(args.artifacts)
            decisions = bucket_decisions(rows, instances)
            results["buckets"] = {"instances": instances, "reference_rps": REFERENCE_RPS,
                                  "rows": rows, "decisions": decisions}  # fmt: skip
            print(bucket_table(rows), decision_table(decisions), sep="\n\n")
            write_plot(rows, args.results.with_suffix(".png"))
        if {"serve", "heal"} & set(args.steps):
            ensure_programs(args.artifacts, "cpu")
        if "serve" in args.steps:
            print(f"== serve: {args.starts} starts, store built", flush=True)
            starts = time_serve_starts(args.artifacts, work, args.starts)
            results["serve_ready_s"] = starts
        if "heal" in args.steps:
            print(f"== heal: kill every ranker stub under load, {args.kills} times", flush=True)
            results["heal"] = time_heals(args.artifacts, work, args.kills)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_results(args.results, results)
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
