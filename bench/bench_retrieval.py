"""Benchmark: retrieval over a corpus store of 1 M and 10 M posts on this CPU.

Posts of the project's synthetic world embedded by the trained demo towers
(artifacts/trained-demo), users of that world encoded by its user tower (bench/retrieval_data).
Per corpus size it reports: the store's build time (embedding, index), recall@100 of the store's
search against exact float32 search per kind of user (one topic, two or three topics, the whole
corpus, new users with 0-3 posts, users whose recent posts moved topic: mean and worst decile;
phoenix/training/user_kinds), queries/s at 16 users per call (the ANN store, and the
exact engine where the corpus is small enough), and the memory two serving instances that map
the same store use together (PSS: shared pages counted once between them).

Run: ``make bench-retrieval`` (1 M and 10 M, about 10 minutes on 2 cores) or
``python -m bench.bench_retrieval --sizes 100000`` for a short run. Writes
``bench/results/retrieval.json`` and ``.png``.
"""

from __future__ import annotations

import os

# One OpenBLAS thread, as served instances run (phoenix/ops/triton_server.py), set before
# numpy loads it: at its default of one per core its spinning threads cost the small centroid
# product up to 10x on 2 cores (docs/retrieval.md). Without it, a process searching the 1 M
# store 16 users a call ran 823-886 q/s against 1,376-1,630 (2026-11-27, docs/retrieval.md).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.retrieval_data import TRAINED, exact_top_k, generator_posts
from harness.machine import faiss_build, machine
from harness.memory import memory_bytes
from harness.recall import recall_per_user, recall_summary
from harness.results import write_results
from harness.user_kinds import KINDS, users_of_kinds
from phoenix.checkpoint import load_config
from phoenix.corpus_store import SEALED, CorpusStore, StoreFollower
from phoenix.util.command_line import command_parser

RESULTS = Path(__file__).parent / "results"
WORK = Path("build/bench-retrieval")
USERS_PER_CALL = 16
TOP_K = 100
EXACT_MAX_ROWS = 1_000_000  # the exact engine beyond this takes minutes per size
TARGET_QUERIES_PER_S = {1_000_000: 2_500, 10_000_000: 1_000}  # docs/retrieval.md, 16 users a call


def per_second(run, queries: int, repeats: int = 3) -> float:
    """Best queries/s of ``run()`` (which answers ``queries`` users) over ``repeats``."""
    run()  # first pass: pages mapped, programs compiled
    best = min(_seconds(run) for _ in range(repeats))
    return queries / best


def _seconds(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def search_all(snapshot, users: np.ndarray) -> list:
    """Each user's post ids, searched USERS_PER_CALL users per call."""
    found = []
    for start in range(0, len(users), USERS_PER_CALL):
        found += snapshot.search(users[start : start + USERS_PER_CALL], TOP_K).post_ids
    return found


def exact_engine_rate(embeddings: np.ndarray, users: np.ndarray) -> dict:
    """The exact engine (the reference retriever over a corpus file) on the same corpus."""
    from phoenix.stub.services.resources import PhoenixResources
    from phoenix.stub.services.retrieval import retrieval_engine

    resources = PhoenixResources(TRAINED, ("retrieval",))
    engine = retrieval_engine(resources, batch_buckets=(USERS_PER_CALL,))
    engine.set_corpus(embeddings)

    def run():
        for start in range(0, len(users), USERS_PER_CALL):
            engine.top_k(users[start : start + USERS_PER_CALL], TOP_K)

    return {"queries_per_s": round(per_second(run, len(users), repeats=2), 1)}


def two_instances_memory(store: Path, users_file: Path) -> dict:
    """Memory of two processes that follow the store and search it, measured while both run."""
    command = [sys.executable, "-m", "bench.bench_retrieval", "--instance", str(store)]
    procs = [
        subprocess.Popen(
            [*command, "--users", str(users_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None  # PIPE both
        assert proc.stdout.readline().strip() == "ready"
    reports = []
    for proc in procs:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("report\n")
        proc.stdin.flush()
        reports.append(json.loads(proc.stdout.readline()))
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    total = lambda key: round(sum(r[key] for r in reports) / 2**30, 3)  # noqa: E731
    return {"pss_gib": total("pss"), "rss_gib": total("rss"), "uss_gib": total("uss")}


def serve_instance(store: Path, users_file: Path) -> None:
    """One 'instance': follow the store, answer every user, then report memory on request."""
    users = np.load(users_file)
    follower = StoreFollower(store, users.shape[1])
    search_all(follower.current(), users)
    print("ready", flush=True)
    sys.stdin.readline()
    print(json.dumps(memory_bytes(os.getpid())), flush=True)
    sys.stdin.readline()


def measure_size(size: int, queries: int, work: Path) -> dict:
    print(f"\n== {size:,} posts", flush=True)
    started = time.perf_counter()
    world, posts = generator_posts(TRAINED, size)
    embed_s = time.perf_counter() - started
    history_len = load_config(TRAINED).history_seq_len
    kinds = users_of_kinds(TRAINED, world, queries, history_len)  # {kind: [Q, D]}
    users = np.concatenate([kinds[kind] for kind in KINDS])  # every kind, in turn
    store_dir = work / f"store-{size}"
    shutil.rmtree(store_dir, ignore_errors=True)
    store = CorpusStore.create(store_dir, posts.embeddings.shape[1])
    started = time.perf_counter()
    entry = store.add(posts, SEALED)
    index_s = time.perf_counter() - started
    print(f"built: embedding {embed_s:.0f} s, store and index {index_s:.0f} s", flush=True)
    snapshot = store.open()
    by_kind = {}
    for kind in KINDS:
        expected = posts.post_ids[exact_top_k(posts.embeddings, kinds[kind], TOP_K)]  # [Q, k]
        recall = recall_summary(recall_per_user(search_all(snapshot, kinds[kind]), expected))
        rate = per_second(lambda u=kinds[kind]: search_all(snapshot, u), queries, repeats=2)
        by_kind[kind] = {
            "recall_at_100": round(recall["mean"], 4),
            "worst_decile": round(recall["worst_decile"], 4),
            "queries_per_s": round(rate, 1),
        }
        print(f"  {kind}: {by_kind[kind]}", flush=True)
    row = {
        "posts": size,
        "index": entry.index.to_dict(),
        "build_s": {"embed": round(embed_s, 1), "index": round(index_s, 1)},
        "store": {
            "recall_at_100": round(
                float(np.mean([r["recall_at_100"] for r in by_kind.values()])), 4
            ),
            "worst_decile": min(r["worst_decile"] for r in by_kind.values()),
            "queries_per_s": round(per_second(lambda: search_all(snapshot, users), len(users)), 1),
            "by_kind": by_kind,
        },
    }
    if size <= EXACT_MAX_ROWS:
        row["exact_engine"] = exact_engine_rate(posts.embeddings, users)
    users_file = work / f"users-{size}.npy"
    np.save(users_file, users)
    row["two_instances"] = two_instances_memory(store_dir, users_file)
    print(json.dumps(row), flush=True)
    return row


def plot(rows: list, path: Path, machine_info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, recall, memory) = plt.subplots(1, 3, figsize=(15, 4))
    labels = [f"{r['posts'] / 1e6:g} M" for r in rows]
    x = np.arange(len(rows))
    rate.bar(x - 0.2, [r["store"]["queries_per_s"] for r in rows], 0.4, label="store (ANN)")
    rate.bar(
        x + 0.2,
        [r.get("exact_engine", {}).get("queries_per_s", 0) for r in rows],
        0.4,
        label="exact engine",
    )
    for i, r in enumerate(rows):
        rate.annotate(
            f"recall {r['store']['recall_at_100']:.3f}",
            (i - 0.2, 0),
            ha="center",
            va="bottom",
            fontsize=8,
            rotation=90,
        )
        target = TARGET_QUERIES_PER_S.get(r["posts"])
        if target:
            rate.hlines(target, i - 0.4, i + 0.4, color="grey", linestyle="--", linewidth=1)
            rate.annotate(
                f"target {target:,}", (i + 0.4, target), ha="right", va="bottom", fontsize=8
            )
    rate.set(xticks=x, xticklabels=labels, ylabel="queries/s (16 users per call, top 100)")
    rate.legend()
    width = 0.8 / len(KINDS)
    for j, kind in enumerate(KINDS):
        at = x - 0.4 + (j + 0.5) * width
        kinds = [r["store"]["by_kind"][kind] for r in rows]
        recall.bar(at, [k["recall_at_100"] for k in kinds], width, label=kind)
        recall.scatter(at, [k["worst_decile"] for k in kinds], color="black", marker="_", s=80)
    recall.axhline(0.95, color="grey", linestyle="--", linewidth=1)
    recall.axhline(0.9, color="grey", linestyle=":", linewidth=1)
    recall.set(
        xticks=x,
        xticklabels=labels,
        ylim=(0.5, 1.0),
        ylabel="recall@100 by kind (bar: mean, -: worst 10%)",
    )
    recall.legend(fontsize=7, loc="lower left")
    memory.bar(x, [r["two_instances"]["pss_gib"] for r in rows])
    memory.axhline(8, color="grey", linestyle="--", linewidth=1)
    memory.set(xticks=x, xticklabels=labels, ylabel="GiB, two instances together (PSS)")
    fig.suptitle(
        "Retrieval over a corpus store: "
        f"{machine_info['cpu_model']}, {machine_info['simd']}, {machine_info['cpus']} cores"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parse_args(argv=None) -> argparse.Namespace:
    parser = command_parser(
        "python -m bench.bench_retrieval",
        "Retrieval over a corpus store of generator posts embedded by the trained towers: "
        "build time, recall@100 against exact, queries/s, memory of two instances.",
        "Examples:\n"
        "  python -m bench.bench_retrieval                   # 1 M and 10 M posts\n"
        "  python -m bench.bench_retrieval --sizes 100000    # a short run",
    )
    parser.add_argument("--sizes", default="1000000,10000000", help="posts, comma-separated")
    parser.add_argument(
        "--queries", type=int, default=256, help="users measured per kind (%(default)s)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "retrieval.json")
    parser.add_argument("--work", type=Path, default=WORK, help="stores are built here")
    parser.add_argument("--keep", action="store_true", help="keep the stores afterwards")
    parser.add_argument("--instance", type=Path, help=argparse.SUPPRESS)  # a child process
    parser.add_argument("--users", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.instance is not None:
        serve_instance(args.instance, args.users)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    rows = [measure_size(int(s), args.queries, args.work) for s in args.sizes.split(",")]
    if not args.keep:
        for row in rows:
            shutil.rmtree(args.work / f"store-{row['posts']}", ignore_errors=True)
    result = {
        "machine": {"node": platform.node(), **machine(), "faiss": faiss_build()},
        "users_per_call": USERS_PER_CALL,
        "top_k": TOP_K,
        "queries_per_kind": args.queries,
        "user_kinds": list(KINDS),
        "sizes": rows,
    }
    write_results(args.out, result)
    plot(rows, args.out.with_suffix(".png"), result["machine"])
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
