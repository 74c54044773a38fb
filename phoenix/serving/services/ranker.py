"""The ranker's service: each user's candidates ranked by a blend of action probabilities.

The whole batch runs on the device (``DeviceRanker``): the host stacks the typed requests into
one padded ``RankRequestBatch`` with the same field names, and splits the ranked order back.

Shape glossary (R rows of one request, B rows of the padded batch)
  S  history_seq_len   C  candidates sent   W  padded candidate width   A  num_actions
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from phoenix.engine.device_ranking import DeviceRanker, RankedBatch, RankRequestBatch
from phoenix.hashing import entity_hashes
from phoenix.serving.requests import RankRequest
from phoenix.serving.services.common import (
    Outputs,
    PhoenixResources,
    Service,
    ServiceSettings,
    action_weight_vector,
    optional_or_zeros,
    stack_histories,
    stack_padded,
)


def score_weight_vector(weights: Mapping[str, float], action_names: Sequence[str]) -> np.ndarray:
    """The ranker's blend: float32 [A] of its parsed ``score_weights`` parameter."""
    return action_weight_vector(weights, action_names, "score_weights").astype(np.float32)


def request_batch(
    requests: Sequence[RankRequest], history_len: int, users: int, width: int
) -> RankRequestBatch:
    """Every request's rows stacked once and zero-padded to ``users`` x ``width`` candidates."""

    def candidates(name: str, dtype) -> np.ndarray:  # [B, W]
        parts = [optional_or_zeros(r, name, "candidate_post_ids", dtype) for r in requests]
        return stack_padded(parts, width, users)

    has_age = [
        np.full(r.candidate_post_ids.shape, r.candidate_post_age_seconds is not None)
        for r in requests
    ]
    return RankRequestBatch(
        **stack_histories(requests, history_len, users)._asdict(),
        candidate_post_ids=candidates("candidate_post_ids", np.int64),
        candidate_author_ids=candidates("candidate_author_ids", np.int64),
        candidate_product_surface=candidates("candidate_product_surface", np.int32),
        candidate_post_age_seconds=candidates("candidate_post_age_seconds", np.float32),
        candidate_has_age=stack_padded(has_age, width, users),
    )


def split_ranked(requests: Sequence[RankRequest], ranked: RankedBatch) -> list[Outputs]:
    """Each request's rows of the ranked batch, its own C candidates only, best first."""
    outputs, start = [], 0
    for request in requests:
        rows, count = slice(start, start + request.rows), request.candidates
        order = ranked.order[rows, :count]  # [R, C]: padding sorts last, so these are its own
        retrieval = optional_or_zeros(
            request, "candidate_retrieval_scores", "candidate_post_ids", np.float32
        )
        outputs.append(
            {
                "ranked_post_ids": np.take_along_axis(request.candidate_post_ids, order, axis=1),
                "ranked_author_ids": np.take_along_axis(
                    request.candidate_author_ids, order, axis=1
                ),
                "scores": ranked.scores[rows, :count],  # [R, C]
                "action_probs": ranked.action_probs[rows, :count],  # [R, C, A]
                "ranked_retrieval_scores": np.take_along_axis(retrieval, order, axis=1),
            }
        )
        start = rows.stop
    return outputs


class RankerService(Service):
    """Ranks each user's candidates by a weighted blend of action probabilities."""

    request_type = RankRequest

    def __init__(
        self,
        resources: PhoenixResources,
        score_weights: Mapping[str, float],
        *,
        candidate_buckets: Sequence[int],
        batch_buckets: Sequence[int],
        compute_dtype=None,
    ):
        self.config = resources.config
        self.weights = score_weight_vector(score_weights, self.config.action_names)
        self.ranker = DeviceRanker(
            self.config.ranker_config(),
            resources.artifacts.ranker_params,
            resources.embedder.table,
            entity_hashes(self.config),
            self.weights,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
            candidate_buckets=candidate_buckets,
            store=resources.programs,
        )
        self.batch_buckets = self.ranker.batch_buckets
        self.max_rows = self.batch_buckets[-1]

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> RankerService:
        return cls(
            PhoenixResources(settings.artifact_dir, ("ranker", "tables")),
            settings.parameters["score_weights"],
            candidate_buckets=settings.parameters["candidate_buckets"],
            batch_buckets=settings.batch_buckets,
        )

    def warm_up(self) -> int:
        return self.ranker.warm_up()

    def run(self, requests: Sequence[RankRequest]) -> list[Outputs]:
        rows = sum(r.rows for r in requests)
        users, width = self.ranker.padded_shape(rows, max(r.candidates for r in requests))
        batch = request_batch(requests, self.config.history_seq_len, users, width)
        return split_ranked(requests, self.ranker.rank(batch))
