"""recommend's wiring: its request and answer, the stages of its chain (read the user's state,
encode the user, retrieve, rank, apply the policy, log), the chain's parameters, and the
``recommend`` ensemble clients call.

Imports the spec language and the stage models' contracts only.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from phoenix.schema.contracts import (
    ARTIFACT_PARAMETERS,
    CORPUS_FILE,
    FEED_FILTERS,
    FEED_OUTPUTS,
    IN_NETWORK_POSTS,
    PRODUCTION_STATE_NAMES,
    REQUEST_ID,
    RETRIEVAL_PREFIX,
    STAGE_MODELS,
    TOP_K,
    USER_HISTORY_NAMES,
    USER_ID,
    USER_STATE_URL,
    history_dwell,
    history_inputs,
    optional,
)
from phoenix.schema.production_inputs import (
    CANDIDATE_CONTEXT,
    HISTORY_CONTEXT_INPUTS,
    PROFILE_INPUTS,
    REQUEST_CONTEXT,
)
from phoenix.schema.spec import (
    EnsembleStep,
    ModelContract,
    Parameter,
    TensorSpec,
    Values,
    tensor_spec,
)

_STAGES_BY_NAME = {c.name: c for c in STAGE_MODELS}


def _same_names(names) -> dict[str, str]:
    return {name: name for name in names}


_TOWER_HISTORY_NAMES = tuple(spec.name for spec in history_inputs(ragged=False))  # no dwell
_REQUEST_CONTEXT_NAMES = tuple(spec.name for spec in REQUEST_CONTEXT)


def _unragged(spec: TensorSpec) -> TensorSpec:
    return TensorSpec(spec.name, spec.dtype, spec.axes, spec.optional, False, spec.values)


# The recommend request: a user by id (the history read from the user state) or with the
# history, how many posts to retrieve, and the feed filters; for the production family
# (docs/production.md) also the history items' context and the profile (with a history; by id
# the store has them) and the request's timezone and hour (either way).
RECOMMEND_INPUTS = (
    USER_ID,
    *(optional(s) for s in history_inputs(ragged=False)),
    history_dwell(optional=True, ragged=False),
    TOP_K,
    *FEED_FILTERS,
    *(_unragged(s) for s in (*HISTORY_CONTEXT_INPUTS, *PROFILE_INPUTS, *REQUEST_CONTEXT)),
)
_PRODUCTION_INPUT_NAMES = tuple(
    s.name for s in (*HISTORY_CONTEXT_INPUTS, *PROFILE_INPUTS, *REQUEST_CONTEXT)
)
RECOMMEND_OUTPUTS = (
    *FEED_OUTPUTS,
    REQUEST_ID,  # what engagements with this feed refer to
)

# The stages of recommend: read the user's state (or take the request's history), encode the
# user by the retrieval history, retrieve top_k posts neither in the history nor served before
# and add the in-network posts (each dated by the corpus), rank them by the ranking history and
# their ages, apply the feed policy (which favours the in-network posts by
# out_of_network_factor, flags them and reads the same ages for max_age_seconds), then record
# what was served (served_log: the posts marked served, the request log, the request id
# returned). Tensors starting with "_" live only inside the chain. The optional inputs (the
# history, the feed filters) reach their stage only when the request carries them. For the
# production family the user state also answers the history items' context, the profile and
# the request's context, the retriever each candidate's semantic IDs and the request's context
# per candidate, and the ranker reads them all; the original family's stages answer none, so
# its ranker gets none.
RECOMMEND_STAGES = (
    EnsembleStep(
        "user_state",
        input_map=_same_names(("user_id", *USER_HISTORY_NAMES, *_PRODUCTION_INPUT_NAMES)),
        output_map={
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            # the user tower reads no dwell
            **{RETRIEVAL_PREFIX + n: "_" + RETRIEVAL_PREFIX + n for n in _TOWER_HISTORY_NAMES},
            "served_post_ids": "_served_post_ids",
            **{s.name: "_" + s.name for s in IN_NETWORK_POSTS},
            **{name: "_" + name for name in PRODUCTION_STATE_NAMES},
        },
    ),
    EnsembleStep(
        "user_encoder",
        input_map={
            "user_id": "user_id",
            **{n: "_" + RETRIEVAL_PREFIX + n for n in _TOWER_HISTORY_NAMES},
        },
        output_map={"user_embedding": "_user_embedding"},
    ),
    EnsembleStep(
        "retriever",
        input_map={
            "user_embedding": "_user_embedding",
            "top_k": "top_k",
            "history_post_ids": "_history_post_ids",
            "excluded_post_ids": "_served_post_ids",
            **{s.name: "_" + s.name for s in IN_NETWORK_POSTS},
            **{name: "_" + name for name in _REQUEST_CONTEXT_NAMES},
        },
        output_map={
            "post_ids": "_candidate_post_ids",
            "author_ids": "_candidate_author_ids",
            "retrieval_scores": "_candidate_retrieval_scores",
            "post_age_seconds": "_candidate_post_age_seconds",
            **{s.name: "_candidate_" + s.name for s in CANDIDATE_CONTEXT},
        },
    ),
    EnsembleStep(
        "ranker",
        input_map={
            "user_id": "user_id",
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            "candidate_post_ids": "_candidate_post_ids",
            "candidate_author_ids": "_candidate_author_ids",
            "candidate_retrieval_scores": "_candidate_retrieval_scores",
            "candidate_post_age_seconds": "_candidate_post_age_seconds",
            **{s.name: "_" + s.name for s in (*HISTORY_CONTEXT_INPUTS, *PROFILE_INPUTS)},
            **{"candidate_" + s.name: "_candidate_" + s.name for s in CANDIDATE_CONTEXT},
        },
        output_map={
            "ranked_post_ids": "_ranked_post_ids",
            "ranked_author_ids": "_ranked_author_ids",
            "action_probs": "_ranked_action_probs",
            "ranked_retrieval_scores": "_ranked_retrieval_scores",
            "ranked_post_age_seconds": "_ranked_post_age_seconds",
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
            "candidate_post_age_seconds": "_ranked_post_age_seconds",
            **_same_names(spec.name for spec in FEED_FILTERS),
            "in_network_post_ids": "_in_network_post_ids",
        },
        # the feed, under the names recommend answers it
        output_map={
            **_same_names(s.name for s in FEED_OUTPUTS if s.name != "retrieval_scores"),
            "ranked_retrieval_scores": "retrieval_scores",
        },
    ),
    EnsembleStep(
        "served_log",
        input_map={
            "user_id": "user_id",
            **{name: "_" + name for name in USER_HISTORY_NAMES},
            "sent_history_post_ids": "history_post_ids",
            "candidate_post_ids": "_candidate_post_ids",
            "candidate_author_ids": "_candidate_author_ids",
            "candidate_retrieval_scores": "_candidate_retrieval_scores",
            **_same_names(s.name for s in FEED_OUTPUTS),
        },
        output_map={REQUEST_ID.name: REQUEST_ID.name},
        side_effect=True,
    ),
)

# Parameters a chain's stages share, under their own names in the chain's config (one
# artifact directory, corpus and store for every stage); a stage's other parameters are named
# "<stage model>.<parameter>" there (``stage_parameter``).
SHARED_STAGE_PARAMETERS = (*ARTIFACT_PARAMETERS, CORPUS_FILE, USER_STATE_URL)
_SHARED_NAMES = frozenset(p.name for p in SHARED_STAGE_PARAMETERS)


def stage_parameter(model: str, name: str) -> str:
    """The chain config's name of parameter ``name`` of stage ``model``."""
    return name if name in _SHARED_NAMES else f"{model}.{name}"


def chain_parameters(stages: tuple[EnsembleStep, ...]) -> tuple[Parameter, ...]:
    """Every parameter of every stage, once: the shared ones, then each stage's own."""
    shared = {p.name for stage in stages for p in _STAGES_BY_NAME[stage.model].parameters}
    declared = [p for p in SHARED_STAGE_PARAMETERS if p.name in shared]
    for stage in stages:
        for p in _STAGES_BY_NAME[stage.model].parameters:
            if p.name not in _SHARED_NAMES:
                declared.append(dataclasses.replace(p, name=stage_parameter(stage.model, p.name)))
    return tuple(declared)


# The record flag of a chain request: 0 answers the feed without its side effects (no post
# marked served, no request log; request_id 0), as a rollout's shadow comparison asks.
RECORD = tensor_spec("record", np.int8, [1], optional=True, values=Values(0, 1, "flags"))


# recommend's chain: every stage's service in one Python model, one batch at a time, each
# stage's outputs handed to the next in process (docs/design/recommend-chain.md).
# It takes recommend's inputs and the record flag, and answers recommend's outputs.
def _ragged(spec: TensorSpec) -> TensorSpec:
    """``spec`` batched with requests of other lengths (it has a length axis)."""
    ragged = spec.length is not None
    return TensorSpec(spec.name, spec.dtype, spec.axes, spec.optional, ragged, spec.values)


RECOMMEND_CHAIN = ModelContract(
    name="recommend_chain",
    # ragged: requests with histories (or filters) of different lengths share a batch; the
    # chain's stages pad them (Triton batches only equal shapes otherwise: 1.7 requests a
    # batch were measured at c=16 with histories of several lengths)
    inputs=(*(_ragged(spec) for spec in RECOMMEND_INPUTS), RECORD),
    outputs=RECOMMEND_OUTPUTS,
    max_batch_size=8,
    stages=RECOMMEND_STAGES,
    parameters=chain_parameters(RECOMMEND_STAGES),
)

# What clients call: an ensemble of the chain, so that a rollout switches recommend from one
# version's chain to the next's in one ensemble load (phoenix.ops.rollout).
RECOMMEND = ModelContract(
    name="recommend",
    inputs=RECOMMEND_INPUTS,
    outputs=RECOMMEND_OUTPUTS,
    max_batch_size=8,
    backend=None,
    platform="ensemble",
    steps=(
        EnsembleStep(
            RECOMMEND_CHAIN.name,
            input_map=_same_names(s.name for s in RECOMMEND_INPUTS),
            output_map=_same_names(s.name for s in RECOMMEND_OUTPUTS),
        ),
    ),
)
