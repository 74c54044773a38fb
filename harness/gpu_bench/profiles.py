"""What the GPU benchmark measures: the engine's points on a GPU, tiny stand-ins on a CPU.

Shared by the step scripts in this folder (each runs as its own process, so JAX's hold on the
GPU ends with the step and the Triton stubs of the serving step find the memory free).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

from phoenix.util.command_line import command_parser

REPO_ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = REPO_ROOT / "bench"
RESULTS_GPU = BENCH_DIR / "results" / "gpu"
BUILD_DIR = REPO_ROOT / "build" / "gpu-bench"

# Transformer shapes (grok.TransformerConfig keyword arguments, widening 2, multiplier 0.125).
MINI = dict(emb_size=128, key_size=32, num_q_heads=4, num_kv_heads=4, num_layers=4)
LARGE = dict(emb_size=512, key_size=64, num_q_heads=8, num_kv_heads=4, num_layers=8)
# The CPU stand-in for LARGE: grouped-query attention too, small enough for a smoke test.
SMALL_GQA = dict(emb_size=64, key_size=16, num_q_heads=4, num_kv_heads=2, num_layers=2)


@dataclass(frozen=True)
class Profile:
    """One set of sizes for every step."""

    name: str
    device: str  # "gpu" or "cpu": JAX's platform and the Triton instance kind
    configs: dict[str, dict]
    ranking_points: dict[str, list[tuple[int, int]]]  # config -> (users, candidates)
    min_seconds: float  # per timed function and point
    retrieval_sizes: list[int]
    retrieval_batch: int
    artifacts_preset: str
    corpus_size: int | None
    serving_args: list[str] = field(default_factory=list)
    # Models the start-up step loads; empty: the whole repository.
    startup_models: tuple[str, ...] = ()
    # The recommend step: the ensemble served end to end over artifacts with this corpus.
    recommend_corpus_size: int = 0
    recommend_args: list[str] = field(default_factory=list)
    # The production step: X's production ranker of this preset, served and in process
    # (bench/bench_production.py); the prefix-cache step (bench/bench_prefix_cache.py).
    production_preset: str = "nano"
    production_args: list[str] = field(default_factory=list)
    prefix_cache_args: list[str] = field(default_factory=list)
    # The xrex step: X's own forward beside ours (bench/bench_xrex.py), from the payload.
    xrex_args: list[str] = field(default_factory=list)


GPU = Profile(
    name="gpu",
    device="gpu",
    configs={"mini": MINI, "large": LARGE},
    ranking_points={
        "mini": [(1, 64), (1, 1024), (16, 512), (64, 512), (256, 1024)],
        "large": [(1, 1024), (16, 512), (64, 1024)],
    },
    min_seconds=0.5,
    retrieval_sizes=[1_000_000, 10_000_000],
    retrieval_batch=64,
    artifacts_preset="mini",
    corpus_size=None,
    serving_args=(
        "--workloads ranker-64,ranker-512 --protocols http --concurrency 1,16,64,256 "
        "--window-requests 100"
    ).split(),
    recommend_corpus_size=1_000_000,
    recommend_args=(
        "--workloads recommend --protocols http --batching on --concurrency 16,64,256 "
        "--window-requests 100"
    ).split(),
    # Short timings (--quick) at three points, two rounds: about 3 minutes with the compiles.
    production_args=(
        "--quick --concurrency 1,16,64 --protocols grpc --rounds 2 --window-requests 100 "
        "--users 64 --locust-seconds 20 --locust-users 16"
    ).split(),
    # Locust's paged users measure the served cache on the CPU profile's server: left out.
    prefix_cache_args=["--skip-paged"],
    # The nano at 1,022 x 64, batches of 1, 8 and 64 (the served ranker's buckets).
    xrex_args="--batches 1,8,64 --repeats 20".split(),
)

CPU = Profile(
    name="cpu",
    device="cpu",
    configs={"mini": MINI, "small-gqa": SMALL_GQA},
    ranking_points={"mini": [(1, 64)], "small-gqa": [(2, 64)]},
    min_seconds=0.05,
    retrieval_sizes=[1_000, 5_000],
    retrieval_batch=8,
    artifacts_preset="tiny",
    corpus_size=500,
    serving_args=(
        "--quick --workloads ranker-64 --protocols http --concurrency 1 --window-requests 4 "
        "--users 2"
    ).split(),
    # One small model: a cold start of the whole repository compiles every bucket of every
    # model, minutes of a shared 2-core CPU, which the serving step pays once anyway.
    startup_models=("candidate_tower",),
    recommend_corpus_size=2_000,
    recommend_args=(
        "--quick --workloads recommend --protocols http --batching on --concurrency 1 "
        "--window-requests 4 --users 2"
    ).split(),
    production_preset="tiny",
    production_args=(
        "--quick --concurrency 1 --protocols grpc --rounds 1 --window-requests 4 --users 2 "
        "--locust-seconds 0 --instances 1"
    ).split(),
    # X's production ranker at nano is minutes of a small CPU: make bench-prefix-cache has it.
    prefix_cache_args="--quick --skip-paged --skip-production --rounds 1 --calls 2".split(),
    # X's kernel runs interpreted on a CPU: the small model of tests/data/production.
    xrex_args="--small --batches 1 --repeats 2".split(),
)

PROFILES = {p.name: p for p in (GPU, CPU)}


def select_platform(profile: Profile) -> None:
    """JAX's platform for this process; must run before JAX is imported."""
    if profile.device == "cpu":
        os.environ["JAX_PLATFORMS"] = "cpu"


def require_device(profile: Profile) -> None:
    """Stop with a readable error when a GPU run would silently fall back to the CPU."""
    import jax

    if profile.device == "gpu" and jax.default_backend() != "gpu":
        raise SystemExit(
            f"error: the gpu profile needs JAX on a GPU, found {jax.default_backend()!r} "
            f"({jax.devices()}); use --cpu to run the steps on the CPU"
        )


def gpu_identity() -> dict:
    """The GPU's name and driver from nvidia-smi ({} where there is none)."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"]
    try:
        line = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    fields = [f.strip() for f in line.splitlines()[0].split(",")] if line.strip() else []
    return dict(zip(("gpu", "driver"), fields)) if len(fields) == 2 else {}


def machine_info() -> dict:
    """Where a result was measured: JAX's devices and versions, GPU and driver, host, date."""
    import jax
    import numpy as np

    return {
        **gpu_identity(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "device_kind": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def step_parser(module: str, doc: str):
    """The argument parser every step shares: --profile and --out (add a step's own options)."""
    parser = command_parser(f"python -m {module}", doc)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="gpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON written here")
    return parser


def chosen_profile(args) -> Profile:
    """The profile named by --profile, with JAX pointed at its platform."""
    profile = PROFILES[args.profile]
    select_platform(profile)
    return profile


def command_line(argv: list[str] | None = None) -> str:
    """This process's command as a reader would type it (``python -m bench.gpu.STEP ARGS``),
    with no path of this machine (``phoenix.util.machine_paths``)."""
    import shlex
    import sys

    from phoenix.util.machine_paths import portable_text

    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    if script.is_relative_to(REPO_ROOT) and script.suffix == ".py":
        head = "python -m " + ".".join(script.relative_to(REPO_ROOT).with_suffix("").parts)
    else:
        head = f"python {argv[0]}"
    return portable_text(" ".join([head, *map(shlex.quote, argv[1:])]))


def write_result(out: Path, result: dict) -> None:
    """A step's JSON, with the command that ran it and where it was measured (JAX imported
    only now: see startup.py)."""
    import json

    result = {"command": command_line(), "machine": machine_info(), **result}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
