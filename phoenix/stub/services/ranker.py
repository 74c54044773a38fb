"""The ranker's service: each user's candidates ranked by a blend of action probabilities.

The whole batch runs on the device (``DeviceRanker``): the host stacks the typed requests into
one padded batch of the ranker's contract (``batches.pad_batch``, same field names), and
splits the ranked order back.

Shape glossary (R rows of one request, B rows of the padded batch)
  S  history_seq_len   C  candidates sent   W  padded candidate width   A  num_actions
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from phoenix.checkpoint.identity import artifact_version
from phoenix.engine.device_ranking import DeviceRanker, RankedBatch
from phoenix.engine.prefix_cache import PrefixCache
from phoenix.hashing import entity_hashes
from phoenix.schema.batches import artifact_widths, empty_batch, pad_batch, row_spans
from phoenix.schema.contracts import RANKER, UNKNOWN_AGE
from phoenix.schema.production_inputs import PRODUCTION_INPUT_NAMES
from phoenix.schema.request_types import RankerRequest
from phoenix.schema.requests import InputError
from phoenix.stub.services.common import (
    Outputs,
    Service,
    ServiceSettings,
    action_weight_vector,
)
from phoenix.stub.services.resources import PhoenixResources, resources_for


def score_weight_vector(weights: Mapping[str, float], action_names: Sequence[str]) -> np.ndarray:
    """The ranker's blend: float32 [A] of its parsed ``score_weights`` parameter."""
    return action_weight_vector(weights, action_names, "score_weights").astype(np.float32)


def batch_widths(config, candidates: int) -> dict[str, int]:
    """Widths of a ranker batch: the newest S history items, ``candidates`` padded."""
    return {"L": config.history_seq_len, "C": candidates, **artifact_widths(config)}


def request_batch(requests: Sequence[RankerRequest], config, users: int, width: int):
    """Every request's rows stacked once and zero-padded to ``users`` x ``width`` candidates."""
    return pad_batch(requests, users, batch_widths(config, width))


def empty_request_batch(config, users: int, width: int):
    """An all-padding ranker batch of ``users`` x ``width`` candidates (warm-up, benchmarks)."""
    return empty_batch(RANKER, users, batch_widths(config, width))


RANKED_INPUTS = {  # output: the batch input it is, in ranked order
    "ranked_post_ids": "candidate_post_ids",
    "ranked_author_ids": "candidate_author_ids",
    "ranked_retrieval_scores": "candidate_retrieval_scores",  # zeros where none were sent
    "ranked_post_age_seconds": "candidate_post_age_seconds",  # UNKNOWN_AGE where none were
}
AGES = "candidate_post_age_seconds"


def ranked_columns(batch, order: np.ndarray) -> dict[str, np.ndarray]:
    """{output: [B, W] of its batch input (RANKED_INPUTS) in ranked ``order`` [B, W]}, the
    whole batch at once (per request it was three numpy calls a request)."""
    width = order.shape[1]
    columns = {
        output: np.take_along_axis(getattr(batch, name)[:, :width], order, axis=1)
        for output, name in RANKED_INPUTS.items()
    }
    ages = columns["ranked_post_age_seconds"]
    ages[~batch.sent[AGES]] = UNKNOWN_AGE  # rows that sent no ages: every age unknown
    return columns


def check_own_candidates_first(requests: Sequence[RankerRequest], ranked_ids: np.ndarray) -> None:
    """Every request's C first ranked positions hold its own candidates (post id 0 is never a
    candidate: it is padding). Padding sorts last unless a score is not finite; the split
    would then hand out padding as posts, so the batch fails instead (INTERNAL)."""
    counts = np.repeat([r.candidates for r in requests], [r.rows for r in requests])  # [R total]
    own = np.arange(ranked_ids.shape[1]) < counts[:, None]  # [R total, W]
    if (ranked_ids[: len(counts)][own] == 0).any():
        raise RuntimeError("ranker: a padding candidate ranked among a request's own candidates")


def split_ranked(requests: Sequence[RankerRequest], batch, ranked: RankedBatch) -> list[Outputs]:
    """Each request's rows of the ranked batch, its own C candidates only, best first
    (padding sorts last, so a row's first C ranked positions are its own candidates)."""
    columns = ranked_columns(batch, ranked.order)
    check_own_candidates_first(requests, columns["ranked_post_ids"])
    outputs = []
    for request, (start, stop) in zip(requests, row_spans([r.rows for r in requests])):
        rows, count = slice(start, stop), request.candidates
        outputs.append(
            {
                "ranked_post_ids": columns["ranked_post_ids"][rows, :count],  # [R, C]
                "ranked_author_ids": columns["ranked_author_ids"][rows, :count],
                "scores": ranked.scores[rows, :count],  # [R, C]
                "action_probs": ranked.action_probs[rows, :count],  # [R, C, A]
                "ranked_retrieval_scores": columns["ranked_retrieval_scores"][rows, :count],
                "ranked_post_age_seconds": columns["ranked_post_age_seconds"][rows, :count],
            }
        )
    return outputs


class RankerService(Service):
    """Ranks each user's candidates by a weighted blend of action probabilities."""

    request_type = RankerRequest

    def __init__(
        self,
        resources: PhoenixResources,
        score_weights: Mapping[str, float],
        *,
        candidate_buckets: Sequence[int],
        batch_buckets: Sequence[int],
        split_widths: bool = RANKER.parameter("split_widths").default,
        prefix_cache_mib: float = RANKER.parameter("prefix_cache_mib").default,
        prefix_cache_ttl_s: float = RANKER.parameter("prefix_cache_ttl_s").default,
        compute_dtype=None,
    ):
        self.config = resources.config
        self.split_widths = split_widths
        self.weights = score_weight_vector(score_weights, self.config.action_names)
        # Keyed by the artifacts' version label: entries of another version are never read.
        self.prefix_cache = PrefixCache.of_mib(
            prefix_cache_mib, prefix_cache_ttl_s, version=artifact_version(resources.root)
        )
        self.ranker = DeviceRanker(
            self.config.ranker_config(),
            resources.artifacts.ranker_params,
            resources.hash_embedder().table,
            entity_hashes(self.config),
            self.weights,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
            candidate_buckets=candidate_buckets,
            store=resources.programs,
            prefix_cache=self.prefix_cache,
        )
        self.batch_buckets = self.ranker.batch_buckets
        self.max_rows = self.batch_buckets[-1]

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> RankerService:
        """The original family's ranker (``catalog.build_service`` picks the service of the
        artifacts' family)."""
        return cls(
            resources_for(settings.artifact_dir, ("ranker", "tables")),
            settings.parameters["score_weights"],
            candidate_buckets=settings.parameters["candidate_buckets"],
            batch_buckets=settings.batch_buckets,
            split_widths=settings.parameters["split_widths"],
            prefix_cache_mib=settings.parameters["prefix_cache_mib"],
            prefix_cache_ttl_s=settings.parameters["prefix_cache_ttl_s"],
        )

    def admit(self, request: RankerRequest) -> RankerRequest:
        """The production family's inputs are refused: this model reads none of them, and a
        client that sends them expects them to count."""
        request = super().admit(request)
        sent = [name for name in PRODUCTION_INPUT_NAMES if getattr(request, name) is not None]
        if sent:
            raise InputError(
                f"input '{sent[0]}': read by X's production ranker family only; this ranker "
                f"is of the original family (its artifacts' config.json), which reads none of "
                f"{sent}",
                sent[0],
            )
        return request

    def warm_up(self) -> int:
        return self.ranker.warm_up(
            lambda users, width: empty_request_batch(self.config, users, width)
        )

    def run(self, requests: Sequence[RankerRequest]) -> list[Outputs]:
        return run_in_calls(requests, self.ranked_together(requests), self.rank_in_one_call)

    def ranked_together(self, requests: Sequence[RankerRequest]) -> list[list[int]]:
        return width_groups(self.ranker.padded_shape, requests, self.split_widths)

    def rank_in_one_call(self, requests: Sequence[RankerRequest]) -> list[Outputs]:
        rows = sum(r.rows for r in requests)
        users, width = self.ranker.padded_shape(rows, max(r.candidates for r in requests))
        batch = request_batch(requests, self.config, users, width)
        return split_ranked(requests, batch, self.ranker.rank(batch, rows))


def width_groups(
    padded_shape: Callable[[int, int], tuple[int, int]],
    requests: Sequence[RankerRequest],
    split_widths: bool,
) -> list[list[int]]:
    """Indices of the requests ranked in one call, in their order: all of them, or with
    ``split_widths`` those padded to the same candidate bucket (one request of 65 candidates
    would otherwise pad every request of its batch to 256). Either family's ranker."""
    if not split_widths:
        return [list(range(len(requests)))]
    by_width: dict[int, list[int]] = {}
    for index, request in enumerate(requests):
        _, width = padded_shape(request.rows, request.candidates)
        by_width.setdefault(width, []).append(index)
    return list(by_width.values())


def run_in_calls(
    requests: Sequence[RankerRequest],
    groups: list[list[int]],
    rank_in_one_call: Callable[[Sequence[RankerRequest]], list[Outputs]],
) -> list[Outputs]:
    """Each group ranked in one call, the outputs back in the requests' order."""
    outputs: list = [None] * len(requests)
    for group in groups:
        ranked = rank_in_one_call([requests[i] for i in group])
        for index, output in zip(group, ranked):
            outputs[index] = output
    return outputs
