"""Recall of a store's search against exact float32 search of the same vectors: how an ANN
index is judged (bench/bench_retrieval.py, tests of the store).

Shape glossary
  N  posts   Q  users   D  emb_size   k  results per user
"""

from __future__ import annotations

import numpy as np

WORST_SHARE = 0.1  # "worst decile": the mean recall of the worst 10% of users


def exact_top_k(embeddings: np.ndarray, users: np.ndarray, k: int, chunk: int = 1 << 20):
    """Row indices [Q, k] of the exact top k (float32 inner products), best first: the
    reference recall is measured against."""
    best_scores = np.full((len(users), 0), -np.inf, np.float32)
    best_rows = np.zeros((len(users), 0), np.int64)
    for start in range(0, len(embeddings), chunk):
        scores = users @ np.asarray(embeddings[start : start + chunk], np.float32).T
        top = np.argpartition(-scores, min(k, scores.shape[1]) - 1, axis=1)[:, :k]
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], 1)
        best_rows = np.concatenate([best_rows, top + start], 1)
        keep = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(best_scores, keep, 1)
        best_rows = np.take_along_axis(best_rows, keep, 1)
    return best_rows


def recall_per_user(found: list, expected: np.ndarray) -> np.ndarray:
    """Share of each user's exact top k [Q, k] found (ids or rows, as long as both agree)."""
    return np.array([np.isin(e, f).mean() for f, e in zip(found, expected)])


def recall_summary(per_user: np.ndarray) -> dict:
    """{"mean", "worst_decile"} of per-user recalls: the worst decile is the mean of the
    worst WORST_SHARE of users (at least one)."""
    worst = np.sort(per_user)[: max(1, int(round(len(per_user) * WORST_SHARE)))]
    return {"mean": float(per_user.mean()), "worst_decile": float(worst.mean())}
