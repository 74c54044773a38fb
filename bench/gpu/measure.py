"""The GPU benchmark: every step, each in its own process, then the GPU table of the docs.

    python -m bench.gpu.measure                      # on a GPU machine set up by gpu_machine.py
    python -m bench.gpu.measure --steps engine       # one step, or a few: engine,retrieval
    .venv/bin/python -m bench.gpu.measure --cpu       # the same steps here, tiny and quick

Steps (sizes in harness/gpu_bench/profiles.py, commands in harness/gpu_bench/steps.py):
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
from harness.gpu_bench.steps import (
    STAMPED,
    parse_args,
    production_artifacts,
    recommend_artifacts,
    skipped,
    step_command,
)


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
    args = parse_args(argv, __doc__)
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
