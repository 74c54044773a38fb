"""The GPU benchmark: every step, each in its own process, then the GPU table of the docs.

    python -m bench.gpu.measure                      # on a GPU machine set up by gpu_machine.py
    python -m bench.gpu.measure --steps engine       # one step, or a few: engine,retrieval
    .venv/bin/python -m bench.gpu.measure --cpu       # the same steps here, tiny and quick

Steps (sizes in harness/gpu_bench/profiles.py):
  engine     DeviceRanker against the plain original under jax.jit, at the target points
             (engine_points.py)                                        -> engine.json
  retrieval  top 100 for a batch of 64 users over 1 M and 10 M posts (retrieval.py)
                                                                       -> retrieval.json
  startup    Triton ready with an empty, then a filled program store (startup.py)
                                                                       -> startup.json
  serving    bench/bench_serving.py --device gpu, batching on and off  -> serving.json/png
  recommend  recommend end to end (top 100) over artifacts with a 1 M-post corpus file
             (bench_serving.py --workloads recommend)                 -> recommend.json/png
  production X's production ranker (nano, 1,022 x 64) served against its service in process,
             FLOP/s against the device's matmul rate (bench_production.py --device gpu)
                                                                       -> production.json
  prefix-cache
             the ranker's prefix cache, hits against misses, and the memory a cached user
             holds, the original's mini shapes and the production nano
             (bench_prefix_cache.py --skip-paged)                     -> prefix-cache.json
  reference  the production ranker's serving passes on this device against X's own outputs
             (tests/data/production, made with X's code; phoenix-check-reference)
                                                                       -> reference.json
  xrex       X's own forward (from X's release, packed in the payload by --xrex) against ours,
             same inputs, same device, and X's outputs of tests/data/production re-run here
             (bench_xrex.py); skipped without the payload's xrex.tar.xz  -> xrex.json

Results go to bench/results/gpu/ (with --cpu: build/gpu-bench/cpu-results/), a summary of the
run to run.json beside them, and the GPU section of docs/performance.md is rewritten from
whatever results are there (with --cpu only when --docs is given). Exit status 1 when a step
failed; the others still run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from harness import perf_analyzer
from harness.gpu_bench import profiles, report
from harness.xrex_release import ARCHIVE
from phoenix.util.command_line import command_parser

HERE = Path(__file__).resolve().parent
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


def parse_args(argv):
    parser = command_parser("python -m bench.gpu.measure", __doc__)
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


def step_environment(profile: profiles.Profile, cache: Path) -> dict[str, str]:
    """The steps' environment: platform, shared program store, perf_analyzer's libraries."""
    from phoenix.engine.programs import STORE_ENV  # imports JAX; no device is touched

    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    env["JAX_PLATFORMS"] = "cpu" if profile.device == "cpu" else "cuda"
    env[STORE_ENV] = str(cache)
    # bench_serving.py measures in-process beside two servers whose stubs also use the GPU.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["LD_LIBRARY_PATH"] = perf_analyzer.library_path_with_links(env.get("LD_LIBRARY_PATH"))
    return env


def ensure_artifacts(
    profile: profiles.Profile, folder: Path, env: dict, corpus_size: int | None = None
) -> None:
    """Seeded demo artifacts of the profile's preset (and corpus size), generated once."""
    if (folder / "config.json").is_file():
        return
    command = [sys.executable, "-m", "phoenix.artifacts", "--preset", profile.artifacts_preset,
               "--out", str(folder), "--force"]  # fmt: skip
    corpus_size = corpus_size or profile.corpus_size
    if corpus_size:
        command += ["--corpus-size", str(corpus_size)]
    print(f"== artifacts: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, env=env, cwd=profiles.REPO_ROOT, check=True)


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


def ensure_production_artifacts(args, env: dict) -> None:
    folder = production_artifacts(args)
    if (folder / "config.json").is_file():
        return
    command = [sys.executable, "-m", "phoenix.artifacts", "--ranker", "production", "--preset",
               args.profile.production_preset, "--out", str(folder), "--force"]  # fmt: skip
    if args.profile.corpus_size:  # the CPU profile's small corpus
        command += ["--corpus-size", str(args.profile.corpus_size)]
    print(f"== artifacts: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, env=env, cwd=profiles.REPO_ROOT, check=True)


def skipped(step: str, args) -> str:
    """Why ``step`` cannot run here ("" when it can)."""
    if step == "xrex" and args.payload is None:
        return "no --payload (a CPU run takes X's release from one only when told to)"
    if step == "xrex" and not (args.payload / ARCHIVE).is_file():
        return (f"no {args.payload / ARCHIVE}: X's release travels in the payload when it is "
                "built with --xrex X_PHOENIX_DIR (docs/gpu.md)")  # fmt: skip
    return ""


def run_step(step: str, args, env: dict) -> dict:
    print(f"== {step}", flush=True)
    reason = skipped(step, args)
    if reason:
        print(f"== {step}: skipped, {reason}", flush=True)
        return {"exit_code": 0, "seconds": 0.0, "skipped": reason}
    started = time.monotonic()
    done = subprocess.run(step_command(step, args), env=env, cwd=profiles.REPO_ROOT)
    seconds = time.monotonic() - started
    print(f"== {step}: exit {done.returncode} after {seconds:.0f} s", flush=True)
    return {"exit_code": done.returncode, "seconds": round(seconds, 1)}


def stamp_serving(path: Path, command: list[str], written_after: float, profile: str) -> None:
    """A STAMPED step's JSON names no GPU, driver or JAX, nor its command: add them (the
    report shows them), to a file this run wrote (never to an earlier run's, left by a step
    that failed early)."""
    if not path.is_file() or path.stat().st_mtime < written_after:
        return
    from harness.gpu_bench import stamp

    stamp.stamp(path, " ".join(["python", *command[1:]]), profile=profile)


def copy_results(results: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(results.glob("*.json")) + sorted(results.glob("*.png")):
        shutil.copy2(path, dest / path.name)
    print(f"copied the results to {dest}")


def main(argv=None) -> int:
    args = parse_args(argv)
    env = step_environment(args.profile, args.cache)
    args.results.mkdir(parents=True, exist_ok=True)
    run = {"profile": args.profile.name, "date": time.strftime("%Y-%m-%d %H:%M"), "steps": {}}
    started = time.monotonic()
    if {"startup", "serving"} & set(args.steps):
        ensure_artifacts(args.profile, args.artifacts, env)
    if "recommend" in args.steps:
        corpus = args.profile.recommend_corpus_size
        ensure_artifacts(args.profile, recommend_artifacts(args), env, corpus_size=corpus)
    if "production" in args.steps:
        ensure_production_artifacts(args, env)
    for step in args.steps:
        step_started = time.time()
        run["steps"][step] = run_step(step, args, env)
        if step in STAMPED and not run["steps"][step].get("skipped"):
            command = step_command(step, args)
            stamp_serving(args.results / f"{step}.json", command, step_started, args.profile.name)
    run["seconds"] = round(time.monotonic() - started, 1)
    (args.results / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    if args.docs:
        report.update_docs(args.docs, report.render(report.load_results(args.results)))
        print(f"updated the GPU section of {args.docs}")
    if args.copy_to:
        copy_results(args.results, args.copy_to)
    failed = [s for s, r in run["steps"].items() if r["exit_code"]]
    print(
        f"done in {run['seconds']:.0f} s; results in {args.results}"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
