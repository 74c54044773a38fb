"""The served models' services run in this process, set up as the server set them up.

The clients' ``--check`` compares a server's answer with these; the serving benchmark times
them against the server. Each service is built exactly as the Triton adapter builds it, from
the parameters (and batch size) the server reports, so a difference means serving changed the
answer. The recommend ensemble runs as ``phoenix.serving.ensemble`` runs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from phoenix.serving.contracts import RECOMMEND
from phoenix.serving.ensemble import reference_steps, run_ensemble

Arrays = dict[str, np.ndarray]
# ("user_state", "user_encoder", ...): served_log, a side effect, is never run in process
SERVICE_MODELS = tuple(step.model for step in reference_steps(RECOMMEND))


def server_model_config(client, protocol: str, model: str) -> dict[str, Any]:
    """The model's configuration as the server reports it (JSON form, either protocol)."""
    if protocol == "grpc":
        return client.get_model_config(model, as_json=True)["config"]
    return client.get_model_config(model)


def server_parameters(client, protocol: str, model: str) -> dict[str, str]:
    """The model's ``parameters`` as {key: string value}."""
    from phoenix.serving.services.common import config_parameters

    return config_parameters(server_model_config(client, protocol, model))


class InProcessModels:
    """Services of the served models in this process, built once per model on first use."""

    def __init__(
        self,
        artifacts: Path,
        params: Mapping[str, Mapping[str, str]],
        max_batch: Mapping[str, int],
        batched: bool = False,
    ):
        # The server's CPU instances run JAX on the CPU in float32; so must the reference.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        self.artifacts = Path(artifacts).resolve()
        self.params = {model: dict(values) for model, values in params.items()}
        self.max_batch = dict(max_batch)  # the server's max_batch_size per model
        self.batched = batched  # False: compile single-request shapes only (a quicker start)
        self._services: dict[str, Any] = {}

    @classmethod
    def like_server(
        cls,
        client,
        protocol: str,
        artifacts: Path,
        models: Iterable[str] = SERVICE_MODELS,
        batched: bool = False,
    ) -> InProcessModels:
        """Services with the server's parameters and batch sizes; without ``batched`` they
        compile (and run) one request at a time."""
        configs = {model: server_model_config(client, protocol, model) for model in models}
        from phoenix.serving.services.common import config_parameters

        params = {model: config_parameters(config) for model, config in configs.items()}
        max_batch = {m: int(c.get("max_batch_size") or 1) for m, c in configs.items()}
        return cls(artifacts, params, max_batch, batched)

    def service(self, model: str):
        from phoenix.serving.services import ServiceSettings, build_service

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
        results = self.service(model).handle([dict(r) for r in requests])
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def run(self, model: str, arrays: Mapping[str, np.ndarray]) -> Arrays:
        """One request through the model (the recommend ensemble included)."""
        (result,) = self.run_many(model, [arrays])
        return result
