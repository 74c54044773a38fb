"""The contract of every served model, written once: inputs, outputs, batch sizes, limits.

Every ``model_repository/<model>/config.pbtxt`` is generated from its contract here and a
deployment profile (``profiles``) by ``configs`` (``make configs``); a test fails when a
committed config differs from the generated one. Everything else reads the contract too: the
client helpers build their request tensors from it, the load test and the benchmarks take
model names, batch sizes and the recommend chain from it, and the services name their typed
request fields after its inputs.

Per input (``TensorSpec``):

    name          the tensor's name on the wire
    dtype         numpy dtype (``triton_dtype`` "INT64", ``config_dtype`` "TYPE_INT64")
    dims          shape without the batch dimension; -1 is any length
    optional      the request may leave it out
    ragged        ``allow_ragged_batch``: requests of different lengths share one batch

Shapes in the glossary below have a leading batch dimension R (rows: users or posts) on the
wire:  L history items,  C candidates,  K retrieved posts,  D emb_size,  A num_actions.

Limits (``LIMITS``) are per request; larger requests get INVALID_ARG. The candidate limit is
the ranker's largest candidate bucket, so a request never needs a shape compiled on demand.

Batch buckets (``ModelContract.batch_buckets``) are the batch sizes a model compiles for: the
powers of two up to its ``max_batch_size``, which Triton's dynamic batcher never exceeds.

This module imports numpy and tritonclient's dtype helper only, so clients, the load test and
the model stubs can all read it cheaply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from tritonclient.utils import np_to_triton_dtype

# ----------------------------------------------------------------------------------------
# Types
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a model."""

    name: str
    dtype: np.dtype
    dims: tuple[int, ...]  # without the batch dimension; -1: any length
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch

    @property
    def triton_dtype(self) -> str:
        """The KServe v2 datatype, e.g. "INT64"."""
        return np_to_triton_dtype(self.dtype)

    @property
    def config_dtype(self) -> str:
        """The data_type of config.pbtxt, e.g. "TYPE_INT64"."""
        return f"TYPE_{self.triton_dtype}"

    @property
    def ndim(self) -> int:
        """Dimensions on the wire, batch dimension included."""
        return 1 + len(self.dims)


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: which model, fed from and feeding which ensemble tensors."""

    model: str
    input_map: Mapping[str, str]  # the model's input name -> ensemble tensor name
    output_map: Mapping[str, str]  # the model's output name -> ensemble tensor name


@dataclass(frozen=True)
class ModelContract:
    """What a served model accepts and returns."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    backend: Optional[str] = "python"
    platform: Optional[str] = None  # "ensemble" for ensembles (then no backend)
    steps: tuple[EnsembleStep, ...] = ()  # ensembles only, in order
    # Config parameters the model reads at start-up, with their defaults (profiles add more).
    parameters: Mapping[str, str] = field(default_factory=dict)

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, f"{self.name} input")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs if not spec.optional)

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Powers of two up to max_batch_size (the batch sizes compiled at start-up)."""
        return powers_of_two_up_to(self.max_batch_size)

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    def step(self, model: str) -> EnsembleStep:
        for step in self.steps:
            if step.model == model:
                return step
        raise KeyError(f"{self.name} has no step running {model!r}")


@dataclass(frozen=True)
class Limits:
    """Hard per-request limits (documented in README and SECURITY.md)."""

    max_history_items: int  # longer histories are refused; the newest S are used
    max_candidates: int  # per user row of a ranker request
    max_top_k: int
    max_rows: int  # batch rows in one request (candidate_tower posts, users)
    max_filter_ids: int  # excluded authors or seen posts per user row of a feed request


def _by_name(specs: tuple[TensorSpec, ...], name: str, what: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(f"no {what} named {name!r}")


def powers_of_two_up_to(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself when it is no power of two."""
    buckets = [1]
    while buckets[-1] * 2 <= limit:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] != limit and limit > 1:
        buckets.append(limit)
    return tuple(buckets)


def _spec(name, dtype, dims, optional=False, ragged=False) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype), tuple(dims), optional, ragged)


# ----------------------------------------------------------------------------------------
# Limits and buckets
# ----------------------------------------------------------------------------------------

# Candidate counts the ranker compiles for; the largest is the per-user maximum.
RANKER_CANDIDATE_BUCKETS = (16, 64, 256, 512, 1024)

# The ranker's default blend of action probabilities, by the artifact's action names.
RANKER_SCORE_WEIGHTS = {
    "favorite": 1.0,
    "reply": 13.5,
    "repost": 1.0,
    "quote": 2.0,
    "dwell": 0.5,
    "vqv": 0.3,
}

# The feed policy after the ranker (``feed_policy``; docs/policy.md says what each parameter
# does and why its default is what it is). Weights are per action name, over every action the
# model predicts: the four negative actions push a post down. Positive weights follow the
# ranker's blend (reply the strongest signal) and add the other positive actions with small
# weights; negative weights are large because their probabilities are small and a block or
# report costs the feed far more than one more favorite earns.
POLICY_ACTION_WEIGHTS = {
    "favorite": 1.0,
    "reply": 13.5,
    "repost": 1.0,
    "photo_expand": 0.1,
    "click": 0.3,
    "profile_click": 0.2,
    "vqv": 0.3,
    "share": 1.0,
    "share_via_dm": 1.0,
    "share_via_copy_link": 1.0,
    "dwell": 0.5,
    "quote": 2.0,
    "quoted_click": 0.1,
    "follow_author": 2.0,
    "not_interested": -10.0,
    "block_author": -40.0,
    "mute_author": -20.0,
    "report": -80.0,
    "dwell_time": 0.0,
}
POLICY_PARAMETERS = {
    "action_weights": json.dumps(POLICY_ACTION_WEIGHTS),
    "negative_scores_offset": "0.1",
    "author_diversity_decay": "0.5",
    "author_diversity_floor": "0.1",
    "filter_own_posts": "true",
}
# The retriever's corpus, which also holds the posts' creation times the age filter reads.
CORPUS_PARAMETERS = {"corpus_file": "corpus.npz"}

LIMITS = Limits(
    max_history_items=4096,
    max_candidates=RANKER_CANDIDATE_BUCKETS[-1],
    max_top_k=1024,
    max_rows=4096,
    max_filter_ids=4096,
)

# ----------------------------------------------------------------------------------------
# Tensors shared by several models
# ----------------------------------------------------------------------------------------

USER_ID = _spec("user_id", np.int64, [1])


def history_inputs(ragged: bool) -> tuple[TensorSpec, ...]:
    """One user's history, oldest to newest: post, author, actions [L, A], surface."""
    return (
        _spec("history_post_ids", np.int64, [-1], ragged=ragged),
        _spec("history_author_ids", np.int64, [-1], ragged=ragged),
        _spec("history_actions", np.float32, [-1, -1], ragged=ragged),
        _spec("history_product_surface", np.int32, [-1], ragged=ragged),
    )


TOP_K = _spec("top_k", np.int32, [1])
RANKED_OUTPUTS = (
    _spec("ranked_post_ids", np.int64, [-1]),  # [C]
    _spec("scores", np.float32, [-1]),  # [C]
    _spec("action_probs", np.float32, [-1, -1]),  # [C, A]
)
RANKED_AUTHOR_IDS = _spec("ranked_author_ids", np.int64, [-1])  # [C], the author of each post

# The feed filters a recommend request may carry (all optional, per user row).
FEED_FILTERS = (
    _spec("excluded_author_ids", np.int64, [-1], optional=True, ragged=True),  # blocked, muted
    _spec("seen_post_ids", np.int64, [-1], optional=True, ragged=True),  # seen or served
    _spec("max_age_seconds", np.float32, [1], optional=True),  # older posts are dropped
)

# ----------------------------------------------------------------------------------------
# The models
# ----------------------------------------------------------------------------------------

USER_ENCODER = ModelContract(
    name="user_encoder",
    inputs=(USER_ID, *history_inputs(ragged=True)),
    outputs=(_spec("user_embedding", np.float32, [-1]),),  # [D], unit norm
    max_batch_size=16,
)

CANDIDATE_TOWER = ModelContract(
    name="candidate_tower",
    inputs=(_spec("post_id", np.int64, [1]), _spec("author_id", np.int64, [1])),
    outputs=(_spec("candidate_embedding", np.float32, [-1]),),  # [D], unit norm
    max_batch_size=LIMITS.max_rows,
)

RETRIEVER = ModelContract(
    name="retriever",
    inputs=(
        _spec("user_embedding", np.float32, [-1]),  # [D]
        TOP_K,
        _spec("history_post_ids", np.int64, [-1], optional=True, ragged=True),  # excluded
    ),
    outputs=(
        _spec("post_ids", np.int64, [-1]),  # [K], best first
        _spec("author_ids", np.int64, [-1]),
        _spec("retrieval_scores", np.float32, [-1]),
    ),
    max_batch_size=8,
    # File inside the artifact directory; a load request with another value swaps the corpus.
    parameters=CORPUS_PARAMETERS,
)

RANKER = ModelContract(
    name="ranker",
    inputs=(
        USER_ID,
        *history_inputs(ragged=True),
        _spec("history_dwell_seconds", np.float32, [-1], optional=True, ragged=True),
        _spec("candidate_post_ids", np.int64, [-1], ragged=True),
        _spec("candidate_author_ids", np.int64, [-1], ragged=True),
        _spec("candidate_product_surface", np.int32, [-1], optional=True, ragged=True),
        _spec("candidate_post_age_seconds", np.float32, [-1], optional=True, ragged=True),
        _spec("candidate_retrieval_scores", np.float32, [-1], optional=True, ragged=True),
    ),
    outputs=(
        *RANKED_OUTPUTS,
        RANKED_AUTHOR_IDS,
        _spec("ranked_retrieval_scores", np.float32, [-1]),
    ),
    max_batch_size=8,
    parameters={"score_weights": json.dumps(RANKER_SCORE_WEIGHTS)},
)

# The feed policy: the ranker's candidates (in its order) filtered, scored by every action and
# diversified by author. C' <= C posts stay; rows of a multi-user request are padded to the
# longest with post id 0 (real post ids are >= 1).
FEED_POLICY = ModelContract(
    name="feed_policy",
    inputs=(
        USER_ID,
        _spec("candidate_post_ids", np.int64, [-1], ragged=True),  # [C], the ranker's order
        _spec("candidate_author_ids", np.int64, [-1], ragged=True),
        _spec("candidate_action_probs", np.float32, [-1, -1], ragged=True),  # [C, A]
        _spec("candidate_retrieval_scores", np.float32, [-1], optional=True, ragged=True),
        *FEED_FILTERS,
    ),
    outputs=(  # [C'] each
        *RANKED_OUTPUTS,
        RANKED_AUTHOR_IDS,
        _spec("ranked_retrieval_scores", np.float32, [-1]),
    ),
    max_batch_size=8,
    parameters={**POLICY_PARAMETERS, **CORPUS_PARAMETERS},
)


def _same_names(names) -> dict[str, str]:
    return {name: name for name in names}


_USER_TENSORS = ("user_id", *(spec.name for spec in history_inputs(ragged=False)))

# Encode the user, retrieve top_k unseen posts, rank them, apply the feed policy. Tensors
# starting with "_" live only inside the ensemble. The optional filters reach feed_policy only
# when the request carries them (Triton 2.51 passes an absent optional input on as absent).
RECOMMEND = ModelContract(
    name="recommend",
    inputs=(USER_ID, *history_inputs(ragged=False), TOP_K, *FEED_FILTERS),
    outputs=(
        *RANKED_OUTPUTS,
        RANKED_AUTHOR_IDS,
        _spec("retrieval_scores", np.float32, [-1]),
    ),
    max_batch_size=8,
    backend=None,
    platform="ensemble",
    steps=(
        EnsembleStep(
            "user_encoder",
            input_map=_same_names(_USER_TENSORS),
            output_map={"user_embedding": "_user_embedding"},
        ),
        EnsembleStep(
            "retriever",
            input_map={
                "user_embedding": "_user_embedding",
                "top_k": "top_k",
                "history_post_ids": "history_post_ids",
            },
            output_map={
                "post_ids": "_candidate_post_ids",
                "author_ids": "_candidate_author_ids",
                "retrieval_scores": "_candidate_retrieval_scores",
            },
        ),
        EnsembleStep(
            "ranker",
            input_map={
                **_same_names(_USER_TENSORS),
                "candidate_post_ids": "_candidate_post_ids",
                "candidate_author_ids": "_candidate_author_ids",
                "candidate_retrieval_scores": "_candidate_retrieval_scores",
            },
            output_map={
                "ranked_post_ids": "_ranked_post_ids",
                "ranked_author_ids": "_ranked_author_ids",
                "action_probs": "_ranked_action_probs",
                "ranked_retrieval_scores": "_ranked_retrieval_scores",
            },
        ),
        EnsembleStep(
            "feed_policy",
            input_map={
                "user_id": "user_id",
                "candidate_post_ids": "_ranked_post_ids",
                "candidate_author_ids": "_ranked_author_ids",
                "candidate_action_probs": "_ranked_action_probs",
                "candidate_retrieval_scores": "_ranked_retrieval_scores",
                **_same_names(spec.name for spec in FEED_FILTERS),
            },
            output_map={
                **_same_names(spec.name for spec in (*RANKED_OUTPUTS, RANKED_AUTHOR_IDS)),
                "ranked_retrieval_scores": "retrieval_scores",
            },
        ),
    ),
)

CONTRACTS: dict[str, ModelContract] = {
    c.name: c for c in (USER_ENCODER, CANDIDATE_TOWER, RETRIEVER, RANKER, FEED_POLICY, RECOMMEND)
}


def contract(model: str) -> ModelContract:
    """The contract of a served model by name."""
    try:
        return CONTRACTS[model]
    except KeyError:
        raise KeyError(f"no served model {model!r}; the models are {sorted(CONTRACTS)}") from None
