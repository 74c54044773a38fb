"""recommend's chain: every stage's service in this process, one batch at a time.

The recommend ensemble calls one model, ``recommend_chain``, whose service this is: it holds
the services of every stage (``recommend.RECOMMEND_STAGES``: user state, user tower,
retrieval, ranker, feed policy, served log), built from its own config as the stages' models
build theirs, and runs them in order on the whole batch. Each request is checked once, on
the way in, against the chain's contract (recommend's inputs: the same specs the stages
would check them by). What a stage answers goes to the next stage as its typed request
without being checked again: the stages' contracts are wired so that one's outputs are the
next one's inputs (tests/unit/test_contracts.py). One Triton request thus costs one crossing
into a Python stub, where the six-step ensemble cost six, each copying the candidate lists in
and out (docs/design/recommend-chain.md).

A stage that fails a request (the user-state store down for a by-id request) answers that
request its error and leaves it out of the later stages; the others go on. A request whose
``record`` is 0 skips the side-effect stage (served_log: nothing is marked served or logged)
and gets request id 0: a rollout's shadow comparison asks so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from phoenix.schema.contracts import REQUEST_ID
from phoenix.schema.recommend import RECOMMEND_CHAIN, stage_parameter
from phoenix.schema.request_types import REQUEST_TYPES
from phoenix.schema.requests import from_arrays
from phoenix.schema.served import contract
from phoenix.schema.wiring import step_inputs, store_outputs
from phoenix.stub.services.common import Result, Service, ServiceSettings

RecommendChainRequest = REQUEST_TYPES[RECOMMEND_CHAIN.name]
RECORD = "record"


def stage_settings(settings: ServiceSettings, model: str) -> ServiceSettings:
    """The settings of stage ``model`` inside the chain of ``settings``: its parameters as the
    chain's config names them (``recommend.stage_parameter``), the chain's batch size."""
    values = {
        p.name: settings.parameters[stage_parameter(model, p.name)]
        for p in contract(model).parameters
    }
    stage = ServiceSettings(model, settings.artifact_dir, settings.max_batch_size, values)
    stage.check_batch_buckets()  # each stage compiled for every batch the chain can take
    return stage


def records(request: Mapping[str, np.ndarray]) -> bool:
    """Whether the request's side effects happen (``record`` absent or 1)."""
    flag = request.get(RECORD)
    return flag is None or bool(flag.all())


class RecommendChainService(Service):
    """The stages of recommend, in process, on one batch of requests (built with its stages'
    services by ``catalog.build_service``)."""

    request_type = RecommendChainRequest

    def __init__(self, services: Mapping[str, Service], *, max_batch_size: int):
        self.stages = RECOMMEND_CHAIN.stages
        missing = [stage.model for stage in self.stages if stage.model not in services]
        if missing:
            raise ValueError(f"recommend_chain: no service for the stages {missing}")
        self.services = dict(services)
        self.config = self.services[self.stages[0].model].config
        self.max_rows = max_batch_size

    @property
    def corpus(self):
        """The corpus the chain retrieves from (the adapter shows its generation)."""
        return self.services["retriever"].corpus

    @property
    def prefix_cache(self):
        """The ranker stage's prefix cache (None when it is off): its metrics are the chain's."""
        return getattr(self.services.get("ranker"), "prefix_cache", None)

    def warm_up(self) -> int:
        return sum(service.warm_up() for service in self.services.values())

    def admit(self, request):
        """The chain's rows limit, and the first stage's own rules (a history is all of its
        inputs or none)."""
        request = super().admit(request)
        first = self.stages[0]
        service = self.services[first.model]
        service.admit(from_arrays(service.request_type, step_inputs(first, request.arrays())))
        return request

    def run(self, requests: Sequence) -> list[Result]:
        tensors = [request.arrays() for request in requests]
        results: list = [None] * len(requests)
        live = list(range(len(requests)))
        for stage in self.stages:
            todo = [i for i in live if records(tensors[i]) or not stage.side_effect]
            if not todo:
                continue
            service = self.services[stage.model]
            typed = [
                from_arrays(service.request_type, step_inputs(stage, tensors[i])) for i in todo
            ]
            for i, outputs in zip(todo, service.run(typed), strict=True):
                if isinstance(outputs, Exception):
                    results[i] = outputs
                    live.remove(i)
                else:
                    store_outputs(stage, outputs, tensors[i])
        for i in live:
            results[i] = self.outputs(requests[i], tensors[i])
        return results

    @staticmethod
    def outputs(request, tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The chain's outputs of one request; request id 0 where nothing was recorded."""
        unrecorded = np.zeros((request.rows, 1), REQUEST_ID.dtype)
        return {
            name: tensors[name] if name in tensors else unrecorded
            for name in RECOMMEND_CHAIN.output_names
        }
