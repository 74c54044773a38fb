"""Benchmark: candidates scored per second, original-style runner vs jitted vs our engine.

Run: ``make bench-engine`` or ``python -m bench.bench_engine`` (``--quick`` for a short
run). Prints a table and writes ``bench/results/engine.json``. Mini config (emb 128,
4 layers, 4 heads, key 32, history 127), one user, float32 on CPU; random non-degenerate weights.
"""

# ruff: noqa: B023  (the timed closures run inside the loop iteration that defines them)

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.flops import flops_per_candidate, flops_per_context
from phoenix.command_line import command_parser
from phoenix.engine import RankingEngine, RetrievalEngine, example_inputs
from phoenix.grok import TransformerConfig
from phoenix.recsys_model import PhoenixModelConfig
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig
from phoenix.runners import ModelRunner, RecsysInferenceRunner, RetrievalModelRunner
from phoenix.serving.contracts import RANKER_CANDIDATE_BUCKETS

RESULTS = Path(__file__).parent / "results"
ORIGINAL_CHUNK = 64


def mini_transformer() -> TransformerConfig:
    return TransformerConfig(
        emb_size=128,
        key_size=32,
        num_q_heads=4,
        num_kv_heads=4,
        num_layers=4,
        widening_factor=2.0,
        attn_output_multiplier=0.125,
    )


def random_params(params, seed=0):
    """Replace (zero-initialised) parameters by scaled normal draws; norm scales near 1."""
    rng = np.random.default_rng(seed)

    def draw(x):
        if x.ndim == 2:
            return jnp.asarray(rng.normal(size=x.shape) / np.sqrt(x.shape[0]), jnp.float32)
        return jnp.asarray(1 + 0.1 * rng.normal(size=x.shape), jnp.float32)

    return jax.tree_util.tree_map(draw, params)


def timed(fn, min_seconds: float, min_runs: int = 3) -> float:
    """Median seconds per call of ``fn`` (called once before timing)."""
    fn()
    times = []
    start = time.perf_counter()
    while len(times) < min_runs or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def timed_side_by_side(fns: dict, min_seconds: float, rounds: int = 7) -> dict:
    """Median seconds per call of each of ``fns``, timed in alternating rounds so that load
    drifting on a shared machine affects them alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            calls = 0
            while calls < 2 or time.perf_counter() - start < min_seconds / rounds:
                fn()
                calls += 1
            times[name].append((time.perf_counter() - start) / calls)
    return {name: float(np.median(t)) for name, t in times.items()}


def split_candidates(batch, emb, start, stop):
    """Candidate window [start, stop) of a one-user request, padded to ORIGINAL_CHUNK."""
    from phoenix.engine.batching import pad_axis

    cut = lambda x: None if x is None else pad_axis(np.asarray(x)[:, start:stop], 1, ORIGINAL_CHUNK)  # noqa: E731
    b = batch._replace(
        candidate_post_hashes=cut(batch.candidate_post_hashes),
        candidate_author_hashes=cut(batch.candidate_author_hashes),
        candidate_product_surface=cut(batch.candidate_product_surface),
    )
    e = type(emb)(
        user_embeddings=emb.user_embeddings,
        history_post_embeddings=emb.history_post_embeddings,
        history_author_embeddings=emb.history_author_embeddings,
        candidate_post_embeddings=cut(emb.candidate_post_embeddings),
        candidate_author_embeddings=cut(emb.candidate_author_embeddings),
    )
    return b, e


def random_device_ranker(config, params, candidate_buckets, batch_buckets=(1,), vocab=1000):
    """A DeviceRanker over ``params`` with random hash functions and a random stacked table."""
    from phoenix.engine.device_ranking import DeviceRanker
    from phoenix.hashing import NUM_RESERVED_ROWS, EntityHash

    rng = np.random.default_rng(5)
    counts = {"user": 2, "item": 2, "author": 2}
    entities, offset = {}, NUM_RESERVED_ROWS
    for name, hashes in counts.items():
        entities[name] = EntityHash(
            scales=rng.integers(1, 2**61, hashes), biases=rng.integers(0, 2**61, hashes),
            modulus=2**61 - 1, vocab_size=vocab, table_offset=offset,
        )  # fmt: skip
        offset += vocab
    table = rng.normal(scale=0.3, size=(offset, config.emb_size)).astype(np.float32)
    weights = np.zeros(config.num_actions, np.float32)
    weights[:4] = 1.0
    return DeviceRanker(
        config, params, table, entities, weights, compute_dtype=config.fprop_dtype,
        batch_buckets=batch_buckets, candidate_buckets=candidate_buckets,
    )  # fmt: skip


def random_request_batch(config, users: int, candidates: int, seed: int = 0):
    """Raw ids and features of ``users`` full histories and ``candidates`` each."""
    from phoenix.engine.device_ranking import empty_request_batch

    rng = np.random.default_rng(seed)
    ids = lambda *shape: rng.integers(1, 2**62, shape, dtype=np.int64)  # noqa: E731
    S = config.history_seq_len
    return empty_request_batch(users, candidates, config)._replace(
        user_id=ids(users),
        history_post_ids=ids(users, S),
        history_author_ids=ids(users, S),
        history_actions=(rng.random((users, S, config.num_actions)) > 0.7).astype(np.float32),
        candidate_post_ids=ids(users, candidates),
        candidate_author_ids=ids(users, candidates),
    )


def bench_ranking(counts, min_seconds, skip_eager_above):
    config = PhoenixModelConfig(
        model=mini_transformer(),
        emb_size=128,
        num_actions=19,
        history_seq_len=127,
        candidate_seq_len=ORIGINAL_CHUNK,
        fprop_dtype=jnp.float32,
    )
    runner = RecsysInferenceRunner(ModelRunner(model=config, bs_per_device=0.125), name="bench")
    runner.initialize()
    runner.params = random_params(runner.params)
    jitted_rank = jax.jit(runner.rank_candidates)
    engine = RankingEngine(
        config, runner.params, batch_buckets=(1,), candidate_buckets=RANKER_CANDIDATE_BUCKETS
    )
    engine.warm_up()
    device = random_device_ranker(config, runner.params, tuple(counts))

    rows = []
    for count in counts:
        batch, emb = example_inputs(config, 1, count, seed=count)
        windows = [
            split_candidates(batch, emb, s, min(count, s + ORIGINAL_CHUNK))
            for s in range(0, count, ORIGINAL_CHUNK)
        ]

        def original():
            for b, e in windows:
                jax.block_until_ready(runner.rank(b, e).scores)

        def original_jit():
            for b, e in windows:
                jax.block_until_ready(jitted_rank(runner.params, b, e).scores)

        row = {"candidates": count}
        if count <= skip_eager_above:
            row["original_s"] = timed(original, min_seconds, 1)
        requests = random_request_batch(config, 1, count, seed=count)
        side_by_side = timed_side_by_side(
            {
                "original_jit_s": original_jit,
                "engine_s": lambda: engine.score(batch, emb),
                # from raw ids: hashing, lookups, both passes, blend and sort included
                "device_ranker_s": lambda: device.rank(requests),
            },
            2 * min_seconds,
        )
        row.update(side_by_side)
        flops = flops_per_context(config) + count * flops_per_candidate(config)
        row["engine_gflops"] = flops / row["engine_s"] / 1e9
        for key in ("original_s", "original_jit_s", "engine_s", "device_ranker_s"):
            if key in row:
                row[key.replace("_s", "_cands_per_s")] = count / row[key]
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_matmul(min_seconds, n=2048):
    a = jnp.asarray(np.random.default_rng(0).normal(size=(n, n)), jnp.float32)
    mm = jax.jit(lambda x, y: x @ y)
    seconds = timed(lambda: mm(a, a).block_until_ready(), min_seconds)
    return 2 * n**3 / seconds / 1e9


def bench_retrieval(sizes, min_seconds, batch=16):
    config = PhoenixRetrievalModelConfig(
        model=mini_transformer(),
        emb_size=128,
        history_seq_len=127,
        candidate_seq_len=64,
        fprop_dtype=jnp.float32,
    )
    runner = RetrievalModelRunner(model=config, bs_per_device=0.125)
    runner.initialize()
    b, e = example_inputs(config, 1, 1)
    params = random_params(runner.load_or_init(b, e, jnp.zeros((4, 128)), 2).params)
    engine = RetrievalEngine(config, params)
    rng = np.random.default_rng(1)
    users, _ = example_inputs(config, batch, 1, seed=2)
    rows = []
    for size in sizes:
        corpus = rng.normal(size=(size, 128)).astype(np.float32)
        corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
        engine.set_corpus(corpus)
        user_vectors = engine.encode_users(users, _)

        def query():
            engine.top_k(user_vectors, 100)

        def encode_and_query():
            engine.top_k(engine.encode_users(users, _), 100)

        row = {
            "corpus": size,
            "batch": batch,
            "top_k": 100,
            "top_k_queries_per_s": batch / timed(query, min_seconds),
            "end_to_end_queries_per_s": batch / timed(encode_and_query, min_seconds),
        }
        rows.append(row)
        print(row, flush=True)
    return rows


def print_table(ranking, matmul_gflops, retrieval):
    print("\nRanking, one user, history 127, mini config, float32 CPU (candidates / second)")
    print(
        f"{'cands':>6} {'original':>10} {'orig+jit':>10} {'engine':>10} "
        f"{'x original':>11} {'x jit':>7} {'GFLOP/s':>8} {'% matmul':>9} "
        f"{'device':>10} {'dev x jit':>9}"
    )
    for r in ranking:
        orig = r.get("original_cands_per_s")
        print(
            f"{r['candidates']:>6} {orig or float('nan'):>10.0f} "
            f"{r['original_jit_cands_per_s']:>10.0f} "
            f"{r['engine_cands_per_s']:>10.0f} "
            f"{(r['engine_cands_per_s'] / orig) if orig else float('nan'):>11.1f} "
            f"{r['engine_cands_per_s'] / r['original_jit_cands_per_s']:>7.1f} "
            f"{r['engine_gflops']:>8.1f} {100 * r['engine_gflops'] / matmul_gflops:>8.0f}% "
            f"{r['device_ranker_cands_per_s']:>10.0f} "
            f"{r['device_ranker_cands_per_s'] / r['original_jit_cands_per_s']:>9.1f}"
        )
    print("device: DeviceRanker from raw ids (hashing, lookups, both passes, blend, sort)")
    print(f"float32 2048x2048 matmul: {matmul_gflops:.1f} GFLOP/s (ceiling)")
    print("\nRetrieval, batch of 16 users, top 100")
    for r in retrieval:
        print(
            f"corpus {r['corpus']:>8}: top-k {r['top_k_queries_per_s']:>8.0f} q/s, "
            f"user tower + top-k {r['end_to_end_queries_per_s']:>8.0f} q/s"
        )


def main():
    parser = command_parser("python -m bench.bench_engine", __doc__)
    parser.add_argument("--quick", action="store_true", help="short timings, smaller corpus")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine.json")
    args = parser.parse_args()
    min_seconds = 0.5 if args.quick else 2.0
    ranking = bench_ranking([64, 256, 1024], min_seconds, skip_eager_above=1024)
    matmul = bench_matmul(min_seconds)
    retrieval = bench_retrieval([100_000] if args.quick else [100_000, 1_000_000], min_seconds)
    print_table(ranking, matmul, retrieval)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": {
                    "backend": jax.default_backend(),
                    "devices": str(jax.devices()),
                    "cpu_count": __import__("os").cpu_count(),
                    "platform": platform.platform(),
                },
                "ranking": ranking,
                "matmul_gflops": matmul,
                "retrieval": retrieval,
            },
            indent=2,
        )
    )
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
