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

- ``resources``: ``PhoenixResources``, the artifacts and programs of the device services.

``SERVICES`` is the registry the Triton adapter and the in-process models build from. It
imports a service's module when the service is first asked for, so a stub of a host-only
model (user state, feed policy, served log) never imports JAX: 0.3-0.4 CPU-s to start where
each of those six stubs took 1.2 (docs/serving.md, "Tests against a real server"). The names
below are re-exported the same way.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from phoenix.schema import contracts, recommend

if TYPE_CHECKING:
    from phoenix.stub.services.common import Service, ServiceSettings

# {model: (module under phoenix.stub.services, service class)}, in the ensemble's order.
SERVICE_CLASSES = {
    contracts.USER_STATE.name: ("user_state", "UserStateService"),
    contracts.USER_ENCODER.name: ("retrieval", "UserEncoderService"),
    contracts.CANDIDATE_TOWER.name: ("retrieval", "CandidateTowerService"),
    contracts.RETRIEVER.name: ("retrieval", "RetrieverService"),
    contracts.RANKER.name: ("ranker", "RankerService"),
    contracts.FEED_POLICY.name: ("feed_policy", "FeedPolicyService"),
    contracts.SERVED_LOG.name: ("served_log", "ServedLogService"),
    recommend.RECOMMEND_CHAIN.name: ("recommend", "RecommendChainService"),
}

# Re-exported names: {name: module that defines it}.
EXPORTS = {
    "Outputs": "common",
    "Result": "common",
    "Service": "common",
    "ServiceSettings": "common",
    "action_weight_vector": "common",
    "PhoenixResources": "resources",
    "score_weight_vector": "ranker",
    "user_tower_inputs": "retrieval",
    **{name: module for module, name in SERVICE_CLASSES.values()},
}


def _imported(module: str, name: str):
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


class ServiceRegistry(Mapping):
    """{model: service class}; a class's module is imported when it is looked up."""

    def __getitem__(self, model: str) -> type[Service]:
        return _imported(*SERVICE_CLASSES[model])

    def __iter__(self) -> Iterator[str]:
        return iter(SERVICE_CLASSES)

    def __len__(self) -> int:
        return len(SERVICE_CLASSES)


SERVICES = ServiceRegistry()


def build_service(settings: ServiceSettings) -> Service:
    """The service of ``settings.model``, built from its settings."""
    try:
        service = SERVICES[settings.model]
    except KeyError:
        known = sorted(SERVICES)
        raise ValueError(f"no service for model {settings.model!r}; served: {known}") from None
    return service.from_settings(settings)


MODULES = ("common", "resources", *{module for module, _ in SERVICE_CLASSES.values()})


def __getattr__(name: str):
    if name in EXPORTS:
        return _imported(EXPORTS[name], name)
    if name in MODULES:  # ``services.retrieval.X`` as when every module was imported up front
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SERVICES", "build_service", *EXPORTS]
