"""Index designs for the corpus store compared side by side on the same posts and users:
recall@100 per kind of user and queries/s, measured interleaved (one pass of each design in
turn, best of the passes) so that load from other work on the machine hits each alike.

Every design probes the same lists per user (phoenix.corpus_store.ann's adaptive probing over
one shared coarse quantizer) and re-scores its candidates exactly from the float vectors; they
differ in how a list is scanned (8-bit codes, 4-bit fast-scan PQ), in how many candidates
are re-scored, and in how many lists hold a post (``+spill``: two, ``ann.spill_lists``; such a
design may scale the lists probed, a third field: ``pq64x4fs+spill:1000:0.5`` probes half).

Run: ``python -m bench.compare_ann --posts 1000000`` (the posts and users are cached under
--work, keyed by the count). Writes a JSON of the table to --out.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.retrieval_data import TRAINED, generator_posts
from harness.recall import exact_top_k, recall_per_user, recall_summary
from harness.user_kinds import KINDS, users_of_kinds
from phoenix.checkpoint import load_config
from phoenix.corpus_store import ann
from phoenix.corpus_store.snapshot import first_of_each
from phoenix.util.command_line import command_parser

USERS_PER_CALL = 16
TOP_K = 100


def cached_inputs(work: Path, posts: int, queries: int):
    """(embeddings [N, D], {kind: users [Q, D]}, {kind: exact top rows [Q, k]}), cached."""
    path = work / f"inputs-{posts}-{queries}.npz"
    if not path.is_file():
        world, stored = generator_posts(TRAINED, posts)
        history_len = load_config(TRAINED).history_seq_len
        kinds = users_of_kinds(TRAINED, world, queries, history_len)
        exact = {k: exact_top_k(stored.embeddings, kinds[k], TOP_K) for k in KINDS}
        work.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            embeddings=stored.embeddings,
            **{f"users_{k}": v for k, v in kinds.items()},
            **{f"exact_{k}": v for k, v in exact.items()},
        )
    data = np.load(path)
    users = {k: data[f"users_{k}"] for k in KINDS}
    exact = {k: data[f"exact_{k}"] for k in KINDS}
    return data["embeddings"], users, exact


def build(kind: str, embeddings: np.ndarray, quantizer, spec):
    """An IVF index of ``kind`` ("sq8", "pqMx4fs" or "pqMx4fs+spill") over the trained
    ``quantizer``'s lists (an empty one: trained here as the store trains ``spec``'s)."""
    import faiss

    dim = embeddings.shape[1]
    spilled = kind.endswith("+spill")
    index: faiss.IndexIVF
    if kind == "sq8":
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, dim, spec.nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
    else:
        m = int(kind[2:].split("x")[0])
        plain_or_fast = faiss.IndexIVFPQ if spilled else faiss.IndexIVFPQFastScan
        index = plain_or_fast(quantizer, dim, spec.nlist, m, 4, faiss.METRIC_INNER_PRODUCT)
    ann.train_index(index, embeddings, spec)
    if spilled:
        return ann.fill_spilled(index, embeddings)
    for start in range(0, len(embeddings), 1 << 20):
        index.add(np.ascontiguousarray(embeddings[start : start + (1 << 20)]))
    return index


def searcher(index, spec, columns, embeddings, candidates: int):
    """search(users [B, D]) -> rows [B, TOP_K]: the index's ``candidates`` best re-scored."""

    def search(users):
        _, rows = ann.search_index(index, spec, users, candidates, None, columns)
        scores = ann.scores_of_rows(embeddings, users, rows)  # [B, c], as the store re-scores
        scores[~first_of_each(rows + 1)] = -np.inf  # a spilled post found twice: once (-1: 0)
        best = np.argpartition(-scores, TOP_K - 1, axis=1)[:, :TOP_K]
        return np.take_along_axis(rows, best, 1)

    return search


def parse_design(text: str) -> tuple[str, int, float]:
    """ "index:candidates[:probe scale]" -> (index, candidates, scale of the lists probed)."""
    kind, candidates, *scale = text.split(":")
    return kind, int(candidates), float(scale[0]) if scale else 1.0


def design_name(kind: str, candidates: int, probes: float) -> str:
    return f"{kind}:{candidates}" + ("" if probes == 1.0 else f":{probes:g}")


def run_all(search, users: np.ndarray) -> list:
    found = []
    for start in range(0, len(users), USERS_PER_CALL):
        found += list(search(users[start : start + USERS_PER_CALL]))
    return found


def main(argv=None) -> int:
    import faiss

    parser = command_parser(
        "python -m bench.compare_ann",
        "Index designs of the corpus store side by side: recall@100 per kind, queries/s.",
        "Example:\n  python -m bench.compare_ann --posts 1000000 --designs sq8:200,pq32x4fs:1000",
    )
    parser.add_argument("--posts", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=256, help="users per kind")
    parser.add_argument(
        "--designs",
        default="sq8:200,pq32x4fs:500,pq32x4fs:1000,pq64x4fs:300,pq64x4fs:600",
        help="index:candidates re-scored, comma-separated",
    )
    parser.add_argument("--threads", default="2", help="Faiss OpenMP threads to try, e.g. 1,2")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path("build/fastann"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    embeddings, users, exact = cached_inputs(args.work, args.posts, args.queries)
    spec = ann.choose_index(args.posts, embeddings.shape[1])
    coarse = build("sq8", embeddings, faiss.IndexFlatIP(embeddings.shape[1]), spec)
    centroids = ann.centroids_of(coarse)
    columns = ann.centroid_columns(coarse)  # [D, nlist], as the store scores them
    indexes, built_s = {"sq8": coarse}, {}
    designs = [parse_design(d) for d in args.designs.split(",")]
    for kind, _, _ in designs:
        if kind not in indexes:
            quantizer = faiss.IndexFlatIP(embeddings.shape[1])
            quantizer.add(centroids)
            started = time.perf_counter()
            indexes[kind] = build(kind, embeddings, quantizer, spec)
            built_s[kind] = round(time.perf_counter() - started, 1)
    everyone = np.concatenate([users[k] for k in KINDS])
    table: dict[str, dict[str, Any]] = {}
    for kind, candidates, probes in designs:
        probing = ann.scaled_probing(spec, probes)
        search = searcher(indexes[kind], probing, columns, embeddings, candidates)
        by_kind = {}
        for user_kind in KINDS:
            got = recall_summary(
                recall_per_user(run_all(search, users[user_kind]), exact[user_kind])
            )
            by_kind[user_kind] = [round(got["mean"], 4), round(got["worst_decile"], 4)]
        name = design_name(kind, candidates, probes)
        table[name] = {"recall": by_kind, "queries_per_s": {}}
        print(f"{name} recall (mean, worst decile) {by_kind}", flush=True)
    for threads in [int(t) for t in args.threads.split(",")]:
        faiss.omp_set_num_threads(threads)
        best = {name: np.inf for name in table}
        for _ in range(args.passes):
            for kind, candidates, probes in designs:
                probing = ann.scaled_probing(spec, probes)
                search = searcher(indexes[kind], probing, columns, embeddings, candidates)
                started = time.perf_counter()
                run_all(search, everyone)
                seconds = time.perf_counter() - started
                name = design_name(kind, candidates, probes)
                best[name] = min(best[name], seconds)
        for name in table:
            table[name]["queries_per_s"][threads] = round(len(everyone) / best[name], 1)
            print(f"{name} threads {threads}: {table[name]['queries_per_s'][threads]} q/s")
    result = {"posts": args.posts, "spec": spec.to_dict(), "built_s": built_s, "designs": table}
    print(json.dumps(result))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
