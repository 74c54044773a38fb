"""The GPU benchmark's steps as data: their names, the module each runs, the command line
each gets from a profile (harness/gpu_bench/profiles.py), and why one cannot run. bench/gpu/
measure.py runs them; tests check the commands against the scripts' own parsers. Imports
harness and phoenix.util only; no step runs from here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from harness.gpu_bench import profiles, report
from harness.xrex_release import ARCHIVE
from phoenix.util.command_line import command_parser

STEPS = (
    *report.STEPS,
    "recommend",
    "production",
    "prefix-cache",
    "reference",
    "xrex",
)  # a JSON each
# Each step runs as `python -m <module>` from the checkout's root (no install needed there).
STEP_MODULES = {
    "engine": "bench.gpu.engine_points",
    "retrieval": "bench.gpu.retrieval",
    "startup": "bench.gpu.startup",
    "serving": "bench.bench_serving",
    "recommend": "bench.bench_serving",
    "production": "bench.bench_production",
    "prefix-cache": "bench.bench_prefix_cache",
    "reference": "phoenix.ops.check_reference",
    "xrex": "bench.bench_xrex",
}
# X's outputs for small configs of its production ranker, made with X's own code (their README).
REFERENCE_SETS = profiles.REPO_ROOT / "tests" / "data" / "production"
# The steps whose JSON names no GPU, driver or command of the run: measure.py adds them.
STAMPED = ("serving", "recommend", "production", "prefix-cache", "reference", "xrex")


def parse_args(argv, description: str = ""):
    parser = command_parser("python -m bench.gpu.measure", description)
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="the steps on this machine's CPU, tiny sizes (a smoke run)",
    )
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help=f"comma-separated, from {','.join(STEPS)} (default: all)",
    )
    parser.add_argument("--results", type=Path, help="folder for the JSON/PNG files")
    parser.add_argument(
        "--docs",
        type=Path,
        help="markdown file whose GPU section is rewritten (default: "
        "docs/performance.md; none with --cpu)",
    )
    parser.add_argument("--no-docs", action="store_true", help="leave the docs alone")
    parser.add_argument(
        "--artifacts", type=Path, help="artifacts to serve (default: made in build/gpu-bench/)"
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=profiles.BUILD_DIR,
        help="artifacts, derived repositories, JAX cache and logs (default: build/gpu-bench)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        help="compiled-program store of the served models (default: in --build-dir)",
    )
    parser.add_argument("--copy-to", type=Path, help="also copy the result files here")
    parser.add_argument(
        "--payload",
        type=Path,
        help="the GPU payload, for the xrex step's X release (default: $GPU_PAYLOAD or .gpu; "
        "with --cpu none: the step is skipped unless this is given)",
    )
    args = parser.parse_args(argv)
    args.profile = profiles.CPU if args.cpu else profiles.GPU
    args.steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = sorted(set(args.steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}; choose from {list(STEPS)}")
    args.build_dir = args.build_dir.resolve()
    if args.payload is None and not args.cpu:
        args.payload = Path(os.environ.get("GPU_PAYLOAD", profiles.REPO_ROOT / ".gpu"))
    if args.payload is not None:
        args.payload = args.payload.resolve()
    default_results = args.build_dir / "cpu-results" if args.cpu else profiles.RESULTS_GPU
    args.results = (args.results or default_results).resolve()
    if args.no_docs or (args.docs is None and args.cpu):
        args.docs = None
    elif args.docs is None:
        args.docs = profiles.REPO_ROOT / "docs" / "performance.md"
    args.artifacts = (
        args.artifacts or args.build_dir / f"artifacts-{args.profile.artifacts_preset}"
    ).resolve()
    args.cache = (args.cache or args.build_dir / f"programs-{args.profile.device}").resolve()
    # The start-up step empties its cache. Loading every model, it then leaves the serving
    # step a filled cache; loading a few (CPU profile), it keeps out of a shared one.
    whole = not args.profile.startup_models
    args.startup_cache = args.cache if whole else args.build_dir / "programs-startup"
    return args


def step_command(step: str, args) -> list[str]:
    out = args.results / f"{step}.json"
    profile = args.profile
    command = [sys.executable, "-m", STEP_MODULES[step]]
    if step in ("engine", "retrieval"):
        return command + ["--profile", profile.name, "--out", str(out)]
    if step == "production":
        return command + [
            "--device", profile.device, "--artifacts", str(production_artifacts(args)),
            "--out", str(out), "--build-dir", str(args.build_dir / step), *profile.production_args,
        ]  # fmt: skip
    if step == "prefix-cache":
        return command + ["--out", str(out), "--work", str(args.build_dir / step),
                          *profile.prefix_cache_args]  # fmt: skip
    if step == "reference":
        return command + [str(REFERENCE_SETS), "--json", str(out)]
    if step == "xrex":
        return command + ["--payload", str(args.payload), "--device", profile.device,
                          "--out", str(out), "--work", str(args.build_dir / step),
                          *profile.xrex_args]  # fmt: skip
    if step == "startup":
        return command + ["--profile", profile.name, "--artifacts", str(args.artifacts),
                          "--cache", str(args.startup_cache), "--build-dir", str(args.build_dir),
                          "--out", str(out)]  # fmt: skip
    # bench_serving's own table belongs to the CPU section: keep it out of the docs.
    artifacts, extra = args.artifacts, profile.serving_args
    if step == "recommend":
        artifacts, extra = recommend_artifacts(args), profile.recommend_args
    return command + [
        "--device", profile.device, "--artifacts", str(artifacts), "--out", str(out),
        "--plot", str(out.with_suffix(".png")), "--build-dir", str(args.build_dir / step),
        "--docs", str(args.build_dir / f"{step}-table.md"), *extra,
    ]  # fmt: skip


def recommend_artifacts(args) -> Path:
    """The recommend step's artifacts: the profile's preset with its larger corpus."""
    corpus = args.profile.recommend_corpus_size
    return args.build_dir / f"artifacts-{args.profile.artifacts_preset}-corpus{corpus}"


def production_artifacts(args) -> Path:
    """The production step's artifacts: X's production ranker at the profile's preset."""
    return args.build_dir / f"production-{args.profile.production_preset}"


def skipped(step: str, args) -> str:
    """Why ``step`` cannot run here ("" when it can)."""
    if step == "xrex" and args.payload is None:
        return "no --payload (a CPU run takes X's release from one only when told to)"
    if step == "xrex" and not (args.payload / ARCHIVE).is_file():
        return (f"no {args.payload / ARCHIVE}: X's release travels in the payload when it is "
                "built with --xrex X_PHOENIX_DIR (docs/gpu.md)")  # fmt: skip
    return ""
