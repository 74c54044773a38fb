"""The feed policy's service: the ranker's candidates filtered, scored by every action and
diversified by author (the maths: ``phoenix.feed_policy``; the parameters: docs/policy.md).

Parameters come from the model config (``contracts.FEED_POLICY.parameters``, generated into
``feed_policy/config.pbtxt``); a bad one stops the start-up with a message naming it. The
posts' creation times come from the corpus (its optional ``created_at`` column, unix seconds):
a post the corpus does not date is never dropped for its age.

Shape glossary (R rows of one request): C candidates, C' posts kept, A actions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from phoenix.checkpoint import load_config, load_corpus, resolve_inside
from phoenix.corpus_store import StoreFollower, is_store
from phoenix.feed_policy import FeedFilters, PolicySettings, apply_policy
from phoenix.serving.batches import stack_padded
from phoenix.serving.contracts import POLICY_PARAMETERS
from phoenix.serving.requests import PolicyRequest
from phoenix.serving.services.common import (
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
    )


def parse_settings(texts: Mapping[str, str], action_names: Sequence[str]) -> PolicySettings:
    """The checked policy settings of config strings; errors name the parameter."""
    missing = [p.name for p in POLICY_PARAMETERS if p.name not in texts]
    if missing:
        raise ValueError(f"parameters {missing} are missing (configs come from `make configs`)")
    values = {p.name: p.parse(texts[p.name]) for p in POLICY_PARAMETERS}
    return policy_settings(values, action_names)


# ----------------------------------------------------------------------------------------
# Post ages
# ----------------------------------------------------------------------------------------


class CreationTimes:
    """Each corpus post's creation time (unix seconds), looked up by post id."""

    def __init__(self, post_ids: np.ndarray, created_at: Optional[np.ndarray]):
        self.known = created_at is not None
        order = np.argsort(post_ids)
        self._ids = post_ids[order]
        self._created = None if created_at is None else created_at[order].astype(np.float64)

    def ages(self, post_ids: np.ndarray, now: float) -> Optional[np.ndarray]:
        """Seconds since each post was created, NaN for posts the corpus does not date;
        None when the corpus dates none."""
        if not self.known or len(self._ids) == 0:
            return None
        slot = np.minimum(np.searchsorted(self._ids, post_ids), len(self._ids) - 1)
        found = self._ids[slot] == post_ids
        return np.where(found, now - self._created[slot], np.nan)


class StoreCreationTimes:
    """Creation times looked up in the newest generation of a corpus store."""

    known = True

    def __init__(self, follower: StoreFollower):
        self.follower = follower

    def ages(self, post_ids: np.ndarray, now: float) -> np.ndarray:
        _, created, found = self.follower.current().lookup(post_ids)
        return np.where(found, now - created.astype(np.float64), np.nan)


def creation_times(corpus_path: Path, config) -> Union[CreationTimes, StoreCreationTimes]:
    """The creation times of a corpus file, or of a store followed while serving."""
    if is_store(corpus_path):
        return StoreCreationTimes(StoreFollower(corpus_path, config.emb_size).start())
    corpus = load_corpus(corpus_path, config)
    return CreationTimes(corpus.post_ids, corpus.created_at)


# ----------------------------------------------------------------------------------------
# The service
# ----------------------------------------------------------------------------------------


def row_filters(request: PolicyRequest, row: int, filter_own: bool, ages) -> FeedFilters:
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


class FeedPolicyService(Service):
    """Filters, scores by every action and diversifies each user's ranked candidates."""

    request_type = PolicyRequest

    def __init__(
        self,
        config,
        settings: PolicySettings,
        creation_times: Union[CreationTimes, StoreCreationTimes],
        *,
        max_batch_size: int,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.settings = settings
        self.creation_times = creation_times
        self.max_rows = max_batch_size  # no compiled shapes: numpy only
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> FeedPolicyService:
        config = load_config(settings.artifact_dir)
        policy = policy_settings(settings.parameters, config.action_names)
        corpus_path = resolve_inside(settings.artifact_dir, settings.parameters["corpus_file"])
        return cls(
            config,
            policy,
            creation_times(corpus_path, config),
            max_batch_size=settings.max_batch_size,
        )

    def warm_up(self) -> int:
        return 0  # nothing to compile

    def run(self, requests: Sequence[PolicyRequest]) -> list[Outputs]:
        now = self.clock()
        return [self.feed(request, now) for request in requests]

    def feed(self, request: PolicyRequest, now: float) -> Outputs:
        """One request's feeds, rows padded to the longest."""
        ages = None
        if request.max_age_seconds is not None:
            ages = self.creation_times.ages(request.candidate_post_ids, now)
        retrieval = request.candidate_retrieval_scores  # passed through; zeros if not sent
        if retrieval is None:
            retrieval = np.zeros(request.candidate_post_ids.shape, np.float32)
        columns = {name: [] for name in ("posts", "authors", "scores", "probs", "retrieval")}
        for row in range(request.rows):
            posts, authors = request.candidate_post_ids[row], request.candidate_author_ids[row]
            kept, scores = apply_policy(
                posts,
                authors,
                request.candidate_action_probs[row],
                self.settings,
                row_filters(request, row, self.settings.filter_own_posts, ages),
            )
            columns["posts"].append(posts[kept])
            columns["authors"].append(authors[kept])
            columns["scores"].append(scores.astype(np.float32))
            columns["probs"].append(request.candidate_action_probs[row][kept])
            columns["retrieval"].append(retrieval[row][kept])
        width = max(len(p) for p in columns["posts"])  # rows padded with post id 0

        def stacked(column: str) -> np.ndarray:  # [R, width, ...]
            return stack_padded([row[None] for row in columns[column]], width, request.rows)

        return {
            "ranked_post_ids": stacked("posts"),
            "scores": stacked("scores"),
            "action_probs": stacked("probs"),
            "ranked_author_ids": stacked("authors"),
            "ranked_retrieval_scores": stacked("retrieval"),
        }
