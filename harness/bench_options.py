"""The command lines of the production benchmarks, parsed: bench/bench_production.py,
bench/bench_prefix_cache.py and bench/bench_xrex.py take their options from here, and tests
check what the GPU benchmark's steps (harness/gpu_bench/steps.py) pass them. Also what
bench_production serves and how many users a call it measures in process. Imports harness
and phoenix (no JAX); nothing here measures.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from harness import REPO_ROOT
from harness.results import add_work_and_out, shown_path
from harness.serving_repository import IN_PROCESS_BATCH
from harness.xrex_release import ARCHIVE
from phoenix.ops import profiles
from phoenix.ops.configs import write_repository
from phoenix.schema.contracts import RANKER
from phoenix.util.command_line import command_parser

RESULTS = REPO_ROOT / "bench" / "results"
# bench_production: the docs whose CPU table it rewrites, the artifacts it makes when absent
PRODUCTION_DOCS = REPO_ROOT / "docs" / "production.md"
DEFAULT_ARTIFACTS = REPO_ROOT / "build" / "production-nano"
# bench_xrex: the reference set X's forward replays, and the nano's shape X's serving
# benchmark runs (history x candidates)
REPLAYED = REPO_ROOT / "tests" / "data" / "production" / "small_serving.npz"
NANO_SHAPE = (1022, 64)


# --- bench_production ---------------------------------------------------------------------


def production_args(argv: Optional[Sequence[str]], description: str = ""):
    parser = command_parser("python -m bench.bench_production", description)
    add = parser.add_argument
    add("--artifacts", type=Path, default=DEFAULT_ARTIFACTS,
        help="a production-family artifact directory; build/production-nano is generated when "
        "absent (default: %(default)s)")  # fmt: skip
    add("--concurrency", type=lambda t: [int(v) for v in t.split(",") if v.strip()],
        help="concurrency levels (default: 1,16)")  # fmt: skip
    add("--protocols", default="grpc",
        help="comma-separated, from http,grpc (default: %(default)s)")  # fmt: skip
    add("--users", type=int, default=16, help="distinct users cycled through (default: 16)")
    add("--candidates", type=int, default=0,
        help="candidates per request (default: the ranker's candidate_seq_len)")  # fmt: skip
    add("--seed", type=int, default=0, help="seed of the users (default: 0)")
    add("--window-requests", type=int,
        help="requests per perf_analyzer window (default: 40; quick: 24)")  # fmt: skip
    add("--quick", action="store_true", help="c=1,16 and short windows and timings")
    add("--rounds", type=int, default=3,
        help="rounds of (in process, then served), each ratio taken within its round: the load "
        "of other work on a shared machine drifts over minutes (default: %(default)s)")  # fmt: skip
    add("--locust-seconds", type=float, default=60.0,
        help="then a headless Locust run (loadtest/locustfile.py, HTTP and gRPC users) against "
        "the same server for this long; 0 skips it (default: %(default)s; quick: 15)")  # fmt: skip
    add("--locust-users", type=int, default=4, help="Locust's users (default: %(default)s)")
    add("--out", type=Path, help="the JSON (default: bench/results/production-serving.json)")
    add("--docs", action="store_true", help=f"rewrite the table of {shown_path(PRODUCTION_DOCS)}")
    add("--build-dir", type=Path, default=REPO_ROOT / "build" / "bench-production",
        help="derived repository, input data, server log (default: %(default)s)")  # fmt: skip
    add("--device", choices=("cpu", "gpu"), default="cpu",
        help="the profile served and the device measured on: gpu serves the GPU profile and "
        "sets the FLOP rate against the bfloat16 matmul rate (default: %(default)s)")  # fmt: skip
    add("--instances", type=int, default=0,
        help="ranker instances of the measured server (default: the profile's)")  # fmt: skip
    add("--queue-timeout-s", type=float, default=120.0,
        help="the ranker's queue timeout in the measured server: the CPU profile's 5 s refuses "
        "what waits longer, and 16 nano requests in flight on 2 cores wait more than that "
        "(default: %(default)s)")  # fmt: skip
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or [1, 16]
    args.window_requests = args.window_requests or (24 if args.quick else 40)
    args.protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    stem = "production-serving-quick" if args.quick else "production-serving"
    args.out = args.out or RESULTS / f"{stem}.json"
    args.timing_s = 4.0 if args.quick else 10.0
    if args.docs and args.device != "cpu":
        docs = shown_path(PRODUCTION_DOCS)
        parser.error(f"--docs rewrites the CPU figures of {docs}; a GPU run's go to the GPU "
                     "section (python -m harness.gpu_bench.report)")  # fmt: skip
    if args.quick and args.locust_seconds == parser.get_default("locust_seconds"):
        args.locust_seconds = 15.0
    return args


def served_profile(args) -> profiles.Profile:
    return profiles.GPU if args.device == "gpu" else profiles.CPU


def production_repository(args) -> Path:
    """The ``--device`` profile's repository with the ranker's prefix cache off (perf_analyzer
    cycles through a pool of users: every later request of one would find its prefix), one
    candidate bucket, the requests' width (the others would only be compiled: minutes of a
    GPU's start-up), and its queue timeout at ``--queue-timeout-s``."""
    from dataclasses import replace

    values = {"prefix_cache_mib": 0, "candidate_buckets": (args.candidates,)}
    deployment = served_profile(args).with_parameters(RANKER.name, values)
    if args.instances:
        deployment = deployment.with_instances({RANKER.name: args.instances})
    ranker = deployment.models[RANKER.name]
    queue = replace(ranker.queue, timeout_us=int(args.queue_timeout_s * 1e6))
    models = {**deployment.models, RANKER.name: replace(ranker, queue=queue)}
    return write_repository(args.build_dir / "model_repository", replace(deployment, models=models))


def in_process_batches(concurrency: int, max_batch: int) -> tuple[int, ...]:
    """Users a call in process at a concurrency: one at c=1; beyond, 1, IN_PROCESS_BATCH and
    the most the server's batcher can put in one call there (``max_batch``: 8 on the CPU
    profile, 64 on the GPU's), padded to the same buckets as the served side's batches."""
    if concurrency == 1:
        return (1,)
    return tuple(sorted({1, min(IN_PROCESS_BATCH, concurrency), min(max_batch, concurrency)}))


# --- bench_prefix_cache -------------------------------------------------------------------


def prefix_cache_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.bench_prefix_cache",
        "Measure the ranker's prefix cache: the engine's throughput on hits and misses at "
        "history 1,022 x 64 candidates, the bytes a cached user holds, and Locust's paged "
        "users against a server with the cache and one without.",
        "Examples:\n  python -m bench.bench_prefix_cache\n"
        "  python -m bench.bench_prefix_cache --quick --out build/prefix-cache-quick.json\n"
        "  python -m bench.bench_prefix_cache --skip-paged\n",
    )
    add_work_and_out(
        parser, REPO_ROOT / "build" / "bench-prefix-cache", RESULTS / "prefix-cache.json"
    )
    add = parser.add_argument
    add("--quick", action="store_true", help="fewer rounds, a 20 s paged run per setting")
    add("--rounds", type=int, default=5, help="timed rounds of the engine (5)")
    add("--calls", type=int, default=6, help="calls per mode and round, 1 user a call (6)")
    add("--skip-paged", action="store_true", help="leave the Locust part out")
    add("--skip-production", action="store_true", help="leave the production ranker out")
    add("--locust-users", type=int, default=24, help="paged Locust users (24)")
    add("--skip-one-instance", action="store_true", help="no paged run of one ranker instance")
    add("--load-seconds", type=int, default=90, help="seconds of Locust per setting (90)")
    add("--page-interval", default="2,4", help="seconds between pages, LOW,HIGH (2,4)")
    add("--cache-mib", type=int, default=1024, help="the served cache's budget (1024 MiB)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.calls, args.load_seconds = 2, 3, 20
    return args


# --- bench_xrex ---------------------------------------------------------------------------


def xrex_args(argv: Optional[Sequence[str]], description: str = ""):
    parser = command_parser("python -m bench.bench_xrex", description)
    add = parser.add_argument
    add("--payload", type=Path, default=REPO_ROOT / ".gpu",
        help=f"a folder holding {ARCHIVE}, X's release (default: .gpu)")  # fmt: skip
    add("--x-python", default=sys.executable,
        help="the Python that runs X's side: one with X's dependencies, X's own venv for "
        "its pinned JAX (default: this one)")  # fmt: skip
    add("--device", choices=("cpu", "gpu"), default="cpu", help="(default: %(default)s)")
    add("--batches", default="1,8", help="comma-separated batch sizes (default: %(default)s)")
    add("--history", type=int, help=f"(default: {NANO_SHAPE[0]})")
    add("--candidates", type=int, help=f"(default: {NANO_SHAPE[1]})")
    add("--small", action="store_true",
        help=f"the model, overrides and shapes of {REPLAYED.with_suffix('.json').name} in "
        "tests/data/production instead of the nano (a CPU check in seconds)")  # fmt: skip
    add("--repeats", type=int, default=20,
        help="timed calls a batch, each side (default: %(default)s)")  # fmt: skip
    add_work_and_out(parser, REPO_ROOT / "build" / "bench-xrex", RESULTS / "xrex.json")
    args = parser.parse_args(argv)
    try:
        args.batch_sizes = [int(part) for part in args.batches.split(",")]
    except ValueError:
        parser.error(f"--batches: comma-separated whole numbers, got {args.batches!r}")
    if not args.batch_sizes or min(args.batch_sizes) < 1 or args.repeats < 1:
        parser.error("--batches and --repeats: 1 or more")
    if args.small and (args.history or args.candidates):
        parser.error("--small takes its shapes from its reference set: leave out "
                     "--history and --candidates")  # fmt: skip
    if args.small:
        meta = json.loads(REPLAYED.with_suffix(".json").read_text())
        args.history, args.candidates = meta["history_seq_len"], meta["candidate_seq_len"]
    args.history = args.history or NANO_SHAPE[0]
    args.candidates = args.candidates or NANO_SHAPE[1]
    # The side runs from the checkout's root: every path absolute before it is handed on.
    for name in ("payload", "work", "out"):
        setattr(args, name, getattr(args, name).resolve())
    return args
