"""ANN indexes of sealed segments (Faiss): which index a segment gets, building, reading.

An IVF index whose vectors are product-quantized into one 4-bit code per dimension, scanned by
Faiss' fast-scan (SIMD table look-ups over 32 codes at a time): on the trained demo towers'
64-d embeddings of generator posts it scanned the same lists about 2x faster than 8-bit
scalar-quantized codes, and with 10x the rows wanted re-scored in float32 kept the same recall
(docs/retrieval.md, "Choosing the index"). Each user probes as many lists as its position
needs (``lists_to_probe``: users between clusters need many more), and the index's candidates
are re-scored exactly in float32. Inner product on unit vectors is the towers' cosine score.
IVF-SQ8 segments written before still load and are searched as their entries say.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from phoenix.corpus_store.manifest import EXACT, IVF_PQ4FS, IndexSpec, StoreError

# Segments smaller than this are scored exactly: an index would save little and cost a build.
ANN_MIN_ROWS = 200_000
MAX_LISTS = 8192
TRAIN_POINTS_PER_LIST = 32  # k-means sample: Faiss asks for 39 per list, 32 is within noise
KMEANS_ITERATIONS = 10  # Faiss' default for an IVF index's lists
# A spilled segment's lists are trained on 128 posts a list for 25 iterations: at the same
# probing, whole-corpus users' worst decile rose from 0.927 to 0.945-0.952 at 1 M posts (two
# k-means seeds, two draws of users) and from 0.921-0.926 to 0.934-0.941 at 10 M; 128 posts for
# 10 iterations, or 32 or 64 for 25, changed nothing at 1 M. The recall won is spent on fewer
# lists (MEAN_PROBE_SCORE). The index build: 65 -> 218 s at 1 M, 610 -> 1,235 s at 10 M here
# (docs/retrieval.md, "Lists trained longer"); smaller segments (compacted while serving) keep
# the quick training.
SPILLED_TRAIN_POINTS_PER_LIST = 128
SPILLED_KMEANS_ITERATIONS = 25
PROBED_LISTS = 128  # lists probed per query; at most nlist / 8 on small segments
# Query-adaptive probing, fitted on trained-tower users of every kind at 1 M posts (4,096
# lists; docs/retrieval.md, "Users of every kind"): the lists a user needs for 95% of its exact
# top 100 grow as exp(-4.8 s), s its best centroid's score; PROBE_SCORE puts 1.5x that need
# (the 90th percentile of the fit) on the curve through PROBED_LISTS.
PROBE_SLOPE = 4.8
PROBE_SCORE = 0.82
MOST_PROBED_SHARE = 4  # at most a quarter of the lists
MOST_PROBED = 1024
# The index is asked for 10x the rows wanted, re-scored exactly: 4-bit codes order the flat
# top of a user's scores loosely (8x lost 0.01 of new users' worst decile at 1 M; IVF-SQ8
# needed 2x). The more rows a list holds, the more near-ties the codes blur: at 10 M (8,192
# lists) 10x left new users' worst decile at 0.85 and one-topic users' at 0.89, 20x kept every
# kind's above 0.9 (bench/results/compare_ann_10m.json), one list a post. Spilled, and probed
# by the mean score too, 12x kept every kind's mean >= 0.971 and worst decile >= 0.921 at 10 M
# (two draws of 1,280 users; 20x: >= 0.977 / 0.933) at 1.13x the queries/s of 20x.
# Segments above RERANK_ROWS get RERANK_LARGE.
RERANK = 10
RERANK_LARGE = 12
RERANK_ROWS = 1_000_000  # the largest segment 10x was measured to keep recall at
# Candidates re-scored on Faiss' threads from this many (user, row) pairs, by numpy below
# (``scores_of_rows``).
PARALLEL_SCORES = 8_000

# Spilled assignment (ScaNN's SOAR): every post also goes to a second list, the one among its
# SPILL_CANDIDATES nearest centroids whose residual is shortest once its part along the first
# residual is counted SPILL_WEIGHT more. A user between clusters, whom the first residual points
# away from, then still finds the post in the second list (``spilled_spec``; choose_index's from
# SPILL_MIN_ROWS on). At the same whole-corpus recall, Faiss and the re-rank alone ran 1.5-1.8x
# the queries/s of one list a post at 1 M and 10 M, for twice the codes; the whole
# Snapshot.search at 1 M 1.1-1.3x
# (docs/retrieval.md, "Each post in two lists"; `python -m bench.compare_ann`).
SPILL_CANDIDATES = 16
SPILL_WEIGHT = 1.0
# Measured with compare_ann (Faiss and the re-rank; docs/retrieval.md): 0.35 of the lists and
# 6x re-scored at 1 M (12x at 10 M) kept every kind at today's recall or within 0.003 of it, at
# 1.5x the rate. Through Snapshot.search at 1 M 0.35 and 6x left whole-corpus users at 0.966 /
# 0.919 against 0.977 / 0.935; 0.5 and 6x kept every kind at or above today's.
SPILL_PROBE_SHARE = 0.35
# A spilled segment's probing also weighs the user's mean score over every centroid
# (``mean_score_probing``). Fitted 2026-11-27 on the lists each of 1,280 users of five kinds
# needed for 95% of its exact top 100 at 10 M posts (at 1 M the needs follow the same pattern;
# not fitted there): the best centroid's score alone explained half the spread of log(lists
# needed), with the mean score 0.68. Users facing the
# corpus' dense middle (whole-corpus histories: mean score 0.055) needed 3x the lists of new
# users with the same best score (0.022): the old curve gave both about 190, the one-topic users
# 2.9x their 21. Through Snapshot.search at equal recall for the worst kind: 10% fewer lists.
# The score was 0.83 until the lists were trained longer (SPILLED_KMEANS_ITERATIONS): over the
# same lists 0.78 probes 18% fewer than 0.83 at 1 M and 10 M, every kind's worst decile >= 0.922
# at 10 M and >= 0.937 at 1 M (two draws of 1,280 users); 0.75 left 10 M's whole-corpus users at
# 0.911.
PROBE_MEAN_WEIGHT = 18.0
MEAN_PROBE_SLOPE = 4.0
MEAN_PROBE_SCORE = 0.78
MEAN_PROBE_LEAST_SHARE = 0.5  # of the spilled nprobe: one-topic users needed 21 of their 45
# Segments spilled by choose_index: the sizes it was measured at (1 M and 10 M); smaller ones
# keep one list a post, as measured before (a store's fresh and compacted small segments).
SPILL_MIN_ROWS = 1_000_000


def choose_index(rows: int, emb_size: int) -> IndexSpec:
    """The index of a sealed segment of ``rows`` posts: exact below ANN_MIN_ROWS, else IVF with
    about 4 sqrt(rows) lists (a power of two, at most MAX_LISTS), probed adaptively (``ivf_spec``);
    from SPILL_MIN_ROWS on, every post in two lists and SPILL_PROBE_SHARE of the lists probed
    (``spilled_spec``), by the best and the mean centroid score (``mean_score_probing``).

    Measured through ``Snapshot.search`` on trained-tower users of five kinds (make
    bench-retrieval; docs/retrieval.md, "Users of every kind", "Spilled by default" and "Probed
    by the mean score too"): recall@100 mean >= 0.95 and worst decile >= 0.9 for every kind at
    1 M and 10 M rows (4,096 and 8,192 lists; above 1 M rows RERANK_LARGE re-scored)."""
    if rows < ANN_MIN_ROWS:
        return IndexSpec(EXACT)
    nlist = min(MAX_LISTS, 2 ** round(math.log2(4 * math.sqrt(rows))))
    spec = ivf_spec(nlist, emb_size, RERANK if rows <= RERANK_ROWS else RERANK_LARGE)
    return mean_score_probing(spilled_spec(spec)) if rows >= SPILL_MIN_ROWS else spec


def ivf_spec(nlist: int, emb_size: int, rerank: int = RERANK) -> IndexSpec:
    """IVF with 4-bit fast-scan PQ codes (one per dimension of ``emb_size``) over ``nlist``
    lists, with this module's probing, ``rerank`` times the rows wanted re-scored."""
    nprobe = min(PROBED_LISTS, max(1, nlist // 8))
    most = max(nprobe, min(MOST_PROBED, nlist // MOST_PROBED_SHARE))
    return IndexSpec(IVF_PQ4FS, nlist, nprobe, most, PROBE_SCORE, PROBE_SLOPE, rerank, emb_size)


def scaled_probing(spec: IndexSpec, share: float) -> IndexSpec:
    """``spec`` probing ``share`` times its lists (its least and most counts)."""
    return dataclasses.replace(
        spec,
        nprobe=max(1, round(spec.nprobe * share)),
        max_nprobe=max(1, round(spec.most_probed * share)),
    )


def spilled_spec(spec: IndexSpec, probe_share: float = SPILL_PROBE_SHARE, rerank: int = 0):
    """``spec`` with every post in two lists, probing ``probe_share`` of its lists
    (``scaled_probing``) and re-scoring ``rerank`` times the rows wanted (0: ``spec``'s)."""
    scaled = scaled_probing(spec, probe_share)
    return dataclasses.replace(scaled, rerank=rerank or spec.rerank, lists_per_post=2)


def mean_score_probing(spec: IndexSpec) -> IndexSpec:
    """``spec`` probing by the best and the mean centroid score (``PROBE_MEAN_WEIGHT``), from
    ``MEAN_PROBE_LEAST_SHARE`` of its lists up to the same most."""
    return dataclasses.replace(
        spec,
        nprobe=max(1, round(spec.nprobe * MEAN_PROBE_LEAST_SHARE)),
        probe_score=MEAN_PROBE_SCORE,
        probe_slope=MEAN_PROBE_SLOPE,
        probe_mean_weight=PROBE_MEAN_WEIGHT,
    )


def lists_to_probe(spec: IndexSpec, centroid_scores: np.ndarray) -> np.ndarray:
    """Lists each user probes [B] from its scores over every centroid [B, nlist]: ``nprobe``
    for a user close to a cluster, more for one between clusters (whose nearest posts spread
    over many lists) and, where the spec weighs it, for one facing the corpus' dense middle
    (a high mean score), at most ``spec.most_probed``."""
    if spec.max_nprobe <= spec.nprobe:
        return np.full(len(centroid_scores), spec.nprobe)
    exponent = spec.probe_slope * (spec.probe_score - centroid_scores.max(axis=1))  # [B]
    if spec.probe_mean_weight:
        exponent += spec.probe_mean_weight * centroid_scores.mean(axis=1)
    growth = np.exp(exponent)
    return np.clip(np.ceil(spec.nprobe * growth), spec.nprobe, spec.max_nprobe).astype(int)


def centroids_of(index) -> np.ndarray:
    """The IVF index's list centroids [nlist, D] (float32)."""
    return index.quantizer.reconstruct_n(0, index.nlist)


def centroid_columns(index) -> np.ndarray:
    """The IVF index's list centroids as columns [D, nlist] (C-ordered float32), scored by
    numpy at search time: ``users @ columns`` ran 1.3x faster at 8 users a call than ``users @
    centroids.T`` over 4,096 lists here (the layout OpenBLAS multiplies fastest)."""
    return np.ascontiguousarray(centroids_of(index).T)


def search_index(index, spec: IndexSpec, users, want: int, selector=None, columns=None):
    """(scores [B, want], rows [B, want], -1 where fewer) of the IVF ``index`` probed per user
    as ``lists_to_probe`` says; ``selector``: a Faiss ID selector of the rows allowed;
    ``columns``: ``centroid_columns(index)``, kept by the caller (computed here if absent).

    The lists are chosen here rather than by Faiss' quantizer: one matrix product scores every
    centroid, and each user keeps its own count (Faiss skips the lists marked -1)."""
    import faiss

    users = np.ascontiguousarray(users, np.float32)
    columns = centroid_columns(index) if columns is None else columns
    every = users @ columns  # [B, nlist]
    probes = lists_to_probe(spec, every)  # [B]
    lists, centroid_scores = best_lists(every, probes)  # [B, most] each
    params = faiss.SearchParametersIVF()
    params.nprobe = lists.shape[1]  # the width of ``lists``
    if selector is not None:
        params.sel = selector
    scores = np.empty((len(users), want), np.float32)
    rows = np.empty((len(users), want), np.int64)
    # The C++ call: the Python wrapper of search_preassigned takes no search parameters.
    index.search_preassigned_c(
        len(users),
        faiss.swig_ptr(users),
        want,
        faiss.swig_ptr(lists),
        faiss.swig_ptr(centroid_scores),
        faiss.swig_ptr(scores),
        faiss.swig_ptr(rows),
        False,
        params,
    )
    return scores, rows


def scores_of_rows(embeddings: np.ndarray, users: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Exact float32 scores [B, c] of each user [B, D] against its ``rows`` [B, c] of
    ``embeddings`` [n, D] (C-ordered float32, mapped or not), -inf where a row is -1.

    A large batch: Faiss' indexed inner products, parallel on its threads, without the
    [B, c, D] copy of the vectors. A small one (a served retriever's one or two users): numpy on
    this thread, as so short a parallel region waits for its other thread, which the other
    models' instances keep busy (measurements: docs/retrieval.md, "the work around Faiss")."""
    if rows.size < PARALLEL_SCORES:
        held = rows >= 0
        vectors = np.take(embeddings, np.where(held, rows, 0), axis=0)  # [B, c, D]
        scores = np.einsum("bcd,bd->bc", vectors, users)  # [B, c]
        scores[~held] = -np.inf
        return scores
    import faiss

    users = np.ascontiguousarray(users, np.float32)  # what Faiss reads
    rows = np.ascontiguousarray(rows, np.int64)
    batch, width = rows.shape
    user_of = np.repeat(np.arange(batch, dtype=np.int64), width)  # [B * c]
    scores = np.empty((batch, width), np.float32)
    # faiss' own stub (__init__.pyi) leaves this function out; swigfaiss defines it
    faiss.pairwise_indexed_inner_product(  # type: ignore[attr-defined]
        users.shape[1],
        rows.size,
        faiss.swig_ptr(users),
        faiss.swig_ptr(user_of),
        faiss.swig_ptr(embeddings),
        faiss.swig_ptr(rows),
        faiss.swig_ptr(scores),
    )
    return scores  # Faiss writes -inf where a row is -1


def best_lists(every: np.ndarray, probes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(lists [B, w] int64, their scores [B, w] float32) of each user's ``probes[b]``
    best-scoring lists among the centroid scores ``every`` [B, nlist], in list order, -1 (with
    the user's cut as score) in place of the lists beyond a user's count (Faiss skips those);
    w = the largest count, ties at a user's cut included.

    A user's cut is its ``probes[b]``-th best score: one partition of the scores at the
    largest count, that count sorted, then every list at or above the cut (8 users of 4,096
    lists: 30 µs a user, against 37 by an argpartition, which numpy runs about 2x slower than a
    partition here). Faiss scans a user's lists in any order to the same result."""
    every = np.asarray(every, np.float32)  # what Faiss reads
    batch, nlist = every.shape
    most = int(probes.max())
    top = np.sort(np.partition(every, nlist - most, axis=1)[:, nlist - most :], axis=1)
    cut = top[np.arange(batch), most - probes]  # [B], a user's last list's score
    # user after user (a 1-d nonzero: 5x faster than a 2-d one here); a tie adds a list
    chosen = np.flatnonzero(every >= cut[:, None])
    user, column = chosen // nlist, chosen % nlist
    counts = np.bincount(user, minlength=batch)  # [B]
    if counts.max() > most:  # ties beyond the largest count (a constant user: all of them)
        return best_lists_among_most(every, probes)
    slot = np.arange(len(user)) - np.repeat(np.cumsum(counts) - counts, counts)
    lists = np.full((batch, int(counts.max())), -1, np.int64)  # [B, w]
    # Faiss quantizes a user's list scores over the range of all w: its cut there, not a
    # wider range, keeps their steps as fine as its own lists allow
    scores = np.repeat(cut[:, None], lists.shape[1], axis=1)  # [B, w]
    lists[user, slot] = column
    scores[user, slot] = every[user, column]
    return lists, scores


def best_lists_among_most(every: np.ndarray, probes: np.ndarray) -> tuple:
    """``best_lists`` where scores tie beyond the largest count: each user's lists among its
    ``most`` best only (``most`` = the largest count; which of the tied ones, the partition's
    choice), so that no user probes more than that (a constant score vector would tie every
    list)."""
    most = int(probes.max())
    lists = np.argpartition(-every, most - 1, axis=1)[:, :most]  # [B, most], unordered
    scores = np.take_along_axis(every, lists, 1)  # [B, most]
    cut = np.sort(scores, axis=1)[np.arange(len(scores)), most - probes][:, None]  # [B, 1]
    lists = np.where(scores < cut, -1, lists)  # a tie at the cut adds a list
    return lists.astype(np.int64, copy=False), np.maximum(scores, cut)  # -1 slots: the cut


def spill_lists(
    embeddings: np.ndarray,
    centroids: np.ndarray,
    candidates: int = SPILL_CANDIDATES,
    weight: float = SPILL_WEIGHT,
) -> tuple[np.ndarray, np.ndarray]:
    """(first [n], second [n]) list of each post of ``embeddings`` [n, D] over ``centroids``
    [nlist >= 2, D]: its best-scoring centroid's, and the spilled one (above)."""
    import faiss

    nlist, dim = centroids.shape
    if nlist < 2:
        raise ValueError(f"a post can spill into a second list only with >= 2 lists, got {nlist}")
    candidates = min(candidates, nlist)
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(np.ascontiguousarray(centroids, np.float32))
    first = np.empty(len(embeddings), np.int64)
    second = np.empty(len(embeddings), np.int64)
    for start in range(0, len(embeddings), 1 << 18):  # slices: [c, D] temporaries only
        posts = np.ascontiguousarray(embeddings[start : start + (1 << 18)], np.float32)  # [c, D]
        _, near = quantizer.search(posts, candidates)  # [c, J] best first
        residual = posts - centroids[near[:, 0]]  # [c, D]
        along = residual / np.maximum(np.linalg.norm(residual, axis=1, keepdims=True), 1e-12)
        loss = np.empty((len(posts), candidates - 1), np.float32)  # [c, J - 1]
        for j in range(1, candidates):
            other = posts - centroids[near[:, j]]  # [c, D]
            loss[:, j - 1] = (other * other).sum(1) + weight * ((other * along).sum(1)) ** 2
        first[start : start + len(posts)] = near[:, 0]
        picked = 1 + loss.argmin(axis=1)  # [c]
        second[start : start + len(posts)] = near[np.arange(len(posts)), picked]
    return first, second


def fill_spilled(plain, embeddings: np.ndarray, progress=None):
    """The trained, empty IVF-PQ ``plain`` (4-bit codes) filled with row i of ``embeddings``
    [n, D] as id i in each of its two ``spill_lists`` (ntotal 2n), as a fast-scan index: built
    by preassigned adds to the plain index, then converted (``add_core`` on a fast-scan index
    corrupts memory in Faiss 1.15.1). ``progress``: as ``build_index``'s."""
    import faiss

    rows = len(embeddings)
    first, second = spill_lists(embeddings, centroids_of(plain))
    for start in range(0, rows, 1 << 20):  # in slices: no second full copy in memory
        posts = np.ascontiguousarray(embeddings[start : start + (1 << 20)], np.float32)
        ids = np.arange(start, start + len(posts), dtype=np.int64)
        for lists in (first, second):
            assigned = np.ascontiguousarray(lists[start : start + len(posts)])
            plain.add_core(
                len(posts), faiss.swig_ptr(posts), faiss.swig_ptr(ids), faiss.swig_ptr(assigned)
            )
        if progress is not None:
            progress(len(posts))
    # a deep copy owns its quantizer: nothing refers to the plain index's objects after it
    return faiss.clone_index(faiss.IndexIVFPQFastScan(plain))


def build_index(
    embeddings: np.ndarray,
    spec: IndexSpec,
    seed: int = 0,
    progress: Optional[Callable[[int], object]] = None,
):
    """A trained, filled Faiss index of ``embeddings`` [n, D] (row i gets id i); ``progress``
    is told the rows added after each slice (a caller's progress bar: big builds take minutes).
    """

    rows, dim = embeddings.shape
    index = empty_index(spec, dim)
    train_index(index, embeddings, spec, seed)
    if spec.spilled:
        return fill_spilled(index, embeddings, progress)
    for start in range(0, rows, 1 << 20):  # in slices: no second full copy in memory
        chunk = np.ascontiguousarray(embeddings[start : start + (1 << 20)], np.float32)
        index.add(chunk)
        if progress is not None:
            progress(len(chunk))
    return index


def train_index(index, embeddings: np.ndarray, spec: IndexSpec, seed: int = 0) -> None:
    """Train the empty Faiss IVF ``index`` (its lists, unless its quantizer is trained already,
    and its codes) on a sample of ``embeddings`` [n, D], as ``training_of`` says for ``spec``."""
    sample, iterations = training_of(spec, len(embeddings))
    picks = np.sort(np.random.default_rng(seed).choice(len(embeddings), sample, replace=False))
    index.cp.seed = seed
    index.cp.niter = iterations
    index.cp.min_points_per_centroid = 1  # a small sample is fine; do not warn about it
    index.train(np.ascontiguousarray(embeddings[picks], np.float32))


def training_of(spec: IndexSpec, rows: int) -> tuple[int, int]:
    """(posts sampled, k-means iterations) that train the lists of ``spec`` over ``rows``."""
    if spec.spilled:
        return min(rows, spec.nlist * SPILLED_TRAIN_POINTS_PER_LIST), SPILLED_KMEANS_ITERATIONS
    return min(rows, spec.nlist * TRAIN_POINTS_PER_LIST), KMEANS_ITERATIONS


def empty_index(spec: IndexSpec, dim: int):
    """An untrained Faiss IVF index of ``spec``'s kind (inner product) over ``dim``-d vectors;
    a spilled one's is a plain IVF-PQ of the same codes, which ``fill_spilled`` converts."""
    import faiss

    quantizer = faiss.IndexFlatIP(dim)
    if spec.kind == IVF_PQ4FS:
        if dim % spec.pq_m:
            raise StoreError(f"pq_m {spec.pq_m} does not divide emb_size {dim}")
        kind = faiss.IndexIVFPQ if spec.spilled else faiss.IndexIVFPQFastScan
        return kind(quantizer, dim, spec.nlist, spec.pq_m, 4, faiss.METRIC_INNER_PRODUCT)
    return faiss.IndexIVFScalarQuantizer(
        quantizer, dim, spec.nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
    )


def write_index(index, path: Path) -> None:
    import faiss

    faiss.write_index(index, str(path))


def read_index(path: Path, spec: IndexSpec, rows: int, emb_size: int):
    """The index at ``path``, loaded into this process's memory and checked against its
    segment's entry: the kind ``spec`` names, its rows and width.

    Not memory-mapped: Faiss maps an IVF index's lists as OnDiskInvertedLists, which searched
    at a third to a half of the speed here (16 users per call, 1 M posts), and the loaded
    codes are small (8-bit: D + 8 bytes per post, 0.7 GB per instance at 10 M posts; 4-bit
    PQ: pq_m / 2 + 8)."""
    import faiss

    if not path.is_file():
        raise StoreError(f"{path}: not found (the manifest gives this segment an index)")
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as error:
        raise StoreError(f"{path}: not a readable Faiss index ({error})") from None
    expected = faiss.IndexIVFPQFastScan if spec.kind == IVF_PQ4FS else faiss.IndexIVFScalarQuantizer
    if not isinstance(index, expected):
        raise StoreError(
            f"{path}: a {type(index).__name__}, expected a {expected.__name__} (the manifest "
            f"gives this segment index kind {spec.kind!r})"
        )
    entries = rows * max(1, spec.lists_per_post)  # a spilled post is in two lists
    if index.ntotal != entries or index.d != emb_size:
        raise StoreError(
            f"{path}: holds {index.ntotal} vectors of width {index.d}, expected {entries} of "
            f"width {emb_size}"
        )
    return index
