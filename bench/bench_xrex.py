"""X's own production ranker forward against ours, in process, on the same device and the
same inputs: X's jitted forward run from X's release (bench/xrex_side.py, a process of its
own) writes one reference set per batch size with its timings; ours (``ProductionRanker``,
the engine's serving forward) then ranks each set's inputs, timed the same way, and its
outputs are compared with X's there (``phoenix.production.reference.compare``).

    python -m bench.bench_xrex --payload .gpu --device gpu      # the nano, batches 1 and 8
    python -m bench.bench_xrex --payload build/xrex --x-python X_PYTHON --small

``--payload`` is a folder holding ``xrex.tar.xz`` (``python -m harness.xrex_release``, or the
GPU payload built with ``--xrex``). Also replayed: the shipped reference set
``tests/data/production/small_serving`` (made with X's code on a CPU under its pinned JAX
0.8.1), X's forward re-run here on its inputs and parameters against the outputs stored: how
far X's own code moves on this device and JAX.

Each call of either forward takes its inputs from the host and returns its outputs to it
(``jax.device_get``), as serving does. On a CPU, X's Pallas kernel runs in interpret mode
(Pallas has no other there): a CPU run checks the harness and the agreement, not X's speed.

Imports: harness and phoenix; jax in main().
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from harness import REPO_ROOT
from harness.bench_options import REPLAYED, xrex_args
from harness.call_timing import milliseconds, timed_calls
from harness.machine import machine, require_device
from harness.results import command_line, shown_path, write_results
from harness.xrex_release import ARCHIVE, ReleaseError, unpack

SIDE = "bench.xrex_side"  # run with the checkout as the working folder
# JAX_PLATFORMS of X's side: its JAX must find the device ours runs on, not fall back.
PLATFORMS = {"cpu": "cpu", "gpu": "cuda"}


def release_folders(args) -> tuple[Path, Path]:
    try:
        return unpack(args.payload / ARCHIVE, args.work / "release")
    except ReleaseError as error:
        raise SystemExit(f"error: {error}") from None


def run_side(args, release: Path, site: Path, out: Path, extra: Sequence[str]) -> dict:
    """X's side (bench/xrex_side.py) in a process of its own, on the device ours uses; its
    timings.json."""
    shutil.rmtree(out, ignore_errors=True)
    paths = ["--release", str(release), "--site", str(site), "--out", str(out)]
    command = [args.x_python, "-m", SIDE, *paths, "--repeats", str(args.repeats), *extra]
    env = dict(os.environ, JAX_PLATFORMS=PLATFORMS[args.device])
    print(f"== X's forward: {shlex.join(command[1:])}", flush=True)
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=env)
    except OSError as error:
        raise SystemExit(f"error: --x-python {args.x_python}: cannot run it ({error})") from None
    if done.returncode:
        raise SystemExit(f"error: X's forward failed (exit {done.returncode})")
    timings = json.loads((out / "timings.json").read_text())
    if timings["backend"] != args.device:
        raise SystemExit(f"error: X's side ran on {timings['backend']!r}, not {args.device!r}")
    return timings


def ours_against(set_path: Path, repeats: int) -> dict:
    """Our forward on a set X wrote: timed, and compared with X's outputs."""
    from phoenix.engine.production_ranking import ProductionRanker
    from phoenix.production.reference import Tolerances, compare, load_set

    reference = load_set(set_path)
    ranker = ProductionRanker(reference.config, reference.params)
    first, seconds, outputs = timed_calls(
        lambda: ranker.rank(reference.inputs, reference.rows), repeats
    )
    differences = compare(outputs._asdict(), reference, Tolerances())
    return {
        "first_call_s": round(first, 2),
        **milliseconds(seconds),
        "differences": [d._asdict() for d in differences],
        "ok": all(d.ok for d in differences),
    }


def replay_difference(out: Path) -> list[dict]:
    """X's outputs re-run here against the ones stored in the replayed set (both sets hold
    the same inputs; their outputs compared as ours are)."""
    from phoenix.production.reference import Tolerances, compare, load_set

    here, stored = load_set(out / REPLAYED.name), load_set(REPLAYED)
    return [d._asdict() for d in compare(here.expected, stored, Tolerances())]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = xrex_args(argv, __doc__)
    require_device(args.device)
    release, site = release_folders(args)
    sets = args.work / "sets"
    shape = ["--history", str(args.history), "--candidates", str(args.candidates)]
    small = ["--overrides-from", str(REPLAYED.with_suffix(".json"))] if args.small else []
    x_side = run_side(args, release, site, sets, ["--batches", args.batches, *shape, *small])
    replay_dir = args.work / "replay"
    replayed = run_side(args, release, site, replay_dir, ["--replay", str(REPLAYED)])
    results: dict[str, Any] = {
        "command": command_line("bench.bench_xrex", argv),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "settings": {
            "device": args.device,
            "history": args.history,
            "candidates": args.candidates,
            "model": "small (tests/data/production)" if args.small else "nano",
            "repeats": args.repeats,
        },
        "x": {
            key: x_side[key]
            for key in ("device", "backend", "gpu_arch", "kernel", "jax", "stubbed")
        },
        "rows": [],
    }
    for x_row in x_side["rows"]:
        print(f"== ours on {x_row['set']}", flush=True)
        ours = ours_against(sets / f"{x_row['set']}.npz", args.repeats)
        results["rows"].append(
            {
                "batch": x_row["batch"],
                "x": x_row,
                "ours": ours,
                "x_over_ours": round(x_row["median_ms"] / ours["median_ms"], 3),
            }
        )
    results["replay"] = {
        "set": shown_path(REPLAYED),
        "x_here_against_stored": replay_difference(replay_dir),
        "x_ms": replayed["rows"][0]["median_ms"],
    }
    write_results(args.out, results)
    for row in results["rows"]:
        lp = next(d for d in row["ours"]["differences"] if d["output"] == "log_probs")
        print(
            f"batch {row['batch']}: X {row['x']['median_ms']:.2f} ms, ours "
            f"{row['ours']['median_ms']:.2f} ms ({row['x_over_ours']:.2f}x); log-probs "
            f"max {lp['max']:.3g} mean {lp['mean']:.3g} {'ok' if row['ours']['ok'] else 'OVER'}"
            f" (past the limit: {lp['over']}, {lp['over_steps']:g} bfloat16 steps at most)"
        )
    for diff in results["replay"]["x_here_against_stored"]:
        print(
            f"X here against X's stored {diff['output']}: max {diff['max']:.3g} "
            f"mean {diff['mean']:.3g}"
        )
    print(f"wrote {shown_path(args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
