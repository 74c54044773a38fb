"""The served models' services run in this process, set up as the server set them up.

The clients' ``--check`` compares a server's answer with these; the serving benchmark times
them against the server. Each service is built exactly as the Triton adapter builds it, from
the parameters (and batch size) the server reports, so a difference means serving changed the
answer. The recommend ensemble runs as ``phoenix.schema.wiring`` runs it: its one step,
recommend's chain, with every stage in this process. A reference records nothing (the chain's
``record`` 0: no post marked served, no request logged, no request id) unless it is made
with ``record`` (the serving benchmark's in-process side does the served side's work).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.schema.contracts import REQUEST_ID
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN
from phoenix.schema.wiring import run_ensemble

Arrays = dict[str, np.ndarray]
# The models recommend's reference builds: its steps ("recommend_chain")
SERVICE_MODELS = tuple(step.model for step in RECOMMEND.steps)


def server_model_config(client, protocol: str, model: str) -> dict[str, Any]:
    """The model's configuration as the server reports it (JSON form, either protocol)."""
    if protocol == "grpc":
        return client.get_model_config(model, as_json=True)["config"]
    return client.get_model_config(model)


def server_parameters(client, protocol: str, model: str) -> dict[str, str]:
    """The model's ``parameters`` as {key: string value}."""
    from phoenix.stub.services.common import config_parameters

    return config_parameters(server_model_config(client, protocol, model))


class InProcessModels:
    """Services of the served models in this process, built once per model on first use."""

    def __init__(
        self,
        artifacts: Path,
        params: Mapping[str, Mapping[str, str]],
        max_batch: Mapping[str, int],
        batched: bool = False,
        record: bool = False,
    ):
        # The server's CPU instances run JAX on the CPU in float32; so must the reference.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        self.artifacts = Path(artifacts).resolve()
        self.params = {model: dict(values) for model, values in params.items()}
        self.max_batch = dict(max_batch)  # the server's max_batch_size per model
        self.batched = batched  # False: compile single-request shapes only (a quicker start)
        self.record = record  # the chain's side effects happen (served posts, request log)
        self._services: dict[str, Any] = {}
        # like_server: a model's config, asked when first needed
        self.ask_server: Optional[Callable[[str], dict[str, Any]]] = None

    @classmethod
    def like_server(
        cls,
        client,
        protocol: str,
        artifacts: Path,
        models: Iterable[str] = SERVICE_MODELS,
        batched: bool = False,
        record: bool = False,
    ) -> InProcessModels:
        """Services with the server's parameters and batch sizes; without ``batched`` they
        compile (and run) one request at a time."""
        made = cls(artifacts, {}, {}, batched, record)
        made.ask_server = lambda model: server_model_config(client, protocol, model)
        for model in models:
            made.add_server_config(model)
        return made

    def add_server_config(self, model: str) -> None:
        """The parameters and batch size of ``model`` as the server reports them."""
        from phoenix.stub.services.common import config_parameters

        assert self.ask_server is not None  # set by like_server
        config = self.ask_server(model)
        self.params[model] = config_parameters(config)
        self.max_batch[model] = int(config.get("max_batch_size") or 1)

    def service(self, model: str):
        from phoenix.stub.services.catalog import build_service
        from phoenix.stub.services.common import ServiceSettings

        if model not in self.params and self.ask_server is not None:
            self.add_server_config(model)
        if model not in self._services:
            params, max_batch = self.params[model], self.max_batch[model]
            if not self.batched and "batch_buckets" in params:
                params, max_batch = {**params, "batch_buckets": "1"}, 1
            settings = ServiceSettings.parsed(model, self.artifacts, max_batch, params)
            self._services[model] = build_service(settings)
        return self._services[model]

    def run_many(self, model: str, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Arrays]:
        """Requests through the model's service in one call; raises the first InputError."""
        if model == RECOMMEND.name:
            return run_ensemble(self.run_many, requests)
        if model == RECOMMEND_CHAIN.name and not self.record:
            return [self.unrecorded(r) for r in self.run_all(model, [
                {**r, "record": np.zeros((len(r["user_id"]), 1), np.int8)} for r in requests
            ])]  # fmt: skip
        return self.run_all(model, requests)

    @staticmethod
    def unrecorded(outputs: Arrays) -> Arrays:
        """A reference's answer leaves out the request id it never made."""
        return {name: array for name, array in outputs.items() if name != REQUEST_ID.name}

    def run_all(self, model: str, requests: Sequence[Mapping[str, np.ndarray]]) -> list[Arrays]:
        results = self.service(model).handle([dict(r) for r in requests])
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def run(self, model: str, arrays: Mapping[str, np.ndarray]) -> Arrays:
        """One request through the model (the recommend ensemble included)."""
        (result,) = self.run_many(model, [arrays])
        return result
