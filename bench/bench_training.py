"""Benchmark: training throughput of both towers (examples/s), on CPU or an accelerator.

Run: ``make bench-training`` or ``python -m bench.bench_training`` (``--presets demo mini``,
``--steps N``, ``--quick``). For each preset and tower it trains ``--steps`` timed steps after
one compiling step on the preset's synthetic world (with fewer users: throughput does not
depend on the log size) and reports examples/s: (history, positive) pairs for the retrieval
tower, feed requests of up to 16 labelled candidates for the ranker (frozen tables, as in
training). Prints a table and writes ``bench/results/training.json`` (``--out``), keeping the
entries of other devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import time
from pathlib import Path

import jax
import numpy as np

from phoenix.training.data import LogIndex
from phoenix.training.presets import PRESETS
from phoenix.training.train import init_params, make_optimizer, make_train_step
from phoenix.world.synthetic import generate_logs

RESULTS = Path(__file__).parent / "results" / "training.json"
BENCH_USERS = 20_000


def device_name() -> str:
    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return f"{device.platform} ({getattr(device, 'device_kind', 'unknown')})"


def preset_index(preset_name: str, users: int) -> LogIndex:
    """The preset's logs (at most ``users`` users, seed 0), indexed once for both towers."""
    preset = PRESETS[preset_name]
    world_spec = dataclasses.replace(preset.world, num_users=min(users, preset.world.num_users))
    world, impressions = generate_logs(world_spec, 0)
    return LogIndex(world, impressions, preset.config(0))


def bench_tower(preset_name: str, index: LogIndex, tower: str, steps: int) -> dict:
    preset = PRESETS[preset_name]
    config = index.config
    phase = {s.towers[0]: s for s in preset.phases(0)}[tower]
    settings = dataclasses.replace(phase, steps=steps + 1)
    rng = np.random.default_rng(0)
    optimizer = make_optimizer(settings)
    step = make_train_step(config, optimizer, settings.towers)
    params = jax.tree_util.tree_map(jax.numpy.asarray, init_params(config, 0))
    state = optimizer.init(params)
    batches = [index.train_batch(tower, settings, rng) for _ in range(min(steps, 32))]  # untimed
    started = time.perf_counter()
    params, state, metrics = step(params, state, batches[0])
    jax.block_until_ready(metrics["loss"])
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(steps):
        params, state, metrics = step(params, state, batches[i % len(batches)])
    jax.block_until_ready(metrics["loss"])
    seconds = time.perf_counter() - started
    per_step = settings.ranker_batch if tower == "ranker" else settings.retrieval_batch
    return {
        "preset": preset_name,
        "tower": tower,
        "batch": per_step,
        "steps": steps,
        "compile_s": round(compile_s, 2),
        "step_ms": round(1e3 * seconds / steps, 2),
        "examples_per_s": round(per_step * steps / seconds, 1),
        "emb_size": config.emb_size,
        "num_layers": config.num_layers,
        "history_seq_len": config.history_seq_len,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["demo"], choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=100, help="timed steps per tower")
    parser.add_argument("--users", type=int, default=BENCH_USERS, help="users of the world")
    parser.add_argument("--quick", action="store_true", help="20 steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    steps = 20 if args.quick else args.steps
    device = device_name()
    rows = []
    for preset in args.presets:
        index = preset_index(preset, args.users)
        for tower in ("retrieval", "ranker"):
            row = bench_tower(preset, index, tower, steps)
            rows.append(row)
            print(
                f"{device:>24}  {preset:>5}  {tower:>9}  batch {row['batch']:>4}  "
                f"{row['step_ms']:>8.1f} ms/step  {row['examples_per_s']:>10,.0f} examples/s",
                flush=True,
            )
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results[device] = {
        "machine": {
            "backend": jax.default_backend(),
            "devices": str(jax.devices()),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "jax": jax.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        },
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
