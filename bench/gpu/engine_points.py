"""The in-process engines against the plain original model under `jax.jit`.

`DeviceRanker.score` takes the same hashed features as the original; `DeviceRanker.rank`
(what the ranker serves) starts from raw ids, so its time includes hashing, lookups, blend
and sort.

    python -m bench.gpu.engine_points --profile gpu --out bench/results/gpu/engine.json

Same random weights and inputs for both, at each (users, candidates) point of the profile
(harness/gpu_bench/profiles.py). `phoenix.runners` + `phoenix.recsys_model` jitted whole is the
stand-in for the original; the two are timed in alternating rounds (bench_engine.py's
`timed_side_by_side`). Both compute in bfloat16 on a GPU, float32 on a CPU.
"""

# ruff: noqa: B023  (the timed closures run inside the loop iteration that defines them)

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable

from harness.gpu_bench import profiles

# The engine's two ways through the transformer: the cached-context passes (context once,
# then candidates against its cache) and the joint pass (one sequence; fewer launches).
JOINT_MODES = {"cached": 0, "joint": 10**9}


def model_config(kwargs: dict, candidates: int, dtype):
    from phoenix.grok import TransformerConfig
    from phoenix.recsys_model import PhoenixModelConfig

    transformer = TransformerConfig(widening_factor=2.0, attn_output_multiplier=0.125, **kwargs)
    return PhoenixModelConfig(
        model=transformer,
        emb_size=kwargs["emb_size"],
        num_actions=19,
        history_seq_len=127,
        candidate_seq_len=candidates,
        fprop_dtype=dtype,
    )


def max_probability_gap(engine_logits, original_scores) -> float:
    """Largest |sigmoid(engine logits) - original probabilities|: both compute the same."""
    import numpy as np

    got = 1 / (1 + np.exp(-np.asarray(engine_logits, np.float32)))
    return float(np.max(np.abs(got - np.asarray(original_scores, np.float32))))


def device_inputs(tree):
    """``tree``'s arrays placed on the device once: a call then times the device work and the
    dispatch alone, with no copy of the inputs."""
    import jax

    return jax.tree.map(lambda x: None if x is None else jax.device_put(x), tree)


def launches(compiled) -> int:
    """Instructions of an optimized program's entry that run as device work (fusions, matrix
    products, custom calls, copies): on a small batch each is a launch, and launches, not
    arithmetic, take the time."""
    text = compiled.as_text()
    entry = text[text.index("ENTRY") :]
    body = entry[: entry.index("\n}")]
    free = ("parameter(", "constant(", "get-tuple-element(", "tuple(", "bitcast(")
    return sum(
        1 for line in body.splitlines()[1:] if "=" in line and not any(f in line for f in free)
    )


def rank_launches(ranker, requests) -> int:
    """Launches of both programs a ``DeviceRanker.rank`` runs (hash, then rank)."""
    from phoenix.engine.device_ranking import feature_inputs, id_inputs
    from phoenix.engine.programs import input_key

    ids = id_inputs(requests)
    hashed = ranker._hash.output_shapes(*ids)
    total = 0
    for program, args in (
        (ranker._hash, ids),
        (ranker._rank, (ranker.weights, hashed, feature_inputs(requests))),
    ):
        program.prepare(*args)
        total += launches(program._executables[input_key(args, {})])
    return total


def measure_point(name, kwargs, users, candidates, params, dtype, min_seconds, bench_engine):
    """One (users, candidates) point: the original, the engine's score and rank paths with the
    cached-context passes and with the joint pass, timed side by side; device-resident inputs
    and launch counts say where a small batch's time goes."""
    import jax

    from bench.flops import flops_per_candidate, flops_per_context
    from phoenix.engine import DeviceRanker, example_inputs
    from phoenix.engine.programs import input_key
    from phoenix.schema.contracts import RANKER_CANDIDATE_BUCKETS

    config = model_config(kwargs, candidates, dtype)
    runner = bench_engine.original_with_weights(config, params)
    jitted = jax.jit(runner.rank_candidates)
    batch, emb = example_inputs(config, users, candidates, seed=users * 7 + candidates)
    on_device = device_inputs((batch, emb))
    requests = bench_engine.random_request_batch(config, users, candidates, seed=users)
    engines, rankers = {}, {}
    for mode, joint_rows in JOINT_MODES.items():
        engines[mode] = DeviceRanker(
            config, params, compute_dtype=dtype, batch_buckets=(users,),
            candidate_buckets=RANKER_CANDIDATE_BUCKETS, joint_rows=joint_rows,
        )  # fmt: skip
        # What the ranker serves: raw ids in, ranked order out (hashing, lookups, blend and
        # sort included, which the original's scores leave out).
        rankers[mode] = bench_engine.random_device_ranker(
            config, params, (candidates,), (users,), joint_rows=joint_rows
        )

    def original():
        return jax.block_until_ready(jitted(params, batch, emb).scores)

    def original_on_device():
        return jax.block_until_ready(jitted(params, *on_device).scores)

    row = {"config": name, "users": users, "candidates": candidates}
    reference = original()
    fns: dict[str, Callable[[], object]] = {
        "original_jit_s": original,
        "original_device_inputs_s": original_on_device,
    }
    for mode in JOINT_MODES:
        engine, ranker = engines[mode], rankers[mode]
        row[f"max_abs_prob_diff_{mode}"] = max_probability_gap(
            engine.score(batch, emb).logits, reference
        )
        fns[f"engine_{mode}_s"] = functools.partial(engine.score, batch, emb)
        fns[f"device_ranker_{mode}_s"] = functools.partial(ranker.rank, requests)
    seconds = bench_engine.timed_side_by_side(fns, 2 * min_seconds)
    row.update(seconds)
    row["launches"] = {
        "original": launches(jitted.lower(params, batch, emb).compile()),
        **{f"rank_{mode}": rank_launches(rankers[mode], requests) for mode in JOINT_MODES},
    }
    for mode in JOINT_MODES:
        engine = engines[mode]
        args = (engine.weights, *engine._score_inputs(batch, emb, users))
        row["launches"][f"score_{mode}"] = launches(engine._score._executables[input_key(args, {})])
    work = users * candidates
    row["original_jit_cands_per_s"] = work / seconds["original_jit_s"]
    # The engine's figures are its faster mode's at this point (what a default picks).
    best = min(JOINT_MODES, key=lambda mode: seconds[f"engine_{mode}_s"])
    best_rank = min(JOINT_MODES, key=lambda mode: seconds[f"device_ranker_{mode}_s"])
    row["engine_mode"], row["device_ranker_mode"] = best, best_rank
    row["max_abs_prob_diff"] = row[f"max_abs_prob_diff_{best}"]
    row["engine_s"] = seconds[f"engine_{best}_s"]
    row["device_ranker_s"] = seconds[f"device_ranker_{best_rank}_s"]
    row["engine_cands_per_s"] = work / row["engine_s"]
    row["engine_vs_original"] = seconds["original_jit_s"] / row["engine_s"]
    row["device_ranker_cands_per_s"] = work / row["device_ranker_s"]
    row["device_ranker_vs_original"] = seconds["original_jit_s"] / row["device_ranker_s"]
    flops = users * (flops_per_context(config) + candidates * flops_per_candidate(config))
    row["engine_tflops"] = flops / row["engine_s"] / 1e12
    row["device_ranker_tflops"] = flops / row["device_ranker_s"] / 1e12
    return row


def measure(profile: profiles.Profile, configs: list[str]) -> list[dict]:
    import jax.numpy as jnp

    from bench import bench_engine  # here: JAX is imported once the platform is chosen

    dtype = jnp.float32 if profile.device == "cpu" else jnp.bfloat16
    rows = []
    for name in configs:
        points = profile.ranking_points[name]
        kwargs = profile.configs[name]
        params = bench_engine.random_ranker_weights(model_config(kwargs, 64, dtype))
        for users, candidates in points:
            try:
                row = measure_point(
                    name, kwargs, users, candidates, params, dtype, profile.min_seconds,
                    bench_engine,
                )  # fmt: skip
            except Exception as error:  # noqa: BLE001  one point out of memory must not end the run
                row = {"config": name, "users": users, "candidates": candidates,
                       "error": repr(error)[:500]}  # fmt: skip
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = profiles.step_parser("bench.gpu.engine_points", __doc__)
    parser.add_argument("--configs", help="comma-separated configs of the profile (default: all)")
    args = parser.parse_args(argv)
    profile = profiles.chosen_profile(args)
    chosen = args.configs.split(",") if args.configs else list(profile.ranking_points)
    unknown = sorted(set(chosen) - set(profile.ranking_points))
    if unknown:
        parser.error(f"unknown configs {unknown}; the profile has {list(profile.ranking_points)}")
    profiles.require_device(profile)
    ranking = measure(profile, chosen)
    configs = {name: profile.configs[name] for name in chosen}
    profiles.write_result(
        args.out, {"profile": profile.name, "configs": configs, "ranking": ranking}
    )
    return 1 if any("error" in r for r in ranking) else 0


if __name__ == "__main__":
    sys.exit(main())
