"""The ranker's service over a production-family artifact (X's production ranker,
docs/production.md): the same contract, requests and answers as the original family's
(``ranker``), another engine (``ProductionBatchRanker``).

The family reads every input of the ranker's contract; what a request leaves out of the
production inputs (semantic IDs, impression context, the profile) is X's "unknown". Its
limits come from the artifact: a history longer than the ranker's ``history_seq_len`` is
refused (the original family keeps the newest items; this one was trained on whole
histories of at most that length). Ranked by ``score_weights`` over its 64 action slots
(``feed_features.ACTION_SLOTS``: the feed's action names where a slot is one of them, so the
default blend means what it means for the original family).

Shape glossary (R rows of one request, B rows of the padded batch)
  H  history_seq_len   C  candidates sent   W  padded candidate width   A  action slots (64)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from phoenix.schema.batches import empty_batch, pad_batch
from phoenix.schema.contracts import RANKER
from phoenix.schema.request_types import RankerRequest
from phoenix.schema.requests import InputError
from phoenix.stub.services.common import Outputs, Service, ServiceSettings
from phoenix.stub.services.ranker import (
    batch_widths,
    run_in_calls,
    score_weight_vector,
    split_ranked,
    width_groups,
)
from phoenix.stub.services.resources import resources_for


class ProductionRankerService(Service):
    """Ranks each user's candidates with X's production ranker by a blend of its action
    slots' probabilities."""

    request_type = RankerRequest

    def __init__(
        self,
        artifact_dir: Path,
        score_weights: Mapping[str, float],
        *,
        candidate_buckets: Sequence[int],
        batch_buckets: Sequence[int],
        split_widths: bool = RANKER.parameter("split_widths").default,
        compute_dtype=None,
    ):
        from phoenix.engine.production_serving import ProductionBatchRanker

        resources = resources_for(artifact_dir, ("ranker",))
        loaded = resources.artifacts.production_ranker
        assert loaded is not None  # load_artifacts reads a production family's ranker
        self.config = resources.config  # what requests are checked against
        self.ranker_config = loaded.config
        self.split_widths = split_widths
        self.weights = score_weight_vector(score_weights, self.config.action_names)
        self.ranker = ProductionBatchRanker(
            loaded.config,
            loaded.params,
            self.weights,
            batch_buckets=batch_buckets,
            candidate_buckets=candidate_buckets,
            store=resources.programs,
            compute_dtype=compute_dtype,
        )
        self.batch_buckets = self.ranker.batch_buckets
        self.max_rows = self.batch_buckets[-1]

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> ProductionRankerService:
        return cls(
            settings.artifact_dir,
            settings.parameters["score_weights"],
            candidate_buckets=settings.parameters["candidate_buckets"],
            batch_buckets=settings.batch_buckets,
            split_widths=settings.parameters["split_widths"],
        )

    def admit(self, request: RankerRequest) -> RankerRequest:
        request = super().admit(request)
        longest = self.ranker_config.history_seq_len
        if request.length("L") > longest:
            raise InputError(
                f"input 'history_post_ids': {request.length('L')} history items; this ranker "
                f"(X's production family) reads at most {longest}: send the newest {longest}",
                "history_post_ids",
            )
        return request

    def warm_up(self) -> int:
        return self.ranker.warm_up(
            lambda users, width: empty_batch(RANKER, users, batch_widths(self.config, width))
        )

    def run(self, requests: Sequence[RankerRequest]) -> list[Outputs]:
        return run_in_calls(requests, self.ranked_together(requests), self.rank_in_one_call)

    def ranked_together(self, requests: Sequence[RankerRequest]) -> list[list[int]]:
        return width_groups(self.ranker.padded_shape, requests, self.split_widths)

    def rank_in_one_call(self, requests: Sequence[RankerRequest]) -> list[Outputs]:
        rows = sum(r.rows for r in requests)
        users, width = self.ranker.padded_shape(rows, max(r.candidates for r in requests))
        batch = pad_batch(requests, users, batch_widths(self.config, width))
        return split_ranked(requests, batch, self.ranker.rank(batch, rows))
