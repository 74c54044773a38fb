"""Where one small ranking call's time goes: the engine's programs with their inputs already on
the device, against the same calls from host arrays, and the original's two ways.

    python -m bench.gpu.engine_diag --profile gpu --out bench/results/gpu/engine-diag.json

At each point (mini config; 1 x 64 and 1 x 1024 on a GPU), timed side by side:

- ``original_host`` / ``original_device``: the plain model under ``jax.jit`` from host arrays /
  from arrays placed on the device once;
- ``score_host``: ``DeviceRanker.score`` as benchmarked (host arrays in, host arrays out);
- ``score_program_device``: its program alone, inputs on the device, outputs left there;
- ``rank_host``: ``DeviceRanker.rank`` as served (raw ids in, three outputs read back);
- ``hash_device`` / ``rank_program_device``: its two programs alone, inputs on the device;
- ``rank_device_get``: both programs, the outputs read back in one ``jax.device_get``.

With ``--trace DIR`` a JAX profiler trace of a few calls of each is written there too (a
perfetto trace, when the profiler plugin is present).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from harness.gpu_bench import profiles

POINTS = {"gpu": [(1, 64), (1, 1024)], "cpu": [(1, 64)]}


def device_tree(tree):
    import jax

    return jax.tree.map(lambda x: None if x is None else jax.device_put(x), tree)


def measure_point(users, candidates, params, dtype, min_seconds, bench_engine, kwargs):
    import jax

    from bench.gpu.engine_points import model_config
    from phoenix.engine import DeviceRanker, example_inputs
    from phoenix.engine.device_ranking import feature_inputs, id_inputs

    config = model_config(kwargs, candidates, dtype)
    runner = bench_engine.original_with_weights(config, params)
    jitted = jax.jit(runner.rank_candidates)
    batch, emb = example_inputs(config, users, candidates, seed=users * 7 + candidates)
    on_device = device_tree((batch, emb))
    engine = DeviceRanker(
        config, params, compute_dtype=dtype, batch_buckets=(users,),
        candidate_buckets=(candidates,),
    )  # fmt: skip
    score_args = device_tree((engine.weights, *engine._score_inputs(batch, emb, users)))
    ranker = bench_engine.random_device_ranker(config, params, (candidates,), (users,))
    requests = bench_engine.random_request_batch(config, users, candidates, seed=users)
    ids = device_tree(id_inputs(requests))
    features = device_tree(feature_inputs(requests))
    hashed = ranker._hash(*ids)

    def rank_device_get():
        outputs = ranker._rank(ranker.weights, ranker._hash(*ids), features)
        return jax.device_get(outputs)

    fns = {
        "original_host": lambda: jax.block_until_ready(jitted(params, batch, emb).scores),
        "original_device": lambda: jax.block_until_ready(jitted(params, *on_device).scores),
        "score_host": lambda: engine.score(batch, emb),
        "score_program_device": lambda: jax.block_until_ready(engine._score(*score_args)),
        "rank_host": lambda: ranker.rank(requests),
        "hash_device": lambda: jax.block_until_ready(ranker._hash(*ids)),
        "rank_program_device": lambda: jax.block_until_ready(
            ranker._rank(ranker.weights, hashed, features)
        ),
        "rank_device_get": rank_device_get,
    }
    seconds = bench_engine.timed_side_by_side(fns, 2 * min_seconds)
    row = {"users": users, "candidates": candidates}
    row.update({name: round(s * 1e3, 4) for name, s in seconds.items()})  # ms
    return row, fns


def trace(folder: Path, fns: dict, calls: int = 5) -> None:
    import jax

    folder.mkdir(parents=True, exist_ok=True)
    with jax.profiler.trace(str(folder), create_perfetto_trace=True):
        for name, fn in fns.items():
            with jax.profiler.TraceAnnotation(name):
                for _ in range(calls):
                    fn()


def main(argv=None) -> int:
    parser = profiles.step_parser("bench.gpu.engine_diag", __doc__)
    parser.add_argument("--trace", type=Path, help="write a JAX profiler trace here")
    args = parser.parse_args(argv)
    profile = profiles.chosen_profile(args)
    profiles.require_device(profile)
    import jax.numpy as jnp

    from bench import bench_engine  # here: JAX is imported once the platform is chosen
    from bench.gpu.engine_points import model_config

    dtype = jnp.float32 if profile.device == "cpu" else jnp.bfloat16
    kwargs = profiles.MINI
    params = bench_engine.random_ranker_weights(model_config(kwargs, 64, dtype))
    rows, last = [], None
    for users, candidates in POINTS[profile.device]:
        row, last = measure_point(
            users, candidates, params, dtype, profile.min_seconds, bench_engine, kwargs
        )
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.trace and last is not None:
        try:
            trace(args.trace, last)
        except Exception as error:  # noqa: BLE001  the timings stand without a trace
            print(f"no trace: {error!r}"[:300], flush=True)
    profiles.write_result(args.out, {"profile": profile.name, "config": kwargs, "points": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
