"""Typed requests of the served models: one object per Triton request, fields named as the
contract names the inputs (no Triton imports).

Triton has already checked each input against the model's ``config.pbtxt`` (generated from
the contract): its name, dtype, rank and fixed dims, that required inputs are present and that
the batch size is within ``max_batch_size``. What Triton cannot know is checked here, per
request: lengths that must agree across inputs, the per-request limits, id and value ranges,
NaN and infinities, and sizes fixed by the loaded artifacts (actions, surfaces, embedding
width). Every failure is an ``InputError`` naming the input and what was expected; the Triton
adapter answers it with INVALID_ARG for that request alone.

Shape glossary (R rows of one request: users or posts)
  L  history items sent   C  candidates sent   A  num_actions   D  emb_size
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional, TypeVar

import numpy as np

from phoenix.serving import contracts
from phoenix.serving.contracts import LIMITS, ModelContract
from phoenix.serving.input_error import InputError  # raised here; re-exported

Request = TypeVar("Request")


def from_arrays(request_type: type[Request], arrays: Mapping[str, np.ndarray]) -> Request:
    """The typed request of ``arrays`` ({input name: array}), cast to the contract's dtypes.

    Triton refuses unknown and missing inputs before a request gets here; in-process callers
    (benchmarks, ``--check``) get the same refusal as an InputError.
    """
    contract: ModelContract = request_type.contract
    unknown = sorted(set(arrays) - set(contract.input_names))
    if unknown:
        raise InputError(f"unknown inputs {unknown}; {contract.name} takes {contract.input_names}")
    missing = [name for name in contract.required_inputs if name not in arrays]
    if missing:
        raise InputError(f"missing required inputs {missing} of {contract.name}")
    return request_type(
        **{
            spec.name: np.asarray(arrays[spec.name], spec.dtype)
            for spec in contract.inputs
            if spec.name in arrays
        }
    )


# ----------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------


def present(request, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """{name: array} of the named fields the request carries (absent optional ones left out)."""
    values = {name: getattr(request, name, None) for name in names}
    return {name: array for name, array in values.items() if array is not None}


def check_rows(arrays: Mapping[str, np.ndarray], rows: int) -> None:
    """Every array has the request's ``rows`` rows (the batch dimension)."""
    wrong = {name: array.shape[0] for name, array in arrays.items() if array.shape[0] != rows}
    if wrong:
        raise InputError(f"inputs {sorted(wrong)} have {wrong} rows; the request has {rows}")


def check_same_shape(arrays: Mapping[str, np.ndarray], what: str, rows: int) -> int:
    """Every array has ``rows`` rows and all share one length (axis 1); returns the length."""
    check_rows(arrays, rows)
    lengths = {name: array.shape[1] for name, array in arrays.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(f"{what} inputs must have the same length, got {lengths}")
    return next(iter(lengths.values()))


def check_limit(name: str, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise InputError(f"input '{name}': {size} {what}, at most {limit} allowed", name)


def check_ids(name: str, ids: np.ndarray, minimum: int = 0) -> None:
    if ids.size and ids.min() < minimum:
        raise InputError(f"input '{name}': ids must be >= {minimum}, got {int(ids.min())}", name)


def check_finite(name: str, values: np.ndarray) -> None:
    if not np.all(np.isfinite(values)):
        raise InputError(f"input '{name}': contains NaN or infinite values", name)


def check_range(name: str, values: np.ndarray, low: float, high: float, what: str) -> None:
    """Finite values in [low, high]."""
    check_finite(name, values)
    if values.size and (values.min() < low or values.max() > high):
        raise InputError(
            f"input '{name}': {what} must lie in [{low}, {high}], "
            f"got values in [{values.min()}, {values.max()}]",
            name,
        )


def check_width(name: str, array: np.ndarray, axis: int, expected: int, what: str) -> None:
    if array.shape[axis] != expected:
        raise InputError(
            f"input '{name}': expected {expected} {what}, got shape {tuple(array.shape)}", name
        )


# ----------------------------------------------------------------------------------------
# The requests
# ----------------------------------------------------------------------------------------

_HISTORY = (
    "history_post_ids",
    "history_author_ids",
    "history_actions",
    "history_product_surface",
)


@dataclass(frozen=True, kw_only=True)
class UserRequest:
    """``user_encoder``: R users, each with a history of L items, oldest first."""

    contract = contracts.USER_ENCODER

    user_id: np.ndarray  # [R, 1] int64
    history_post_ids: np.ndarray  # [R, L] int64
    history_author_ids: np.ndarray  # [R, L] int64
    history_actions: np.ndarray  # [R, L, A] float32 flags
    history_product_surface: np.ndarray  # [R, L] int32

    @property
    def rows(self) -> int:
        return self.user_id.shape[0]

    def check(self, config) -> None:
        """Values against the limits and the artifact ``config`` (actions, surfaces)."""
        history = present(self, (*_HISTORY, "history_dwell_seconds"))
        length = check_same_shape(history, "history", self.rows)
        check_limit("history_post_ids", length, LIMITS.max_history_items, "history items")
        check_width(
            "history_actions", self.history_actions, 2, config.num_actions, "actions per item"
        )
        check_ids("user_id", self.user_id)
        check_ids("history_post_ids", self.history_post_ids)
        check_ids("history_author_ids", self.history_author_ids)
        check_range("history_actions", self.history_actions, 0, 1, "action flags")
        surfaces = config.product_surface_vocab_size - 1
        check_range(
            "history_product_surface", self.history_product_surface, 0, surfaces, "surfaces"
        )
        if "history_dwell_seconds" in history:
            check_range(
                "history_dwell_seconds", history["history_dwell_seconds"], 0, np.inf, "dwell"
            )


_CANDIDATES = (
    "candidate_post_ids",
    "candidate_author_ids",
    "candidate_product_surface",
    "candidate_post_age_seconds",
    "candidate_retrieval_scores",
)


@dataclass(frozen=True, kw_only=True)
class RankRequest(UserRequest):
    """``ranker``: R users with their histories and C candidates each."""

    contract = contracts.RANKER

    history_dwell_seconds: Optional[np.ndarray] = None  # [R, L] float32 seconds
    candidate_post_ids: np.ndarray  # [R, C] int64
    candidate_author_ids: np.ndarray  # [R, C] int64
    candidate_product_surface: Optional[np.ndarray] = None  # [R, C] int32
    candidate_post_age_seconds: Optional[np.ndarray] = None  # [R, C] float32
    candidate_retrieval_scores: Optional[np.ndarray] = None  # [R, C] float32, passed through

    @property
    def candidates(self) -> int:
        return self.candidate_post_ids.shape[1]

    def check(self, config) -> None:
        super().check(config)
        candidates = present(self, _CANDIDATES)
        count = check_same_shape(candidates, "candidate", self.rows)
        check_limit("candidate_post_ids", count, LIMITS.max_candidates, "candidates")
        check_ids("candidate_post_ids", self.candidate_post_ids, minimum=1)
        check_ids("candidate_author_ids", self.candidate_author_ids)
        if self.candidate_product_surface is not None:
            surfaces = config.product_surface_vocab_size - 1
            check_range(
                "candidate_product_surface", self.candidate_product_surface, 0, surfaces, "surfaces"
            )
        for name in ("candidate_post_age_seconds", "candidate_retrieval_scores"):
            if name in candidates:
                check_finite(name, candidates[name])


@dataclass(frozen=True, kw_only=True)
class CandidateRequest:
    """``candidate_tower``: R posts with their authors."""

    contract = contracts.CANDIDATE_TOWER

    post_id: np.ndarray  # [R, 1] int64
    author_id: np.ndarray  # [R, 1] int64

    @property
    def rows(self) -> int:
        return self.post_id.shape[0]

    def check(self, config) -> None:
        check_same_shape({"post_id": self.post_id, "author_id": self.author_id}, "id", self.rows)
        check_ids("post_id", self.post_id, minimum=1)
        check_ids("author_id", self.author_id)


@dataclass(frozen=True, kw_only=True)
class RetrieveRequest:
    """``retriever``: R user vectors, how many posts each wants, and the posts to leave out."""

    contract = contracts.RETRIEVER

    user_embedding: np.ndarray  # [R, D] float32
    top_k: np.ndarray  # [R, 1] int32
    history_post_ids: Optional[np.ndarray] = None  # [R, L] int64, excluded from the results

    @property
    def rows(self) -> int:
        return self.user_embedding.shape[0]

    def check(self, config) -> None:
        check_rows(present(self, ("top_k", "history_post_ids")), self.rows)
        check_width("user_embedding", self.user_embedding, 1, config.emb_size, "values per row")
        check_finite("user_embedding", self.user_embedding)
        check_range("top_k", self.top_k, 1, LIMITS.max_top_k, "top_k")
        if self.history_post_ids is not None:
            check_ids("history_post_ids", self.history_post_ids)
            length = self.history_post_ids.shape[1]
            check_limit("history_post_ids", length, LIMITS.max_history_items, "ids")


_POLICY_CANDIDATES = (
    "candidate_post_ids",
    "candidate_author_ids",
    "candidate_action_probs",
    "candidate_retrieval_scores",
)


@dataclass(frozen=True, kw_only=True)
class PolicyRequest:
    """``feed_policy``: R users, each with C ranked candidates and the feed's filters."""

    contract = contracts.FEED_POLICY

    user_id: np.ndarray  # [R, 1] int64
    candidate_post_ids: np.ndarray  # [R, C] int64, the ranker's order
    candidate_author_ids: np.ndarray  # [R, C] int64
    candidate_action_probs: np.ndarray  # [R, C, A] float32
    candidate_retrieval_scores: Optional[np.ndarray] = None  # [R, C] float32, passed through
    excluded_author_ids: Optional[np.ndarray] = None  # [R, E] int64
    seen_post_ids: Optional[np.ndarray] = None  # [R, N] int64
    max_age_seconds: Optional[np.ndarray] = None  # [R, 1] float32

    @property
    def rows(self) -> int:
        return self.user_id.shape[0]

    def check(self, config) -> None:
        candidates = present(self, _POLICY_CANDIDATES)
        count = check_same_shape(candidates, "candidate", self.rows)
        check_limit("candidate_post_ids", count, LIMITS.max_candidates, "candidates")
        check_ids("candidate_post_ids", self.candidate_post_ids, minimum=1)
        check_ids("candidate_author_ids", self.candidate_author_ids)
        probs = self.candidate_action_probs
        check_width("candidate_action_probs", probs, 2, config.num_actions, "actions per post")
        check_range("candidate_action_probs", probs, 0, 1, "probabilities")
        if self.candidate_retrieval_scores is not None:
            check_finite("candidate_retrieval_scores", self.candidate_retrieval_scores)
        filters = present(self, ("excluded_author_ids", "seen_post_ids", "max_age_seconds"))
        check_rows(filters, self.rows)
        for name in ("excluded_author_ids", "seen_post_ids"):
            if name in filters:
                check_limit(name, filters[name].shape[1], LIMITS.max_filter_ids, "ids")
                check_ids(name, filters[name])
        if self.max_age_seconds is not None:
            check_range("max_age_seconds", self.max_age_seconds, 0, np.inf, "ages in seconds")


def parse(request_type: type[Request], arrays: Mapping[str, np.ndarray], config) -> Request:
    """The checked typed request of ``arrays``; raises InputError."""
    request = from_arrays(request_type, arrays)
    request.check(config)
    return request
