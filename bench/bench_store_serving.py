"""Benchmark: `recommend` served over corpus stores of 100 k and 10 M posts, under Locust.

For each store, a real server (`phoenix-serve --corpus store-N`) over the trained demo towers
takes `recommend` requests from Locust (`--tags recommend`) for --load-seconds; the req/s and the
failures are Locust's, with nothing else running. Over the largest store, a second Locust run
follows (--probe-load-seconds, its req/s and failures kept apart, as `during_probes`), and
while it sends:

1. freshness: a new post that suits a user is written to a running `phoenix-ingest --follow`;
   seconds until `recommend` returns it to that user;
2. deletion: its tombstone goes through the same ingest; seconds until it is gone, then it is
   watched for --watch-seconds: every answer is checked;
3. compaction: `phoenix-compact` seals the fresh segments while the load runs;
4. window: a window is set that expires the older half of the posts; no answer after that may
   hold a post older than the window.

Run: ``make bench-store-serving``; it builds the stores it lacks under
build/bench-store-serving/artifacts (``python -m bench.bench_retrieval --keep --work
build/bench-store-serving/artifacts`` leaves its stores there). Writes
``bench/results/retrieval-serving.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench.retrieval_data import TRAINED, generator_posts
from harness import REPO_ROOT
from harness.locust_runs import finish_locust, locust_totals, start_locust
from harness.machine import machine
from harness.process_cpu import cpu_ms_per_request, served_cpu_seconds
from harness.results import add_work_and_out, write_results
from harness.serve_process import ServeProcess
from phoenix.checkpoint import load_example_sequence
from phoenix.client.client import connect, infer, recommend_inputs, user_inputs
from phoenix.corpus_store import SEALED, CorpusStore, choose_index
from phoenix.util.command_line import command_parser

RESULTS = Path(__file__).parent / "results"
WORK = Path("build/bench-store-serving")
PROBE_TOP_K = 100
POLL_S = 0.1


def prepare_artifacts(work: Path, sizes: list[int]) -> Path:
    """A copy of the trained demo artifacts holding a sealed store of each size."""
    artifacts = work / "artifacts"
    if not (artifacts / "config.json").exists():  # stores may be there already (--work of
        shutil.copytree(TRAINED, artifacts, dirs_exist_ok=True)  # bench_retrieval --keep)
    for size in sizes:
        root = artifacts / f"store-{size}"
        if (root / "manifest.json").exists() and indexed_as_chosen_now(root):
            continue
        shutil.rmtree(root, ignore_errors=True)
        _, posts = generator_posts(TRAINED, size)
        print(f"building store-{size} (sealed, indexed)", flush=True)
        CorpusStore.create(root, posts.embeddings.shape[1]).add(posts, SEALED)
    return artifacts


def indexed_as_chosen_now(root: Path) -> bool:
    """Whether every sealed segment of the kept store at ``root`` has the index choose_index
    gives it today: a store kept from a run before the choice changed is built again."""
    manifest = CorpusStore(root).manifest()
    return all(
        segment.index == choose_index(segment.rows, manifest.emb_size)
        for segment in manifest.segments
        if segment.state == SEALED
    )


class Probe:
    """One user's `recommend` answers, asked over HTTP beside the load."""

    def __init__(self, url: str, artifacts: Path):
        self.client = connect(url, "http")
        self.user = load_example_sequence(artifacts).to_dict()

    def posts(self) -> np.ndarray:
        inputs = recommend_inputs(self.user, top_k=PROBE_TOP_K)
        return infer(self.client, "http", "recommend", inputs)["ranked_post_ids"][0]

    def user_vector(self) -> np.ndarray:
        arrays = user_inputs(self.user)
        return infer(self.client, "http", "user_encoder", arrays)["user_embedding"][0]

    def seconds_until(self, check, limit_s: float) -> float | None:
        started = time.monotonic()
        while time.monotonic() - started < limit_s:
            if check(self.posts()):
                return round(time.monotonic() - started, 2)
            time.sleep(POLL_S)
        return None


def suited_post(artifacts: Path, vector: np.ndarray, seed: int = 7) -> tuple[int, int]:
    """(post id, author id) of a new post the user's vector ranks first among 4,096 drawn."""
    from phoenix.engine import CandidateTower

    rng = np.random.default_rng(seed)
    ids = rng.integers(2**61, 2**62, 4096)
    authors = np.asarray(load_example_sequence(artifacts).history_author_ids)
    authors = authors[rng.integers(0, len(authors), 4096)]
    best = int(np.argmax(CandidateTower.from_artifacts(artifacts)(ids, authors) @ vector))
    return int(ids[best]), int(authors[best])


def start_ingest(store: Path, artifacts: Path, log: Path) -> subprocess.Popen:
    command = [
        sys.executable, "-m", "clients.ingest", "--store", str(store), "--artifacts",
        str(artifacts), "--follow", "--flush-seconds", "1", "-",
    ]  # fmt: skip
    return subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=log.open("w"), stderr=subprocess.STDOUT,
        text=True, cwd=REPO_ROOT,
    )  # fmt: skip


def send(ingest: subprocess.Popen, record: dict) -> None:
    assert ingest.stdin is not None  # start_ingest's PIPE
    ingest.stdin.write(json.dumps(record) + "\n")
    ingest.stdin.flush()


def fresh_posts_probe(args, probe: Probe, artifacts: Path, store: Path, work: Path) -> dict:
    """Freshness, deletion, compaction and window, measured while the load runs."""
    ingest = start_ingest(store, artifacts, work / "ingest.log")
    time.sleep(args.ingest_start_s)  # the ingest process loads the towers first
    post_id, author_id = suited_post(artifacts, probe.user_vector())
    out: dict[str, Any] = {"post_id": post_id}
    send(ingest, {"post_id": post_id, "author_id": author_id, "created_at": int(time.time())})
    out["ingest_to_recommend_s"] = probe.seconds_until(lambda p: post_id in p, 60)
    send(ingest, {"delete": post_id})
    out["delete_to_gone_s"] = probe.seconds_until(lambda p: post_id not in p, 60)
    started, returned, answers = time.monotonic(), 0, 0
    while time.monotonic() - started < args.watch_seconds:  # once gone, never back
        returned += int(post_id in probe.posts())
        answers += 1
        time.sleep(POLL_S)
    out["after_delete"] = {"answers": answers, "returned_deleted_post": returned}
    ingest.send_signal(signal.SIGTERM)
    ingest.wait(60)
    compact = [sys.executable, "-m", "clients.compact", "--store", str(store)]
    started = time.monotonic()
    subprocess.run(compact, check=True, cwd=REPO_ROOT, capture_output=True)
    out["compaction_s"] = round(time.monotonic() - started, 2)
    out["window"] = window_probe(args, probe, store)
    return out


def window_probe(args, probe: Probe, store: Path) -> dict:
    """Set a window that expires the older half of the posts; then no answer may hold one."""
    snapshot = CorpusStore(store).open()
    created = np.concatenate([np.asarray(s.created_at) for s in snapshot.segments])
    window = int(time.time() - np.median(created))
    CorpusStore(store).set_window(window)
    time.sleep(args.settle_seconds)
    cutoff = time.time() - window
    old, answers = 0, 0
    started = time.monotonic()
    while time.monotonic() - started < args.watch_seconds:
        posts = probe.posts()
        _, times, found = CorpusStore(store).open().lookup(posts)
        old += int(np.sum(found & (times < cutoff)))
        answers += 1
        time.sleep(POLL_S)
    CorpusStore(store).set_window(None)
    return {"window_s": window, "answers": answers, "posts_older_than_window": old}


def served_stack(serve: ServeProcess) -> dict[str, int]:
    """{"server": tritonserver's pid (the supervisor's /status), "redis": the user-state
    redis-server `phoenix-serve` started (absent when it was given a URL)}."""
    pids = {"server": serve.status()["server_pid"]}
    for child in psutil.Process(serve.running().pid).children():
        if child.name().startswith("redis-server"):
            pids["redis"] = child.pid
    return pids


def stack_cpu(stack: dict[str, int]):
    """CPU seconds so far of tritonserver, each model's stubs and redis-server."""
    helpers = {"redis": stack["redis"]} if "redis" in stack else {}
    return served_cpu_seconds(stack["server"], **helpers)


def locust_load(
    args, urls: dict, prefix: Path, seconds: float, during=None, stack=None
) -> tuple[dict, object]:
    """Locust's `recommend` for ``seconds``, while ``during()`` (when given) runs from the
    start: ({requests, failures, requests_per_s}, what ``during`` returned). ``probes_s``
    says how long ``during`` took; past ``seconds`` it ran without the load. With ``stack``
    (``served_stack``), also the CPU-ms each process spent per request
    (``cpu_ms_per_request``: by model, tritonserver and redis; Locust's own excluded)."""
    cpu_before = stack_cpu(stack) if stack else None
    extra = ["--stop-timeout", "10", "--tags", "recommend", "TritonHttpUser", "TritonGrpcUser"]
    locust = start_locust(urls, prefix, users=args.users, artifacts=args.artifacts,
                          run_time=f"{seconds:g}s", extra=extra)  # fmt: skip
    started = time.monotonic()
    found = None
    out: dict[str, Any] = {}
    try:
        if during is not None:
            found = during()
            out["probes_s"] = round(time.monotonic() - started, 1)
            if out["probes_s"] > seconds:
                took = out["probes_s"]
                print(f"warning: the probes took {took} s, past the load's {seconds:g} s")
        locust.wait(max(1.0, seconds + 60 - (time.monotonic() - started)))
    finally:
        finish_locust(locust)
    requests, failures = locust_totals(prefix)
    out.update(requests=requests, failures=failures, requests_per_s=round(requests / seconds, 1))
    if stack:
        assert cpu_before is not None  # read with the same stack
        out["cpu_ms_per_request"] = cpu_ms_per_request(cpu_before, stack_cpu(stack), requests)
    return out, found


def run_size(args, artifacts: Path, size: int, probe_fresh: bool) -> dict:
    """Locust alone for --load-seconds (the req/s compared across sizes); over the largest
    store, then a second run of Locust (--probe-load-seconds) during which the probes work,
    reported apart: their own requests, the ingest process and compaction share the cores."""
    work = args.work / f"serve-{size}"
    # the throwaway user-state store its figures were measured with (no append-only file)
    extra = ["--corpus", f"store-{size}", "--ephemeral-store"]
    serve = ServeProcess(artifacts, work, 0.0, extra).start()
    try:
        ready_s = serve.wait_ready(args.ready_timeout)
        urls = {"http": serve.http_url, "grpc": serve.grpc_url}
        row: dict[str, Any] = {"posts": size, "serve_ready_s": round(ready_s, 1)}
        stack = served_stack(serve)
        load, _ = locust_load(args, urls, work / "locust", args.load_seconds, stack=stack)
        row.update(load)
        if probe_fresh:
            probe = Probe(serve.http_url, artifacts)
            store = artifacts / f"store-{size}"
            during, fresh = locust_load(
                args,
                urls,
                work / "locust-probes",
                args.probe_load_seconds,
                lambda: fresh_posts_probe(args, probe, artifacts, store, work),
            )
            row["fresh"] = fresh
            row["during_probes"] = during
        return row
    finally:
        serve.stop()


def parse_args(argv=None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.bench_store_serving",
        "recommend served over corpus stores under Locust: req/s per store size, and over the "
        "largest, freshness of ingested posts, deletions, compaction and the window.",
        "Examples:\n"
        "  python -m bench.bench_store_serving\n"
        "  python -m bench.bench_store_serving --sizes 100000,1000000 --load-seconds 30",
    )
    parser.add_argument("--sizes", default="100000,10000000", help="store sizes (posts)")
    parser.add_argument("--users", type=int, default=8, help="Locust users (%(default)s)")
    parser.add_argument("--load-seconds", type=float, default=90.0)
    parser.add_argument(
        "--probe-load-seconds",
        type=float,
        default=150.0,
        help="the load while the probes run over the largest store (%(default)s)",
    )
    parser.add_argument("--watch-seconds", type=float, default=10.0)
    parser.add_argument("--settle-seconds", type=float, default=2.0)
    parser.add_argument("--ingest-start-s", type=float, default=8.0)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    add_work_and_out(parser, WORK, RESULTS / "retrieval-serving.json")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    artifacts = prepare_artifacts(args.work, sizes).resolve()
    args.artifacts = artifacts  # Locust draws histories from its corpus.npz
    rows = [run_size(args, artifacts, size, size == max(sizes)) for size in sizes]
    smallest, largest = rows[0], rows[-1]
    result = {
        "machine": machine(),
        "users": args.users,
        "load_seconds": args.load_seconds,
        "sizes": rows,
        "largest_vs_smallest_req_per_s": round(
            largest["requests_per_s"] / max(smallest["requests_per_s"], 1e-9), 3
        ),
    }
    write_results(args.out, result)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
