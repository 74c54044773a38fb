"""The feed policy's service: the ranker's candidates filtered, scored by every action and
diversified by author (the maths: ``phoenix.feed_policy``; the parameters: docs/policy.md).

Parameters come from the model config (``contracts.FEED_POLICY.parameters``, generated into
``feed_policy/config.pbtxt``); a bad one stops the start-up with a message naming it. The
posts' creation times come from the corpus the retriever reads (``serving.corpus``: a file's
optional ``created_at`` column, unix seconds, or a store's), unless the request sends the ages
(``candidate_post_age_seconds``, as recommend's chain does with the retriever's): a post of
unknown age is never dropped for its age.

A candidate is in-network when the request's ``in_network_post_ids`` (the user state's
followed authors' newest posts) hold it; without that input none is, and every score is
multiplied by ``out_of_network_factor`` (which changes no order). Each returned post carries its
``in_network`` flag.

Shape glossary (R rows of one request): C candidates, C' posts kept, A actions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from phoenix.checkpoint import load_config
from phoenix.feed_policy import (
    FILTERS,
    FeedFilters,
    PolicySettings,
    dropped_counts,
    filter_masks,
    passes_all,
    rank_kept,
)
from phoenix.schema.batches import stack_padded
from phoenix.schema.contracts import FEED_POLICY, POLICY_PARAMETERS
from phoenix.schema.request_types import FeedPolicyRequest
from phoenix.schema.spec import parsed_values
from phoenix.stub.corpus import ServedCorpus, open_corpus
from phoenix.stub.services.common import (
    Outputs,
    Service,
    ServiceSettings,
    action_weight_vector,
)

# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------


def policy_settings(values: Mapping[str, Any], action_names: Sequence[str]) -> PolicySettings:
    """The policy settings of parsed parameters ({name: typed value}, the contract's
    ``POLICY_PARAMETERS``); the weights are checked against the artifact's actions."""
    return PolicySettings(
        action_weights=action_weight_vector(
            values["action_weights"], action_names, "action_weights"
        ),
        negative_scores_offset=values["negative_scores_offset"],
        author_diversity_decay=values["author_diversity_decay"],
        author_diversity_floor=values["author_diversity_floor"],
        filter_own_posts=values["filter_own_posts"],
        out_of_network_factor=values["out_of_network_factor"],
    )


def parse_settings(texts: Mapping[str, str], action_names: Sequence[str]) -> PolicySettings:
    """The checked policy settings of config strings; errors name the parameter."""
    values = parsed_values(FEED_POLICY.name, POLICY_PARAMETERS, texts)
    return policy_settings(values, action_names)


# ----------------------------------------------------------------------------------------
# The service
# ----------------------------------------------------------------------------------------


def row_filters(request: FeedPolicyRequest, row: int, filter_own: bool, ages) -> FeedFilters:
    """The filters of one user row of a request (absent inputs: that filter is off)."""

    def ids(name: str) -> Optional[np.ndarray]:
        value = getattr(request, name)
        return None if value is None else value[row]

    max_age = request.max_age_seconds
    return FeedFilters(
        user_id=int(request.user_id[row, 0]) if filter_own else None,
        excluded_author_ids=ids("excluded_author_ids"),
        seen_post_ids=ids("seen_post_ids"),
        max_age_seconds=None if max_age is None else float(max_age[row, 0]),
        post_ages_seconds=None if ages is None else ages[row],
    )


def in_network_flags(request: FeedPolicyRequest, row: int) -> np.ndarray:
    """[C] True for the candidates of ``row`` among its in-network posts (padding 0 matches no
    candidate: post ids are >= 1)."""
    posts = request.candidate_post_ids[row]
    if request.in_network_post_ids is None:
        return np.zeros(posts.shape, bool)
    return np.isin(posts, request.in_network_post_ids[row])


class FeedPolicyService(Service):
    """Filters, scores by every action and diversifies each user's ranked candidates."""

    request_type = FeedPolicyRequest

    def __init__(
        self,
        config,
        settings: PolicySettings,
        corpus: ServedCorpus,
        *,
        max_batch_size: int,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.settings = settings
        self.corpus = corpus  # what dates the posts
        self.max_rows = max_batch_size  # no compiled shapes: numpy only
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> FeedPolicyService:
        config = load_config(settings.artifact_dir)
        policy = policy_settings(settings.parameters, config.action_names)
        corpus = open_corpus(settings.artifact_dir, settings.parameters["corpus_file"], config)
        return cls(
            config,
            policy,
            corpus,
            max_batch_size=settings.max_batch_size,
        )

    def warm_up(self) -> int:
        return 0  # nothing to compile

    def run(self, requests: Sequence[FeedPolicyRequest]) -> list[Outputs]:
        now = self.clock()
        return [self.feed(request, now) for request in requests]

    def ages(self, request: FeedPolicyRequest, now: float) -> np.ndarray:
        """Each candidate's age [R, C], NaN where unknown: the request's own (an ages input,
        e.g. the retriever's, handed on by the ranker in recommend's chain), else the
        corpus's."""
        sent = request.candidate_post_age_seconds
        if sent is None:
            return self.corpus.ages(request.candidate_post_ids, now)
        return np.where(sent < 0, np.nan, sent.astype(np.float64))  # UNKNOWN_AGE: unknown

    def feed(self, request: FeedPolicyRequest, now: float) -> Outputs:
        """One request's feeds, rows padded to the longest."""
        ages = None
        if request.max_age_seconds is not None:
            ages = self.ages(request, now)
        retrieval = request.candidate_retrieval_scores  # passed through; zeros if not sent
        if retrieval is None:
            retrieval = np.zeros(request.candidate_post_ids.shape, np.float32)
        columns: dict[str, list] = {
            name: [] for name in ("posts", "authors", "scores", "probs", "retrieval", "in_network")
        }
        dropped = np.zeros((request.rows, len(FILTERS)), np.int32)  # [R, F]
        for row in range(request.rows):
            posts, authors = request.candidate_post_ids[row], request.candidate_author_ids[row]
            probs = request.candidate_action_probs[row]
            filters = row_filters(request, row, self.settings.filter_own_posts, ages)
            masks = filter_masks(posts, authors, filters)
            in_network = in_network_flags(request, row)
            kept, scores = rank_kept(
                np.flatnonzero(passes_all(masks)), authors, probs, self.settings, in_network
            )
            dropped[row] = dropped_counts(masks)
            columns["posts"].append(posts[kept])
            columns["authors"].append(authors[kept])
            columns["scores"].append(scores.astype(np.float32))
            columns["probs"].append(probs[kept])
            columns["retrieval"].append(retrieval[row][kept])
            columns["in_network"].append(in_network[kept].astype(np.int8))
        width = max(len(p) for p in columns["posts"])  # rows padded with post id 0

        def stacked(column: str) -> np.ndarray:  # [R, width, ...]
            return stack_padded([row[None] for row in columns[column]], width, request.rows)

        return {
            "ranked_post_ids": stacked("posts"),
            "scores": stacked("scores"),
            "action_probs": stacked("probs"),
            "ranked_author_ids": stacked("authors"),
            "ranked_retrieval_scores": stacked("retrieval"),
            "filtered_counts": dropped,
            "in_network": stacked("in_network"),
        }
