"""Exact top 100 over a device-resident corpus, several ways, side by side.

    python -m bench.gpu.topk_variants --profile gpu --out bench/results/gpu/topk.json
    python -m bench.gpu.topk_variants --profile gpu --raft --out .../topk-raft.json

Same users [B, D] and unit corpus [M, D] (random, drawn on the device) for every variant:
  engine        RetrievalEngine.top_k with the engine's defaults (binned two-pass top-k, results
                to the host, no exclusions; batch buckets up to 16, so 64 users are four device
                calls; default tiles: the whole corpus while its scores fit, see
                default_corpus_tile)
  engine-1tile  the same with the whole corpus as one tile (no scan over tiles)
  engine-1tile-noexcl  and with exclusion lists one wide instead of 4,096
  .../program   each engine's device program alone, one call of all 64 users, its inputs
                already on the device
  plain         lax.top_k of the full [B, M] score matrix
  approx        lax.approx_max_k of it (exact on GPUs, own kernel)
  binned        the engine's two passes without tiles: max of each bin of 128, top-k bins,
                top-k within them
Each device variant is checked against `plain` (same k-th score); speeds are queries/s.
--raft sets XLA's --xla_gpu_experimental_use_raft_select_k (k >= 8 to RAFT's select_k) for this
process: run it as its own process (XLA reads its flags once).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional

from harness.gpu_bench import profiles

if TYPE_CHECKING:  # imports JAX, which waits for the platform to be chosen
    from phoenix.engine.retrieval import RetrievalEngine

RAFT_FLAG = "--xla_gpu_experimental_use_raft_select_k=true"
TOP_K = 100


def device_variants(k: int):
    import jax
    import jax.numpy as jnp

    from phoenix.engine.retrieval import SCORE_BIN as BIN  # the engine's bins

    def scores_of(users, corpus):
        return jnp.dot(users, corpus.T, preferred_element_type=jnp.float32)  # [B, M]

    def plain(users, corpus):
        return jax.lax.top_k(scores_of(users, corpus), k)

    def approx(users, corpus):
        return jax.lax.approx_max_k(scores_of(users, corpus), k, recall_target=1.0)

    def binned(users, corpus):
        scores = scores_of(users, corpus)  # [B, M], M a multiple of BIN
        batch, size = scores.shape
        bins = scores.reshape(batch, size // BIN, BIN)  # [B, nb, BIN]
        _, best_bins = jax.lax.top_k(jnp.max(bins, axis=-1), k)  # [B, k]
        picked = jnp.take_along_axis(bins, best_bins[:, :, None], axis=1)  # [B, k, BIN]
        top, position = jax.lax.top_k(picked.reshape(batch, k * BIN), k)  # [B, k]
        index = jnp.take_along_axis(best_bins, position // BIN, axis=1) * BIN + position % BIN
        return top, index

    return {"plain": jax.jit(plain), "approx": jax.jit(approx), "binned": jax.jit(binned)}


# RetrievalEngine options of the engine variants ("whole": the corpus size).
ENGINE_VARIANTS: dict[str, dict[str, Any]] = {
    "engine": {},
    "engine-1tile": {"corpus_tile": "whole"},
    "engine-1tile-noexcl": {"corpus_tile": "whole", "max_excluded": 1},
}
VARIANTS = ("plain", "approx", "binned", *ENGINE_VARIANTS)


def device_program_alone(engine, users, k: int):
    """A call of the engine's top-k program on device-resident inputs, waited for."""
    import jax
    import numpy as np

    from phoenix.engine.retrieval import padded_index_lists

    program, arrays = engine._top_k_program()
    on_device = jax.device_put(np.asarray(users, np.float32))
    excluded = jax.device_put(padded_index_lists(None, users.shape[0], engine.max_excluded))
    size = np.int32(engine.corpus.size)
    return lambda: jax.block_until_ready(program(on_device, *arrays, size, excluded, k=k))


def measure(sizes, batch: int, runs: int, only=VARIANTS) -> list[dict]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from bench import bench_engine  # here: JAX is imported once the platform is chosen
    from phoenix.engine.retrieval import whole_bins

    def seconds_per_call(fn) -> float:  # median of ``runs`` calls after a warm one
        return bench_engine.timed(fn, min_seconds=0.0, min_runs=runs)

    rows = []
    for size in sizes:
        size = whole_bins(size)  # for `binned` (1 M -> 1,000,064 rows)
        corpus = jax.random.normal(jax.random.PRNGKey(size), (size, 128), jnp.float32)  # [M, D]
        corpus = corpus / jnp.linalg.norm(corpus, axis=1, keepdims=True)
        users = jax.random.normal(jax.random.PRNGKey(1), (batch, 128), jnp.float32)  # [B, D]
        users = users / jnp.linalg.norm(users, axis=1, keepdims=True)
        low = corpus.astype(jnp.bfloat16)
        low_users = users.astype(jnp.bfloat16)
        variants = device_variants(TOP_K)
        reference = np.asarray(variants["plain"](low_users, low)[0])[:, -1]  # k-th score [B]
        row: dict[str, Any] = {"corpus": size, "batch": batch, "top_k": TOP_K,
                               "queries_per_s": {}, "kth_score_max_gap": {}}  # fmt: skip
        for name, fn in variants.items():
            if name not in only:
                continue
            try:
                got = np.asarray(fn(low_users, low)[0])[:, -1]
                row["kth_score_max_gap"][name] = float(np.max(np.abs(got - reference)))
                waited = lambda fn=fn, u=low_users, c=low: jax.block_until_ready(fn(u, c))  # noqa: E731
                row["queries_per_s"][name] = batch / seconds_per_call(waited)
            except Exception as error:  # noqa: BLE001  one variant failing must not end the run
                row["queries_per_s"][name] = None
                row.setdefault("errors", {})[name] = repr(error)[:300]
        host_corpus = np.asarray(corpus)
        host_users = np.asarray(users)
        del corpus, low
        engine: Optional[RetrievalEngine] = None
        for name, options in ENGINE_VARIANTS.items():
            if name not in only:
                continue
            options = {k: size if v == "whole" else v for k, v in options.items()}
            try:
                engine, _ = bench_engine.random_retrieval_engine(**options)
                engine.set_corpus(host_corpus)
                found = engine.top_k(host_users, TOP_K)[1][:, -1]
                row["kth_score_max_gap"][name] = float(np.max(np.abs(found - reference)))
                timed = lambda engine=engine, u=host_users: engine.top_k(u, TOP_K)  # noqa: E731
                row["queries_per_s"][name] = batch / seconds_per_call(timed)
                # The device program alone, its inputs already on the device: the rest of
                # engine.top_k's time is the host's (padding, exclusion lists, transfers).
                program = device_program_alone(engine, host_users, TOP_K)
                row["queries_per_s"][f"{name}/program"] = batch / seconds_per_call(program)
            except Exception as error:  # noqa: BLE001  e.g. out of memory: the others go on
                row["queries_per_s"][name] = None
                row.setdefault("errors", {})[name] = repr(error)[:300]
            engine = None  # its corpus leaves the device before the next one arrives
        print(row, flush=True)
        rows.append(row)
    return rows


def main(argv=None) -> int:
    parser = profiles.step_parser("bench.gpu.topk_variants", __doc__)
    parser.add_argument("--raft", action="store_true", help=f"XLA_FLAGS += {RAFT_FLAG}")
    parser.add_argument("--runs", type=int, default=30, help="timed calls per variant")
    parser.add_argument("--only", help=f"comma-separated, from {','.join(VARIANTS)} (default: all)")
    args = parser.parse_args(argv)
    only = args.only.split(",") if args.only else VARIANTS
    unknown = sorted(set(only) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    if args.raft:
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {RAFT_FLAG}".strip()
    profile = profiles.chosen_profile(args)
    profiles.require_device(profile)
    rows = measure(profile.retrieval_sizes, profile.retrieval_batch, args.runs, only)
    profiles.write_result(
        args.out,
        {"profile": profile.name, "xla_flags": os.environ.get("XLA_FLAGS", ""), "topk": rows},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
