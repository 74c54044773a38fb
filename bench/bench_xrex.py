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

Imports: harness, phoenix, and bench.bench_production's device check; jax in main().
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from bench.bench_production import require_device
from harness import REPO_ROOT
from harness.machine import machine
from harness.results import add_work_and_out, shown_path, write_results
from harness.xrex_release import ARCHIVE, ReleaseError, unpack
from phoenix.util.command_line import command_parser
from phoenix.util.machine_paths import portable_text

SIDE = "bench.xrex_side"  # run with the checkout as the working folder
REPLAYED = REPO_ROOT / "tests" / "data" / "production" / "small_serving.npz"
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "xrex.json"
NANO_SHAPE = (1022, 64)  # history x candidates, as X's serving benchmark runs the nano
# JAX_PLATFORMS of X's side: its JAX must find the device ours runs on, not fall back.
PLATFORMS = {"cpu": "cpu", "gpu": "cuda"}


def parse_args(argv: Optional[Sequence[str]]):
    parser = command_parser("python -m bench.bench_xrex", __doc__)
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
    add_work_and_out(parser, REPO_ROOT / "build" / "bench-xrex", DEFAULT_OUT)
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


def time_ours(ranker, inputs, rows, repeats: int) -> tuple[float, list[float], Any]:
    """Compile (the first call) and ``repeats`` timed calls, outputs fetched each time."""
    import jax

    started = time.perf_counter()
    outputs = jax.device_get(ranker.rank(inputs, rows))
    first = time.perf_counter() - started
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.device_get(ranker.rank(inputs, rows))
        seconds.append(time.perf_counter() - started)
    return first, seconds, outputs


def ours_against(set_path: Path, repeats: int) -> dict:
    """Our forward on a set X wrote: timed, and compared with X's outputs."""
    from phoenix.engine.production_ranking import ProductionRanker
    from phoenix.production.reference import Tolerances, compare, load_set

    reference = load_set(set_path)
    ranker = ProductionRanker(reference.config, reference.params)
    first, seconds, outputs = time_ours(ranker, reference.inputs, reference.rows, repeats)
    tolerances = Tolerances()
    differences = compare(outputs._asdict(), reference, tolerances)
    return {
        "tolerances": dataclasses.asdict(tolerances),
        "steps_over_limit": steps_over_limit(outputs._asdict(), reference, tolerances),
        "first_call_s": round(first, 2),
        "ms": [round(s * 1e3, 3) for s in seconds],
        "median_ms": round(statistics.median(seconds) * 1e3, 3),
        "differences": [d._asdict() for d in differences],
        "ok": all(d.ok for d in differences),
    }


def steps_over_limit(ours: dict, reference, tolerances) -> dict[str, float]:
    """Per checked output, the values past the absolute limit, in bfloat16 steps of X's value
    (the largest; 0 where none is past): 1 is one rounding apart, however large the value (a
    step is 0.125 from 16 to 32, over the log-prob limit of 0.08)."""
    import numpy as np

    from phoenix.production.reference import bfloat16_step

    limits = {"log_probs": tolerances.log_prob_max, "continuous": tolerances.continuous_max}
    largest = {}
    for name, limit in limits.items():
        pairs = [(np.asarray(ours[name])[b, :n], reference.expected[name][b, :n])
                 for b, n in enumerate(reference.candidate_len)]  # fmt: skip
        mine = np.concatenate([p[0].ravel() for p in pairs]).astype(np.float64)
        theirs = np.concatenate([p[1].ravel() for p in pairs]).astype(np.float64)
        apart = np.abs(mine - theirs)
        past = apart > limit
        largest[name] = (
            float((apart[past] / bfloat16_step(theirs[past])).max()) if past.any() else 0.0
        )
    return largest


def replay_difference(out: Path) -> list[dict]:
    """X's outputs re-run here against the ones stored in the replayed set."""
    import numpy as np

    here, stored = np.load(out / f"{REPLAYED.stem}.npz"), np.load(REPLAYED)
    rows = []
    for name in ("log_probs", "continuous_predictions"):
        real = [
            np.abs(here[f"out/{name}"][b, :n] - stored[f"out/{name}"][b, :n])
            for b, n in enumerate(stored["cand_len"])
        ]
        values = np.concatenate([d.ravel() for d in real])
        rows.append({"output": name, "max": float(values.max()), "mean": float(values.mean())})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    require_device(args.device)
    release, site = release_folders(args)
    sets = args.work / "sets"
    shape = ["--history", str(args.history), "--candidates", str(args.candidates)]
    small = ["--overrides-from", str(REPLAYED.with_suffix(".json"))] if args.small else []
    x_side = run_side(args, release, site, sets, ["--batches", args.batches, *shape, *small])
    replay_dir = args.work / "replay"
    replayed = run_side(args, release, site, replay_dir, ["--replay", str(REPLAYED)])
    results: dict[str, Any] = {
        "command": portable_text(
            shlex.join(["python", "-m", "bench.bench_xrex", *(argv or sys.argv[1:])])
        ),
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
            f" (past the limit: {lp['over']}, {row['ours']['steps_over_limit']['log_probs']:g} "
            "bfloat16 steps at most)"
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
