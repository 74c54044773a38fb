"""The ranker's service: each user's candidates ranked by a blend of action probabilities.

Shape glossary (per request: leading dimension R = rows, usually one user)
  L  history items sent   S  history_seq_len   C  candidates sent   A  num_actions
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from phoenix.engine.batching import pad_axis
from phoenix.engine.device_ranking import (
    REFERENCE_TIME,
    DeviceRanker,
    RankedBatch,
    RankRequestBatch,
)
from phoenix.hashing import entity_hashes
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.serving import contracts
from phoenix.serving.requests import (
    LIMITS,
    check_ids,
    check_limit,
    check_range,
    check_same_length,
    check_same_rows,
    check_unknown_inputs,
    get_input,
)
from phoenix.serving.services.common import (
    USER_INPUTS,
    Inputs,
    Outputs,
    PhoenixResources,
    Result,
    handle_rows,
    parse_user_rows,
    stack_rows,
    stack_user_rows,
)


def ranked_outputs(row: dict, ranked: RankedBatch, r: int) -> Outputs:
    """Row ``r`` of a ranked batch as one request's outputs (its own candidates only)."""
    n = len(row["candidate_post_ids"])
    order = ranked.order[r, :n]  # padding sorts last, so the first n are this row's
    retrieval = row["candidate_retrieval_scores"]
    return {
        "ranked_post_ids": row["candidate_post_ids"][order],
        "scores": ranked.scores[r, :n],
        "action_probs": ranked.action_probs[r, :n],
        "ranked_retrieval_scores": (
            np.zeros(n, np.float32) if retrieval is None else retrieval[order]
        ),
    }


# ----------------------------------------------------------------------------------------
# ranker
# ----------------------------------------------------------------------------------------

RANKER_CANDIDATE_INPUTS = set(contracts.RANKER.input_names) - USER_INPUTS


def parse_score_weights(text: str, action_names: Sequence[str]) -> np.ndarray:
    """Blend weights from JSON {"action name": weight}; unknown names fail loudly."""
    try:
        weights = json.loads(text) if text else {}
    except json.JSONDecodeError as error:
        raise ValueError(f"score_weights is not valid JSON ({error}): {text!r}") from None
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"score_weights must be a non-empty JSON object, got {text!r}")
    unknown = sorted(set(weights) - set(action_names))
    if unknown:
        raise ValueError(
            f"score_weights names unknown actions {unknown}; the artifact's actions are "
            f"{list(action_names)}"
        )
    vector = np.zeros(len(action_names), np.float32)
    for name, weight in weights.items():
        vector[list(action_names).index(name)] = float(weight)
    return vector


class RankerService:
    """Ranks each user's candidates by a weighted blend of action probabilities."""

    def __init__(
        self,
        resources: PhoenixResources,
        score_weights: str,
        compute_dtype=None,
        candidate_buckets: Sequence[int] = contracts.RANKER_CANDIDATE_BUCKETS,
        batch_buckets: Sequence[int] = contracts.RANKER.batch_buckets,
    ):
        self.resources = resources
        self.config = resources.config
        self.weights = parse_score_weights(score_weights, self.config.action_names)
        self.ranker = DeviceRanker(
            self.config.ranker_config(),
            resources.artifacts.ranker_params,
            resources.embedder.table,
            entity_hashes(self.config),
            self.weights,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
            candidate_buckets=candidate_buckets,
        )

    def warm_up(self) -> int:
        return self.ranker.warm_up()

    def parse(self, inputs: Inputs) -> list[dict]:
        check_unknown_inputs(inputs, USER_INPUTS | RANKER_CANDIDATE_INPUTS)
        c = self.config
        rows = parse_user_rows(inputs, c.num_actions, c.product_surface_vocab_size)
        posts = get_input(inputs, "candidate_post_ids", "int", 2)
        authors = get_input(inputs, "candidate_author_ids", "int", 2)
        surfaces = get_input(inputs, "candidate_product_surface", "int", 2, required=False)
        ages = get_input(inputs, "candidate_post_age_seconds", "float", 2, required=False)
        retrieval = get_input(inputs, "candidate_retrieval_scores", "float", 2, required=False)
        candidates = {
            "candidate_post_ids": posts,
            "candidate_author_ids": authors,
            "candidate_product_surface": surfaces,
            "candidate_post_age_seconds": ages,
            "candidate_retrieval_scores": retrieval,
        }
        check_same_rows({"user_id": inputs["user_id"], **candidates})
        count = check_same_length(candidates, "candidate")
        check_limit("candidate_post_ids", count, LIMITS.max_candidates, "candidates")
        check_ids("candidate_post_ids", posts, minimum=1)
        check_ids("candidate_author_ids", authors)
        if surfaces is not None:
            check_range(
                "candidate_product_surface",
                surfaces,
                0,
                c.product_surface_vocab_size - 1,
                "product surfaces",
            )
        for r, row in enumerate(rows):
            row["candidate_post_ids"] = posts[r].astype(np.int64)
            row["candidate_author_ids"] = authors[r].astype(np.int64)
            row["candidate_product_surface"] = (
                np.zeros(count, np.int32) if surfaces is None else surfaces[r].astype(np.int32)
            )
            row["candidate_post_age_seconds"] = None if ages is None else ages[r]
            row["candidate_retrieval_scores"] = None if retrieval is None else retrieval[r]
        return rows

    def features(self, rows: Sequence[dict]) -> tuple[RecsysBatch, RecsysEmbeddings]:
        """The plain model's batch for ``rows`` (hashed and looked up on the host): what
        references and tests feed ``PhoenixModel``; serving hashes on the device instead."""
        c = self.config
        users = stack_user_rows(rows, c.history_seq_len, c.num_actions)
        hashes, embeddings = self.resources.user_features(users)
        width = max(len(row["candidate_post_ids"]) for row in rows)

        def padded(key: str, dtype) -> np.ndarray:
            out = np.zeros((len(rows), width), dtype)
            for i, row in enumerate(rows):
                out[i, : len(row[key])] = row[key]
            return out

        (post_h, author_h), (post_e, author_e) = self.resources.candidate_features(
            padded("candidate_post_ids", np.int64), padded("candidate_author_ids", np.int64)
        )
        impr = created = None
        if any(row["candidate_post_age_seconds"] is not None for row in rows):
            impr = np.zeros((len(rows), width), np.int64)  # 0 = unknown age
            created = np.zeros((len(rows), width), np.int64)
            for i, row in enumerate(rows):
                age = row["candidate_post_age_seconds"]
                if age is not None:
                    impr[i, : len(age)] = REFERENCE_TIME
                    created[i, : len(age)] = REFERENCE_TIME - np.floor(age).astype(np.int64)
        batch = RecsysBatch(
            **hashes,
            candidate_post_hashes=post_h,
            candidate_author_hashes=author_h,
            candidate_product_surface=padded("candidate_product_surface", np.int32),
            candidate_impr_ts=impr,
            candidate_post_creation_ts=created,
        )
        emb = RecsysEmbeddings(
            **embeddings, candidate_post_embeddings=post_e, candidate_author_embeddings=author_e
        )
        return batch, emb

    def rank(self, rows: Sequence[dict]) -> list[Outputs]:
        """Rank every row's candidates on the device, in groups of the largest batch bucket."""
        outputs: list[Outputs] = []
        largest = self.ranker.batch_buckets[-1]
        for start in range(0, len(rows), largest):
            group = rows[start : start + largest]
            ranked = self.ranker.rank(self.request_batch(group))
            outputs += [ranked_outputs(row, ranked, r) for r, row in enumerate(group)]
        return outputs

    def request_batch(self, rows: Sequence[dict]) -> RankRequestBatch:
        """Raw inputs of ``rows`` stacked and zero-padded to the ranker's bucket shape."""
        c = self.config
        most = max(len(row["candidate_post_ids"]) for row in rows)
        users_to, width = self.ranker.padded_shape(len(rows), most)
        users = stack_user_rows(rows, c.history_seq_len, c.num_actions)
        pad_users = lambda x: pad_axis(x, 0, users_to)  # noqa: E731
        dwell = users.dwell if users.dwell is not None else np.zeros(users.surfaces.shape)

        def candidates(key: str, dtype) -> np.ndarray:
            out = np.zeros((users_to, width), dtype)
            for i, row in enumerate(rows):
                if row[key] is not None:
                    out[i, : len(row[key])] = row[key]
            return out

        has_age = np.zeros((users_to, width), bool)
        for i, row in enumerate(rows):
            if row["candidate_post_age_seconds"] is not None:
                has_age[i, : len(row["candidate_post_ids"])] = True
        return RankRequestBatch(
            user_ids=pad_users(users.user_ids),
            history_post_ids=pad_users(users.post_ids),
            history_author_ids=pad_users(users.author_ids),
            history_actions=pad_users(users.actions),
            history_surfaces=pad_users(users.surfaces),
            history_dwell=pad_users(dwell.astype(np.float32)),
            candidate_post_ids=candidates("candidate_post_ids", np.int64),
            candidate_author_ids=candidates("candidate_author_ids", np.int64),
            candidate_surfaces=candidates("candidate_product_surface", np.int32),
            candidate_age_seconds=candidates("candidate_post_age_seconds", np.float32),
            candidate_has_age=has_age,
        )

    def handle(self, requests: Sequence[Inputs]) -> list[Result]:
        return handle_rows(requests, self.parse, self.rank, stack_rows)
