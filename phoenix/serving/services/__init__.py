"""What each served model does, free of Triton: requests in, outputs (or errors) out.

A service receives the inputs of every request of one Triton ``execute`` call, checks each
request on its own (a bad one gets an ``InputError``, the others are unaffected), stacks the
good ones into one padded batch, makes one engine call and splits the results per request.

- ``common``: request types, user-history parsing and stacking, ``PhoenixResources``.
- ``retrieval``: ``UserEncoderService``, ``CandidateTowerService``, ``RetrieverService``.
- ``ranker``: ``RankerService`` (the whole batch on the device) and its score weights.
"""

from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.serving.services.common import (
    USER_INPUTS,
    Inputs,
    Outputs,
    PhoenixResources,
    Result,
    UserRows,
    handle_rows,
    parse_user_rows,
    stack_rows,
    stack_user_rows,
)
from phoenix.serving.services.ranker import (
    RANKER_CANDIDATE_INPUTS,
    RankerService,
    parse_score_weights,
    ranked_outputs,
)
from phoenix.serving.services.retrieval import (
    CandidateTowerService,
    RetrieverService,
    UserEncoderService,
)

__all__ = [
    "RANKER_CANDIDATE_INPUTS",
    "USER_INPUTS",
    "CandidateTowerService",
    "Inputs",
    "Outputs",
    "PhoenixResources",
    "RankerService",
    "RecsysBatch",
    "RecsysEmbeddings",
    "Result",
    "RetrieverService",
    "UserEncoderService",
    "UserRows",
    "handle_rows",
    "parse_score_weights",
    "parse_user_rows",
    "ranked_outputs",
    "stack_rows",
    "stack_user_rows",
]
