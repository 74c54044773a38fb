"""Offline evaluation on the held-out days (jax, haiku and numpy only).

One request per evaluation user at the first second of the held-out days
(``phoenix.training.data.EvalSet``):

- retrieval: the user vector against a corpus of recent posts (created from
  ``corpus_days`` before the split on), the user's history excluded as the served
  retriever excludes it; recall@k = share of the user's held-out positives (favorite, reply,
  repost or quote) in the top k, averaged over users;
- ranking: the user's held-out impressions as candidates; AUC of each action's probability
  against the logged action over all candidates, and NDCG@20 of the blended score (the served
  ``score_weights``) with the blend of the logged actions as the gain; the log-loss of each
  action's probability (mean binary cross-entropy over all candidates).

Scorers compared: the trained towers, the same towers at their random initial weights, a
popularity baseline (positives per post in the training days) and the ground truth's own
scores (the planted model: its affinity for retrieval, its action probabilities for ranking),
which is the ceiling.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy.stats import rankdata

from phoenix.config import ArtifactConfig
from phoenix.engine.batching import pad_axis
from phoenix.engine.candidate_tower import CandidateTower
from phoenix.hashing import stack_tables
from phoenix.training.data import EvalSet, LogIndex
from phoenix.training.train import (
    artifact_tables,
    model_inputs,
    ranker_apply,
    retrieval_apply,
)
from phoenix.world import synthetic

RECALL_KS = (10, 20, 50, 100, 200, 500)
NDCG_K = 20
EVAL_BATCH = 64  # requests per jitted call


# ----------------------------------------------------------------------------------------
# Metrics
# ----------------------------------------------------------------------------------------


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged); NaN without both classes."""
    scores, labels = np.asarray(scores, np.float64).ravel(), np.asarray(labels).ravel() > 0
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def log_loss(probs: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy (nats) of ``probs`` against 0/1 ``labels``; NaN when empty."""
    probs = np.clip(np.asarray(probs, np.float64).ravel(), eps, 1 - eps)
    labels = np.asarray(labels).ravel() > 0
    if probs.size == 0:
        return float("nan")
    return float(-np.mean(np.where(labels, np.log(probs), np.log1p(-probs))))


def ndcg_at_k(scores: np.ndarray, gains: np.ndarray, mask: np.ndarray, k: int = NDCG_K) -> float:
    """Mean NDCG@k over rows of scores/gains [R, C] (mask: real candidates); rows whose ideal
    DCG is 0 are skipped. Ties in ``scores`` keep the candidates' order."""
    discounts = 1.0 / np.log2(np.arange(2, scores.shape[1] + 2))
    scores = np.where(mask, scores, -np.inf)
    gains = np.where(mask, gains, 0.0)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    dcg = (np.take_along_axis(gains, order, 1) * discounts[: order.shape[1]]).sum(1)
    ideal = (-np.sort(-gains, axis=1)[:, :k] * discounts[: order.shape[1]]).sum(1)
    keep = ideal > 0
    return float(np.mean(dcg[keep] / ideal[keep])) if keep.any() else float("nan")


def recall_at_ks(
    score_rows: Callable[[np.ndarray], np.ndarray],
    num_rows: int,
    targets: Sequence[np.ndarray],
    exclude: Sequence[np.ndarray],
    ks: Sequence[int] = RECALL_KS,
    chunk: int = 256,
) -> dict[int, float]:
    """Mean recall@k over the rows with a target; ``score_rows(rows)`` gives scores
    [len(rows), N] over the corpus and ``targets``/``exclude`` are corpus positions per row."""
    largest = max(ks)
    hits: dict[int, list[float]] = {k: [] for k in ks}
    for start in range(0, num_rows, chunk):
        rows = np.arange(start, min(start + chunk, num_rows))
        scores = np.array(score_rows(rows), np.float64)
        for i, r in enumerate(rows.tolist()):
            scores[i, exclude[r]] = -np.inf
        top = np.argpartition(-scores, min(largest, scores.shape[1] - 1), axis=1)[:, :largest]
        top_scores = np.take_along_axis(scores, top, 1)
        top = np.take_along_axis(top, np.argsort(-top_scores, axis=1, kind="stable"), 1)
        for i, r in enumerate(rows.tolist()):
            wanted = targets[r]
            if wanted.size == 0:  # every held-out positive of this user is outside the corpus
                continue
            for k in ks:
                hits[k].append(np.isin(wanted, top[i, :k]).mean())
    return {k: float(np.mean(v)) for k, v in hits.items()}


# ----------------------------------------------------------------------------------------
# The evaluator
# ----------------------------------------------------------------------------------------


def embed_posts(config: ArtifactConfig, params: dict, world, posts: np.ndarray) -> np.ndarray:
    """Candidate-tower vectors [len(posts), D] of ``posts`` (world rows), embedded as
    ``phoenix.artifacts`` embeds a corpus (the stacked tables of the trained params)."""
    tables = artifact_tables(params)
    stacked = stack_tables(*(tables[f"{e}_embeddings"] for e in ("user", "item", "author")))
    post_ids, authors = world.post_ids[posts], world.author_ids[world.post_author[posts]]
    return CandidateTower.from_weights(config, params["retrieval"], stacked)(post_ids, authors)


class Evaluator:
    """Scores one ``EvalSet`` with every scorer and computes the metrics."""

    def __init__(
        self,
        index: LogIndex,
        eval_set: EvalSet,
        config: ArtifactConfig,
        score_weights: Mapping[str, float],
    ):
        self.index, self.eval_set, self.config = index, eval_set, config
        world, imp = index.world, index.imp
        self.weights = np.zeros(config.num_actions, np.float32)
        for name, weight in score_weights.items():
            self.weights[config.action_index(name)] = weight
        E = len(eval_set)
        ts = eval_set.ts
        self.user_arrays = index.user_arrays(eval_set.users, ts)
        self.candidate_arrays = index.candidate_arrays(eval_set.candidates, ts)
        self.mask = eval_set.candidates >= 0
        cand = np.maximum(eval_set.candidates, 0)
        self.labels = imp.actions[cand]  # [E, C, A]
        self.gains = self.labels.astype(np.float32) @ self.weights  # [E, C]
        # retrieval: corpus of recent posts; targets and history as corpus positions
        self.corpus = index.corpus_posts()
        position = np.full(len(world.post_ids), -1, np.int64)
        position[self.corpus] = np.arange(len(self.corpus))
        self.targets = [position[t][position[t] >= 0] for t in eval_set.targets]
        self.exclude = []
        for r in range(E):
            hist = eval_set.history[r]
            seen = position[imp.post[hist[hist >= 0]]]
            self.exclude.append(seen[seen >= 0])
        counts = np.bincount(imp.post[index.train_positives], minlength=len(world.post_ids))
        self.popularity = counts.astype(np.float64)
        self._ranker_fn: Optional[Callable] = None  # jitted on first use
        self._user_fn: Optional[Callable] = None

    # -- scorers -----------------------------------------------------------------------

    def _in_batches(self, out: np.ndarray, fn, params: tuple, arrays: dict) -> np.ndarray:
        """``out`` filled with ``fn(*params, chunk)`` over zero-padded chunks of ``arrays``'
        rows, all of one compiled shape; the padding rows are dropped."""
        E = len(self.eval_set)
        for start in range(0, E, EVAL_BATCH):
            stop = min(start + EVAL_BATCH, E)
            chunk = {k: pad_axis(v[start:stop], 0, EVAL_BATCH) for k, v in arrays.items()}
            out[start:stop] = np.asarray(fn(*params, chunk))[: stop - start]
        return out

    def ranker_probs(self, params: dict) -> np.ndarray:
        """Action probabilities [E, C, A] of the held-out candidates."""
        if self._ranker_fn is None:
            apply = ranker_apply(self.config)

            def probs(ranker, tables, arrays):
                batch, emb = model_inputs(tables, arrays)
                return jax.nn.sigmoid(apply(ranker, batch, emb).logits.astype(jnp.float32))

            self._ranker_fn = jax.jit(probs)
        out = np.zeros(self.labels.shape, np.float32)
        weights = (params["ranker"], params["tables"])
        return self._in_batches(
            out, self._ranker_fn, weights, self.user_arrays | self.candidate_arrays
        )

    def user_vectors(self, params: dict) -> np.ndarray:
        if self._user_fn is None:
            apply = retrieval_apply(self.config)

            def users(retrieval, tables, arrays):
                # the user tower reads no candidate; the padding candidate is never used
                batch, emb = model_inputs(tables, arrays, with_candidates=False)
                return apply(retrieval, batch, emb)[0]

            self._user_fn = jax.jit(users)
        out = np.zeros((len(self.eval_set), self.config.emb_size), np.float32)
        E, c = len(self.eval_set), self.config
        arrays = self.user_arrays | {
            "positive_post_hashes": np.zeros((E, c.num_item_hashes), np.int32),
            "positive_author_hashes": np.zeros((E, c.num_author_hashes), np.int32),
        }
        weights = (params["retrieval"], params["tables"])
        return self._in_batches(out, self._user_fn, weights, arrays)

    def corpus_vectors(self, params: dict) -> np.ndarray:
        return embed_posts(self.config, params, self.index.world, self.corpus)

    def truth_probs(self) -> np.ndarray:
        """Ground-truth action probabilities [E, C, A] of the held-out impressions."""
        imp = self.index.imp
        cand = np.maximum(self.eval_set.candidates, 0)
        return synthetic.action_probabilities(
            self.index.world, imp.user[cand], imp.post[cand], imp.ts[cand], imp.surface[cand]
        )

    # -- metrics -----------------------------------------------------------------------

    def ranking_metrics(self, probs: np.ndarray) -> dict:
        names = self.config.action_names
        per_action = {
            name: auc(probs[..., a][self.mask], self.labels[..., a][self.mask])
            for a, name in enumerate(names)
        }
        losses = {
            name: log_loss(probs[..., a][self.mask], self.labels[..., a][self.mask])
            for a, name in enumerate(names)
        }
        return {
            "auc": per_action,
            "log_loss": losses,
            f"ndcg@{NDCG_K}": ndcg_at_k(probs @ self.weights, self.gains, self.mask),
        }

    def retrieval_metrics(self, score_rows: Callable[[np.ndarray], np.ndarray]) -> dict:
        recall = recall_at_ks(score_rows, len(self.eval_set), self.targets, self.exclude)
        return {f"recall@{k}": v for k, v in recall.items()}

    def model_metrics(self, params: dict, corpus: Optional[np.ndarray] = None) -> dict:
        """Metrics of ``params``; ``corpus``: their corpus vectors when already computed."""
        users = self.user_vectors(params)
        corpus = self.corpus_vectors(params) if corpus is None else corpus
        metrics = self.retrieval_metrics(lambda rows: users[rows] @ corpus.T)
        metrics.update(self.ranking_metrics(self.ranker_probs(params)))
        return metrics

    def popularity_metrics(self) -> dict:
        pop = self.popularity[self.corpus]
        metrics = self.retrieval_metrics(lambda rows: np.broadcast_to(pop, (len(rows), len(pop))))
        cand_pop = self.popularity[self.index.imp.post[np.maximum(self.eval_set.candidates, 0)]]
        metrics[f"ndcg@{NDCG_K}"] = ndcg_at_k(cand_pop, self.gains, self.mask)
        return metrics

    def truth_metrics(self) -> dict:
        world = self.index.world
        spec = world.spec
        when = self.eval_set.ts[0] + spec.held_out_days * synthetic.DAY // 2
        users = self.eval_set.users

        def score_rows(rows):
            # every positive action rises with the affinity alone: rank by the affinity
            return synthetic.affinity(
                world, users[rows][:, None], self.corpus[None, :], np.int64(when)
            )

        metrics = self.retrieval_metrics(score_rows)
        metrics.update(self.ranking_metrics(self.truth_probs()))
        return metrics

    def evaluate(
        self,
        trained: dict,
        initial: Optional[dict] = None,
        trained_corpus: Optional[np.ndarray] = None,
    ) -> dict:
        """{scorer: metrics} for the trained weights, the initial ones, popularity and truth;
        ``trained_corpus``: the trained corpus vectors when the caller has them already."""
        out = {"trained": self.model_metrics(trained, trained_corpus)}
        if initial is not None:
            out["random_weights"] = self.model_metrics(initial)
        out["popularity"] = self.popularity_metrics()
        out["ground_truth"] = self.truth_metrics()
        return out
