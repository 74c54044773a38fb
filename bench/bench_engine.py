"""Benchmark: candidates scored per second, original-style runner vs jitted vs our engine.

Run: ``make bench-engine`` or ``python -m bench.bench_engine`` (``--quick`` for a short
run). Prints a table and writes ``bench/results/engine.json``. Mini config (emb 128,
4 layers, 4 heads, key 32, history 127), one user, float32 on CPU; random non-degenerate weights.

``--only corpus-encodings`` runs only the float vs int8 corpus comparison of exact retrieval,
on the trained demo's towers (``artifacts/trained-demo``), and updates its part of the file.
"""

# ruff: noqa: B023  (the timed closures run inside the loop iteration that defines them)

from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from bench.flops import flops_per_candidate, flops_per_context
from harness.machine import machine as described
from harness.results import write_results
from phoenix.artifacts import PRESETS, preset_config
from phoenix.engine import DeviceRanker, RetrievalEngine, example_inputs
from phoenix.grok import TrainingState, TransformerConfig
from phoenix.recsys_model import PhoenixModelConfig
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig
from phoenix.runners import ModelRunner, RecsysInferenceRunner, RetrievalModelRunner
from phoenix.schema.contracts import RANKER_CANDIDATE_BUCKETS
from phoenix.util.command_line import command_parser

RESULTS = Path(__file__).parent / "results"
TRAINED_DEMO = Path(__file__).parents[1] / "artifacts" / "trained-demo"
ORIGINAL_CHUNK = 64


def mini_transformer() -> TransformerConfig:
    """The published mini shapes (emb 128, 4 layers, 4 heads of 32), as artifacts' "mini"."""
    return preset_config(PRESETS["mini"], seed=0).transformer_config()


def random_params(params, seed=0):
    """Scaled normal draws of the shapes of ``params`` (arrays or ``jax.ShapeDtypeStruct``s);
    norm scales near 1."""
    rng = np.random.default_rng(seed)

    def draw(x):
        if x.ndim == 2:
            return jnp.asarray(rng.normal(size=x.shape) / np.sqrt(x.shape[0]), jnp.float32)
        return jnp.asarray(1 + 0.1 * rng.normal(size=x.shape), jnp.float32)

    return jax.tree_util.tree_map(draw, params)


class GivenWeightsRunner(ModelRunner):
    """The original's ranking runner holding given weights: its own init draws every weight op
    by op (5 s a config on a 2-core CPU) only for a benchmark to replace them."""

    def __init__(self, model: PhoenixModelConfig, params, bs_per_device: float = 0.125):
        super().__init__(model=model, bs_per_device=bs_per_device)
        self.given_params = params

    def init(self, rng, data, embeddings) -> TrainingState:
        return TrainingState(params=self.given_params)


def original_with_weights(config: PhoenixModelConfig, params) -> RecsysInferenceRunner:
    """The original's inference runner for ``config``, initialised with ``params``."""
    runner = RecsysInferenceRunner(GivenWeightsRunner(config, params), name="original")
    runner.initialize()
    return runner


def random_ranker_weights(config: PhoenixModelConfig):
    """``random_params`` of the shapes the original's ranking init gives for ``config``, read
    with ``jax.eval_shape``: the same draws as from an initialised runner's weights."""
    runner = RecsysInferenceRunner(ModelRunner(model=config, bs_per_device=0.125), name="shapes")
    runner.runner.initialize()
    batch, embeddings = runner.create_dummy_batch(1), runner.create_dummy_embeddings(1)
    state = jax.eval_shape(runner.runner.init, jax.random.PRNGKey(0), batch, embeddings)
    return random_params(state.params)


def timed(fn, min_seconds: float, min_runs: int = 3) -> float:
    """Median seconds per call of ``fn`` (called once before timing)."""
    fn()
    times: list[float] = []
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
    times: dict[str, list[float]] = {name: [] for name in fns}
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


def random_device_ranker(
    config, params, candidate_buckets, batch_buckets=(1,), vocab=1000, joint_rows=None
):
    """A DeviceRanker over ``params`` with random hash functions and a random stacked table."""
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
        batch_buckets=batch_buckets, candidate_buckets=candidate_buckets, joint_rows=joint_rows,
    )  # fmt: skip


def random_request_batch(config, users: int, candidates: int, seed: int = 0):
    """Raw ids and features of ``users`` full histories and ``candidates`` each."""
    from phoenix.stub.services.ranker import empty_request_batch

    rng = np.random.default_rng(seed)
    ids = lambda *shape: rng.integers(1, 2**62, shape, dtype=np.int64)  # noqa: E731
    S = config.history_seq_len
    return empty_request_batch(config, users, candidates)._replace(
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
    runner = original_with_weights(config, random_ranker_weights(config))
    jitted_rank = jax.jit(runner.rank_candidates)
    engine = DeviceRanker(
        config, runner.params, batch_buckets=(1,), candidate_buckets=RANKER_CANDIDATE_BUCKETS
    )
    engine.warm_up_score()
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


def random_retrieval_engine(**options) -> tuple[RetrievalEngine, PhoenixRetrievalModelConfig]:
    """A RetrievalEngine of the mini config with random weights (``options`` to the engine)."""
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
    # the init's shapes only (an eager init draws every weight op by op, seconds on a CPU)
    init = functools.partial(runner.init, top_k=2)
    state = jax.eval_shape(init, jax.random.PRNGKey(0), b, e, jnp.zeros((4, 128)))
    params = random_params(state.params)
    return RetrievalEngine(config, params, **options), config


def bench_retrieval(sizes, min_seconds, batch=16, **engine_options):
    engine, config = random_retrieval_engine(**engine_options)
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


def trained_retrieval_inputs(posts: int, users: int, artifacts: Path = TRAINED_DEMO, seed: int = 1):
    """Inputs of exact retrieval from the trained demo's towers, not random vectors (int8's
    error depends on how the vectors spread): the candidate tower's unit vectors [P, D] of
    ``posts`` posts of the demo's world, the user tower's [U, D] of ``users`` of its users,
    each with a history of posts drawn from their topics of interest, and those histories as
    corpus indices [U, S] (what the retriever excludes). bench/retrieval_data makes them."""
    from bench.retrieval_data import generator_posts, query_users

    world, corpus = generator_posts(artifacts, posts)
    user_vectors, history = query_users(artifacts, world, users, seed)
    return corpus.embeddings, user_vectors, history


def retrieve_all(engine, users, history, k, batch, excluded=True):
    """Top-k ids [U, k] of every user, ``batch`` users per call, their history excluded."""
    calls = range(0, len(users), batch)
    seen = lambda s: list(history[s : s + batch]) if excluded else None  # noqa: E731
    return np.concatenate([engine.top_k(users[s : s + batch], k, None, seen(s))[0] for s in calls])


def bench_corpus_encodings(posts, min_seconds, batch=16, users=512, k=100):
    """Exact top-k with a float32 corpus against int8 codes + exact re-ranking, side by side:
    queries per second, and the int8 results' recall@k against the float32 ones."""
    from bench.retrieval_data import recall_at_k
    from phoenix.stub.services.resources import PhoenixResources

    start = time.perf_counter()
    corpus, user_vectors, history = trained_retrieval_inputs(posts, users)
    print(f"trained demo inputs: {time.perf_counter() - start:.0f} s", flush=True)
    config = PhoenixResources(TRAINED_DEMO, ("retrieval",)).config.retrieval_config()
    engines = {
        encoding: RetrievalEngine(
            config, {}, batch_buckets=(batch,), corpus_encoding=encoding
        )  # top-k reads no tower weights
        for encoding in ("float", "int8")
    }
    found = {}  # [encoding][history excluded] -> ids [U, k]
    for encoding, engine in engines.items():
        engine.set_corpus(corpus)
        engine.warm_up_top_k()
        found[encoding] = {
            excluded: retrieve_all(engine, user_vectors, history, k, batch, excluded)
            for excluded in (True, False)
        }
    calls = [
        (user_vectors[s : s + batch], list(history[s : s + batch])) for s in range(0, users, batch)
    ]
    turn = {encoding: 0 for encoding in engines}

    def query(encoding):
        def call():  # the next 16 users, their histories excluded (as the retriever does)
            users_, seen = calls[turn[encoding] % len(calls)]
            turn[encoding] += 1
            engines[encoding].top_k(users_, k, exclude_indices=seen)

        return call

    seconds = timed_side_by_side({e: query(e) for e in engines}, 2 * min_seconds)
    int8 = engines["int8"]
    row = {
        "corpus": posts,
        "batch": batch,
        "top_k": k,
        "users": users,
        "vectors": "trained-demo towers: make_world posts, users' histories (excluded)",
        "float_queries_per_s": batch / seconds["float"],
        "int8_queries_per_s": batch / seconds["int8"],
        "int8_speedup": seconds["float"] / seconds["int8"],
        "int8_rerank_margin": int8.rerank_margin,
        "int8_candidates_rescored": int8._device_k(k),
        "int8_recall_at_k": recall_at_k(found["int8"][True], found["float"][True]),
        "int8_recall_at_k_no_exclusions": recall_at_k(found["int8"][False], found["float"][False]),
        # share of (user, rank) holding the same id: the rest are swaps of scores equal to
        # float32 rounding, summed in another order by the re-ranking
        "int8_same_position": float(np.mean(found["int8"][True] == found["float"][True])),
        "machine": machine(),  # this part may be run alone (--only), on another machine
    }
    print(row, flush=True)
    return [row]


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


def print_encodings(rows):
    print("\nExact retrieval, float32 corpus vs int8 codes + exact re-ranking (trained towers)")
    for r in rows:
        print(
            f"corpus {r['corpus']:>8}, {r['batch']} users, top {r['top_k']}: "
            f"float32 {r['float_queries_per_s']:.0f} q/s, int8 {r['int8_queries_per_s']:.0f} "
            f"q/s (x{r['int8_speedup']:.2f}), recall@{r['top_k']} {r['int8_recall_at_k']:.4f}"
        )


def machine() -> dict:
    return {"backend": jax.default_backend(), "devices": str(jax.devices()), **described()}


def main():
    parser = command_parser("python -m bench.bench_engine", __doc__)
    parser.add_argument("--quick", action="store_true", help="short timings, smaller corpus")
    parser.add_argument("--out", type=Path, default=RESULTS / "engine.json")
    parser.add_argument(
        "--only",
        choices=("corpus-encodings",),
        help="run this part alone and replace only its results in --out",
    )
    args = parser.parse_args()
    min_seconds = 0.5 if args.quick else 2.0
    encodings_corpus = 100_000 if args.quick else 1_000_000
    if args.only == "corpus-encodings":
        encodings = bench_corpus_encodings(encodings_corpus, min_seconds)
        print_encodings(encodings)
        results = json.loads(args.out.read_text()) if args.out.exists() else {}
        results["retrieval_corpus_encodings"] = encodings
        write_results(args.out, results)
        print(f"\nwrote {args.out}")
        return
    ranking = bench_ranking([64, 256, 1024], min_seconds, skip_eager_above=1024)
    matmul = bench_matmul(min_seconds)
    retrieval = bench_retrieval([100_000] if args.quick else [100_000, 1_000_000], min_seconds)
    encodings = bench_corpus_encodings(encodings_corpus, min_seconds)
    print_table(ranking, matmul, retrieval)
    print_encodings(encodings)
    results = {
        "machine": machine(),
        "ranking": ranking,
        "matmul_gflops": matmul,
        "retrieval": retrieval,
        "retrieval_corpus_encodings": encodings,
    }
    write_results(args.out, results)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
