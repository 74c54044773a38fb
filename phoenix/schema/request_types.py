"""Typed requests, one frozen dataclass per served model with a service (fields: its
contract's inputs). Written by ``python -m phoenix.ops.request_code``: do not edit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

import numpy as np

from phoenix.schema.contracts import (
    CANDIDATE_TOWER,
    FEED_POLICY,
    RANKER,
    RETRIEVER,
    SERVED_LOG,
    USER_ENCODER,
    USER_STATE,
)
from phoenix.schema.recommend import (
    RECOMMEND_CHAIN,
)
from phoenix.schema.requests import ContractChecks, TypedRequest
from phoenix.schema.spec import ModelContract


@dataclass(frozen=True, kw_only=True)
class UserStateRequest(TypedRequest):
    """``user_state``'s request."""

    contract: ClassVar[ModelContract] = USER_STATE
    checks: ClassVar[ContractChecks] = ContractChecks.of(USER_STATE)

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: Optional[np.ndarray] = None  # [R, L] int64
    history_author_ids: Optional[np.ndarray] = None  # [R, L] int64
    history_actions: Optional[np.ndarray] = None  # [R, L, A] float32
    history_product_surface: Optional[np.ndarray] = None  # [R, L] int32
    history_dwell_seconds: Optional[np.ndarray] = None  # [R, L] float32
    history_impression_time: Optional[np.ndarray] = None  # [R, L] int64
    history_creation_time: Optional[np.ndarray] = None  # [R, L] int64
    history_timezone: Optional[np.ndarray] = None  # [R, L] int32
    history_hour_of_day: Optional[np.ndarray] = None  # [R, L] int32
    history_semantic_ids: Optional[np.ndarray] = None  # [R, L, 6] int32
    country: Optional[np.ndarray] = None  # [R, 1] int32
    language: Optional[np.ndarray] = None  # [R, 1] int32
    latitude: Optional[np.ndarray] = None  # [R, 1] float32
    longitude: Optional[np.ndarray] = None  # [R, 1] float32
    installed_apps: Optional[np.ndarray] = None  # [R, 64] int8
    profile_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender_score: Optional[np.ndarray] = None  # [R, 1] float32
    age_bracket: Optional[np.ndarray] = None  # [R, 1] int32
    age_years: Optional[np.ndarray] = None  # [R, 1] float32
    timezone: Optional[np.ndarray] = None  # [R, 1] int32
    request_timezone: Optional[np.ndarray] = None  # [R, 1] int32
    request_hour_of_day: Optional[np.ndarray] = None  # [R, 1] int32


@dataclass(frozen=True, kw_only=True)
class UserEncoderRequest(TypedRequest):
    """``user_encoder``'s request."""

    contract: ClassVar[ModelContract] = USER_ENCODER
    checks: ClassVar[ContractChecks] = ContractChecks.of(USER_ENCODER)

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: np.ndarray  # [R, L] int64
    history_author_ids: np.ndarray  # [R, L] int64
    history_actions: np.ndarray  # [R, L, A] float32
    history_product_surface: np.ndarray  # [R, L] int32


@dataclass(frozen=True, kw_only=True)
class CandidateTowerRequest(TypedRequest):
    """``candidate_tower``'s request."""

    contract: ClassVar[ModelContract] = CANDIDATE_TOWER
    checks: ClassVar[ContractChecks] = ContractChecks.of(CANDIDATE_TOWER)

    post_id: np.ndarray  # [R, 1] int64
    author_id: np.ndarray  # [R, 1] int64


@dataclass(frozen=True, kw_only=True)
class RetrieverRequest(TypedRequest):
    """``retriever``'s request."""

    contract: ClassVar[ModelContract] = RETRIEVER
    checks: ClassVar[ContractChecks] = ContractChecks.of(RETRIEVER)

    user_embedding: np.ndarray  # [R, D] float32
    top_k: np.ndarray  # [R, 1] int32
    history_post_ids: Optional[np.ndarray] = None  # [R, L] int64
    excluded_post_ids: Optional[np.ndarray] = None  # [R, N] int64
    in_network_post_ids: Optional[np.ndarray] = None  # [R, M] int64
    in_network_author_ids: Optional[np.ndarray] = None  # [R, M] int64
    request_timezone: Optional[np.ndarray] = None  # [R, 1] int32
    request_hour_of_day: Optional[np.ndarray] = None  # [R, 1] int32


@dataclass(frozen=True, kw_only=True)
class RankerRequest(TypedRequest):
    """``ranker``'s request."""

    contract: ClassVar[ModelContract] = RANKER
    checks: ClassVar[ContractChecks] = ContractChecks.of(RANKER)

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: np.ndarray  # [R, L] int64
    history_author_ids: np.ndarray  # [R, L] int64
    history_actions: np.ndarray  # [R, L, A] float32
    history_product_surface: np.ndarray  # [R, L] int32
    history_dwell_seconds: Optional[np.ndarray] = None  # [R, L] float32
    candidate_post_ids: np.ndarray  # [R, C] int64
    candidate_author_ids: np.ndarray  # [R, C] int64
    candidate_product_surface: Optional[np.ndarray] = None  # [R, C] int32
    candidate_post_age_seconds: Optional[np.ndarray] = None  # [R, C] float32
    candidate_retrieval_scores: Optional[np.ndarray] = None  # [R, C] float32
    history_impression_time: Optional[np.ndarray] = None  # [R, L] int64
    history_creation_time: Optional[np.ndarray] = None  # [R, L] int64
    history_timezone: Optional[np.ndarray] = None  # [R, L] int32
    history_hour_of_day: Optional[np.ndarray] = None  # [R, L] int32
    history_semantic_ids: Optional[np.ndarray] = None  # [R, L, 6] int32
    candidate_timezone: Optional[np.ndarray] = None  # [R, C] int32
    candidate_hour_of_day: Optional[np.ndarray] = None  # [R, C] int32
    candidate_semantic_ids: Optional[np.ndarray] = None  # [R, C, 6] int32
    country: Optional[np.ndarray] = None  # [R, 1] int32
    language: Optional[np.ndarray] = None  # [R, 1] int32
    latitude: Optional[np.ndarray] = None  # [R, 1] float32
    longitude: Optional[np.ndarray] = None  # [R, 1] float32
    installed_apps: Optional[np.ndarray] = None  # [R, 64] int8
    profile_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender_score: Optional[np.ndarray] = None  # [R, 1] float32
    age_bracket: Optional[np.ndarray] = None  # [R, 1] int32
    age_years: Optional[np.ndarray] = None  # [R, 1] float32
    timezone: Optional[np.ndarray] = None  # [R, 1] int32


@dataclass(frozen=True, kw_only=True)
class FeedPolicyRequest(TypedRequest):
    """``feed_policy``'s request."""

    contract: ClassVar[ModelContract] = FEED_POLICY
    checks: ClassVar[ContractChecks] = ContractChecks.of(FEED_POLICY)

    user_id: np.ndarray  # [R, 1] int64
    candidate_post_ids: np.ndarray  # [R, C] int64
    candidate_author_ids: np.ndarray  # [R, C] int64
    candidate_action_probs: np.ndarray  # [R, C, A] float32
    candidate_retrieval_scores: Optional[np.ndarray] = None  # [R, C] float32
    candidate_post_age_seconds: Optional[np.ndarray] = None  # [R, C] float32
    excluded_author_ids: Optional[np.ndarray] = None  # [R, E] int64
    seen_post_ids: Optional[np.ndarray] = None  # [R, N] int64
    max_age_seconds: Optional[np.ndarray] = None  # [R, 1] float32
    in_network_post_ids: Optional[np.ndarray] = None  # [R, M] int64


@dataclass(frozen=True, kw_only=True)
class ServedLogRequest(TypedRequest):
    """``served_log``'s request."""

    contract: ClassVar[ModelContract] = SERVED_LOG
    checks: ClassVar[ContractChecks] = ContractChecks.of(SERVED_LOG)

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: np.ndarray  # [R, L] int64
    history_author_ids: np.ndarray  # [R, L] int64
    history_actions: np.ndarray  # [R, L, A] float32
    history_product_surface: np.ndarray  # [R, L] int32
    history_dwell_seconds: np.ndarray  # [R, L] float32
    sent_history_post_ids: Optional[np.ndarray] = None  # [R, L] int64
    candidate_post_ids: np.ndarray  # [R, K] int64
    candidate_author_ids: np.ndarray  # [R, K] int64
    candidate_retrieval_scores: np.ndarray  # [R, K] float32
    ranked_post_ids: np.ndarray  # [R, C'] int64
    ranked_author_ids: np.ndarray  # [R, C'] int64
    scores: np.ndarray  # [R, C'] float32
    retrieval_scores: np.ndarray  # [R, C'] float32
    action_probs: np.ndarray  # [R, C', A] float32
    in_network: np.ndarray  # [R, C'] int8
    filtered_counts: np.ndarray  # [R, 5] int32


@dataclass(frozen=True, kw_only=True)
class RecommendChainRequest(TypedRequest):
    """``recommend_chain``'s request."""

    contract: ClassVar[ModelContract] = RECOMMEND_CHAIN
    checks: ClassVar[ContractChecks] = ContractChecks.of(RECOMMEND_CHAIN)

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: Optional[np.ndarray] = None  # [R, L] int64
    history_author_ids: Optional[np.ndarray] = None  # [R, L] int64
    history_actions: Optional[np.ndarray] = None  # [R, L, A] float32
    history_product_surface: Optional[np.ndarray] = None  # [R, L] int32
    history_dwell_seconds: Optional[np.ndarray] = None  # [R, L] float32
    top_k: np.ndarray  # [R, 1] int32
    excluded_author_ids: Optional[np.ndarray] = None  # [R, E] int64
    seen_post_ids: Optional[np.ndarray] = None  # [R, N] int64
    max_age_seconds: Optional[np.ndarray] = None  # [R, 1] float32
    history_impression_time: Optional[np.ndarray] = None  # [R, L] int64
    history_creation_time: Optional[np.ndarray] = None  # [R, L] int64
    history_timezone: Optional[np.ndarray] = None  # [R, L] int32
    history_hour_of_day: Optional[np.ndarray] = None  # [R, L] int32
    history_semantic_ids: Optional[np.ndarray] = None  # [R, L, 6] int32
    country: Optional[np.ndarray] = None  # [R, 1] int32
    language: Optional[np.ndarray] = None  # [R, 1] int32
    latitude: Optional[np.ndarray] = None  # [R, 1] float32
    longitude: Optional[np.ndarray] = None  # [R, 1] float32
    installed_apps: Optional[np.ndarray] = None  # [R, 64] int8
    profile_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender: Optional[np.ndarray] = None  # [R, 1] int32
    inferred_gender_score: Optional[np.ndarray] = None  # [R, 1] float32
    age_bracket: Optional[np.ndarray] = None  # [R, 1] int32
    age_years: Optional[np.ndarray] = None  # [R, 1] float32
    timezone: Optional[np.ndarray] = None  # [R, 1] int32
    request_timezone: Optional[np.ndarray] = None  # [R, 1] int32
    request_hour_of_day: Optional[np.ndarray] = None  # [R, 1] int32
    record: Optional[np.ndarray] = None  # [R, 1] int8


# {model: its request type}, every served model with a service.
REQUEST_TYPES: dict[str, type[TypedRequest]] = {
    USER_STATE.name: UserStateRequest,
    USER_ENCODER.name: UserEncoderRequest,
    CANDIDATE_TOWER.name: CandidateTowerRequest,
    RETRIEVER.name: RetrieverRequest,
    RANKER.name: RankerRequest,
    FEED_POLICY.name: FeedPolicyRequest,
    SERVED_LOG.name: ServedLogRequest,
    RECOMMEND_CHAIN.name: RecommendChainRequest,
}
