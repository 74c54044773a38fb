"""Check the production ranker against reference data written with X's own code.

For every reference set in a folder (``NAME.npz``, ``NAME_params.npz``, ``NAME.json``: the
layout ``phoenix.production.reference`` reads), load X's parameters into our model, run X's
inputs through it and print, per output, the largest and the mean absolute difference from
X's outputs over the real candidate rows. Exit status: 0 when every set is within the
tolerances, 1 when one is not, 2 when a folder or file cannot be used.

    phoenix-check-reference REFERENCE_DIR            # the serving engine (prefix + candidates)
    phoenix-check-reference REFERENCE_DIR --forward full
    make check-reference REFERENCE=REFERENCE_DIR
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from phoenix.util.command_line import command_parser

USAGE_ERROR = 2


def parse_args(argv: Sequence[str] | None):
    from phoenix.production.reference import Tolerances

    default = Tolerances()
    parser = command_parser(
        "phoenix-check-reference",
        "\n\n".join(__doc__.split("\n\n")[:2]),
        "examples:\n" + __doc__.split("\n\n")[2],
        show_defaults=True,
    )
    add = parser.add_argument
    add("reference", type=Path, help="folder of reference sets")
    add(
        "--forward",
        choices=("engine", "full"),
        default="engine",
        help="engine: the serving passes (the prefix once, then the candidates); full: every "
        "token in one pass",
    )
    add(
        "--attention",
        choices=("serving_kernel", "exact"),
        default=None,
        help="the keys a query attends to; by default what the set's config says (X's serving "
        "kernel unless its overrides name the training kernel)",
    )
    add("--log-prob-max", type=float, default=default.log_prob_max, help="largest |d log-prob|")
    add("--log-prob-mean", type=float, default=default.log_prob_mean, help="mean |d log-prob|")
    add("--continuous-max", type=float, default=default.continuous_max, help="largest |d cont.|")
    add(
        "--continuous-steps",
        type=int,
        default=default.continuous_steps,
        help="a continuous value also passes within this many bfloat16 steps of X's (the dwell "
        "head's values from 16 to 30 lie 0.125 apart); 0: --continuous-max alone",
    )
    add("--json", type=Path, default=None, help="also write the figures to this JSON file")
    return parser.parse_args(argv)


@functools.lru_cache(maxsize=4)
def full_forward(config):
    """The whole-sequence forward, jitted once per config."""
    import jax

    from phoenix.production import forward
    from phoenix.production.model import compiler_options

    return jax.jit(functools.partial(forward, config=config), compiler_options=compiler_options())


def run_set(data_path: Path, args, tolerances) -> dict:
    """Load one set, run it, compare; returns the row for the report."""
    import jax

    from phoenix.engine.production_ranking import ProductionRanker
    from phoenix.production import device_weights
    from phoenix.production.reference import compare, load_set

    started = time.perf_counter()
    ref = load_set(data_path)
    config = ref.config
    if args.attention is not None:
        config = dataclasses.replace(config, attention_keys=args.attention)
    if args.forward == "engine":
        ranker = ProductionRanker(config, ref.params)
        outputs = ranker.rank(ref.inputs, ref.rows)
    else:
        outputs = full_forward(config)(device_weights(ref.params, config), ref.inputs, ref.rows)
    outputs = jax.device_get(outputs)
    differences = compare(outputs._asdict(), ref, tolerances)
    return {
        "set": ref.name,
        "batch": len(ref.candidate_len),
        "history_len": [int(n) for n in ref.history_len],
        "candidate_len": [int(n) for n in ref.candidate_len],
        "attention_keys": config.attention_keys,
        "forward": args.forward,
        "seconds": round(time.perf_counter() - started, 1),
        "differences": [d._asdict() for d in differences],
        "ok": all(d.ok for d in differences),
    }


def print_row(row: dict) -> None:
    print(
        f"{row['set']}: batch {row['batch']}, history {row['history_len']}, candidates "
        f"{row['candidate_len']}, {row['forward']} forward, {row['attention_keys']} keys "
        f"({row['seconds']} s)"
    )
    for d in row["differences"]:
        verdict = ("ok" if d["ok"] else "OVER") if d["limit"] else "(not checked)"
        limit = f"  [{d['limit']}]" if d["limit"] else ""
        if d["limit"] and d["over"]:
            limit += (f"  ({d['over']} over the absolute limit, at most "
                      f"{d['over_steps']:.3g} bfloat16 steps from X's value)")  # fmt: skip
        print(f"  {d['output']:<11} max {d['max']:.4g}  mean {d['mean']:.4g}  {verdict}{limit}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from phoenix.production.reference import ReferenceError, Tolerances, find_sets

    tolerances = Tolerances(
        args.log_prob_max, args.log_prob_mean, args.continuous_max, args.continuous_steps
    )
    try:
        sets = find_sets(args.reference)
    except ReferenceError as error:
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    rows = []
    for index, data_path in enumerate(sets, 1):
        print(f"[{index}/{len(sets)}] {data_path.name}: load, compile, run ...", flush=True)
        try:
            row = run_set(data_path, args, tolerances)
        except (ReferenceError, ValueError, OSError) as error:
            print(f"error: {data_path.name}: {error}", file=sys.stderr)
            return USAGE_ERROR
        print_row(row)
        rows.append(row)
    failed = [row["set"] for row in rows if not row["ok"]]
    if args.json is not None:
        args.json.write_text(json.dumps({"sets": rows, "ok": not failed}, indent=1) + "\n")
    if failed:
        print(f"FAILED: {', '.join(failed)} over the tolerances", file=sys.stderr)
        return 1
    print(f"ok: {len(rows)} reference set(s) within the tolerances")
    return 0


if __name__ == "__main__":
    sys.exit(main())
