"""How far two rankings of the same request agree: what a shadow comparison of two model
versions logs (phoenix.ops.rollout). Pure numpy.

Two versions of ``recommend`` may retrieve different posts, so the correlations are taken over
the posts both rankings hold (``common``), and the top-k overlap says how many that is. Two
versions of ``ranker`` fed the same candidates rank the same posts, and the correlations cover
them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Union

import numpy as np

Scores = Union[Sequence[float], np.ndarray]


def kendall_tau(first: Scores, second: Scores) -> float:
    """Kendall's tau-b of two score lists over the same items (ties in either count as
    neither concordant nor discordant); nan for fewer than two items or all ties."""
    a, b = np.asarray(first, np.float64), np.asarray(second, np.float64)
    if a.shape != b.shape:
        raise ValueError(f"kendall_tau: {a.shape} and {b.shape} differ")
    if a.size < 2:
        return float("nan")
    upper = np.triu_indices(a.size, 1)
    da = np.sign(a[:, None] - a[None, :])[upper]
    db = np.sign(b[:, None] - b[None, :])[upper]
    denominator = np.sqrt(np.count_nonzero(da) * np.count_nonzero(db))
    return float(np.sum(da * db) / denominator) if denominator else float("nan")


def average_ranks(scores: Scores) -> np.ndarray:
    """Ranks from 1 (smallest) with ties sharing their mean rank."""
    values = np.asarray(scores, np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size, np.float64)
    ranks[order] = np.arange(1, values.size + 1)
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman_rho(first: Scores, second: Scores) -> float:
    """Spearman's rho (Pearson on average ranks); nan for fewer than two items or a constant."""
    a, b = average_ranks(first), average_ranks(second)
    if a.shape != b.shape:
        raise ValueError(f"spearman_rho: {a.shape} and {b.shape} differ")
    if a.size < 2 or a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def top_k_overlap(first_ids: Sequence[int], second_ids: Sequence[int], k: int) -> float:
    """|top k of first ∩ top k of second| / k (1.0: the same k posts, in any order)."""
    if k <= 0:
        raise ValueError(f"top_k_overlap: k must be positive, got {k}")
    return len(set(list(first_ids)[:k]) & set(list(second_ids)[:k])) / k


def compare_rankings(
    ids_a: Sequence[int], scores_a: Sequence[float], ids_b: Sequence[int], scores_b: Sequence[float]
) -> dict[str, float]:
    """Agreement of ranking B with ranking A (ids in ranked order, their scores): top-k overlap
    (k = the shorter length), tau and rho of the scores over the posts both hold, and the score
    deltas (B - A) of those posts."""
    ids_a, ids_b = [int(i) for i in ids_a], [int(i) for i in ids_b]
    if len(ids_a) != len(scores_a) or len(ids_b) != len(scores_b):
        raise ValueError("compare_rankings: each ranking needs one score per id")
    where_b = {post: i for i, post in enumerate(ids_b)}
    common = [(i, where_b[post]) for i, post in enumerate(ids_a) if post in where_b]
    a = np.array([scores_a[i] for i, _ in common], np.float64)
    b = np.array([scores_b[j] for _, j in common], np.float64)
    deltas = b - a
    k = min(len(ids_a), len(ids_b))
    return {
        "k": k,
        "common": len(common),
        "top_k_overlap": top_k_overlap(ids_a, ids_b, k) if k else float("nan"),
        "kendall_tau": kendall_tau(a, b),
        "spearman_rho": spearman_rho(a, b),
        "mean_abs_score_delta": float(np.abs(deltas).mean()) if deltas.size else float("nan"),
        "max_abs_score_delta": float(np.abs(deltas).max()) if deltas.size else float("nan"),
        "mean_score_delta": float(deltas.mean()) if deltas.size else float("nan"),
    }


def summarize(comparisons: Sequence[dict[str, float]]) -> dict[str, float]:
    """The mean of each measure over requests (nan ones left out), and the request count."""
    summary: dict[str, float] = {"requests": len(comparisons)}
    for name in comparisons[0] if comparisons else ():
        values = np.array([c[name] for c in comparisons], np.float64)
        values = values[~np.isnan(values)]
        summary[name] = float(values.mean()) if values.size else float("nan")
    return summary
