"""What each served model does, free of Triton: requests in, outputs (or errors) out.

A service receives the inputs of every request of one Triton ``execute`` call, checks each
request on its own (a bad one gets an ``InputError``, the others are unaffected), stacks the
good ones into one padded batch, makes one engine call and splits the results per request
(``common.Service``).

- ``common``: settings, the artifacts an instance loads, the request loop.
- ``retrieval``: ``UserEncoderService``, ``CandidateTowerService``, ``RetrieverService``.
- ``ranker``: ``RankerService`` (the whole batch on the device) and its score weights.
- ``user_state``: ``UserStateService`` (histories and served posts from the user-state
  store by user id, or the request's own history passed on).
- ``feed_policy``: ``FeedPolicyService`` (filters, every action's weight, author diversity
  after the ranker; numpy only).
- ``served_log``: ``ServedLogService`` (the last step: the feed marked served, the request
  logged, a request id answered; a side effect that never fails the feed).

``SERVICES`` is the registry the Triton adapter and the in-process models build from.
"""

from phoenix.serving.services.common import (
    Outputs,
    PhoenixResources,
    Result,
    Service,
    ServiceSettings,
    action_weight_vector,
)
from phoenix.serving.services.feed_policy import FeedPolicyService
from phoenix.serving.services.ranker import RankerService, score_weight_vector
from phoenix.serving.services.retrieval import (
    CandidateTowerService,
    RetrieverService,
    UserEncoderService,
    user_tower_inputs,
)
from phoenix.serving.services.served_log import ServedLogService
from phoenix.serving.services.user_state import UserStateService

SERVICES: dict[str, type[Service]] = {
    service.model(): service
    for service in (
        UserStateService,
        UserEncoderService,
        CandidateTowerService,
        RetrieverService,
        RankerService,
        FeedPolicyService,
        ServedLogService,
    )
}


def build_service(settings: ServiceSettings) -> Service:
    """The service of ``settings.model``, built from its settings."""
    try:
        service = SERVICES[settings.model]
    except KeyError:
        known = sorted(SERVICES)
        raise ValueError(f"no service for model {settings.model!r}; served: {known}") from None
    return service.from_settings(settings)


__all__ = [
    "SERVICES",
    "CandidateTowerService",
    "FeedPolicyService",
    "Outputs",
    "PhoenixResources",
    "RankerService",
    "Result",
    "RetrieverService",
    "ServedLogService",
    "Service",
    "ServiceSettings",
    "UserEncoderService",
    "UserStateService",
    "build_service",
    "action_weight_vector",
    "score_weight_vector",
    "user_tower_inputs",
]
