"""The Triton calls the supervisor makes, through tritonclient's HTTP client, with the admin key.

tritonclient's HTTP client is gevent-based and not shared between threads, so each thread
that calls (the watch loop, the shutdown, each /ready request) gets clients of its own; a
short-lived thread closes them when done (``close_thread_clients``), or their sockets and
pipes would leak.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping

import gevent
import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from phoenix.serving.admin_key import admin_headers
from phoenix.serving.client import infer_inputs

NOT_HEALTHY = "is not healthy"
DEFAULT_TIMEOUT_S = 5.0


class TritonAPIError(RuntimeError):
    """Triton answered with an error status (or did not answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _api_error(call: str, error: Exception) -> TritonAPIError:
    status = error.status() if isinstance(error, InferenceServerException) else None
    code = int(status) if status and str(status).isdigit() else None
    message = error.message() if isinstance(error, InferenceServerException) else str(error)
    return TritonAPIError(f"{call}: {f'HTTP {code}: ' if code else ''}{message}", code)


class TritonAdmin:
    """Health, repository index, configs, loads, unloads, statistics and probes of one server."""

    def __init__(
        self, http_url: str, admin_key: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
    ):
        self.url = http_url.split("://", 1)[-1].rstrip("/")
        self.headers = admin_headers(admin_key)
        self.timeout = timeout
        self._local = threading.local()

    def _client(self, timeout: float) -> httpclient.InferenceServerClient:
        clients = self._local.__dict__.setdefault("clients", {})
        if timeout not in clients:
            clients[timeout] = httpclient.InferenceServerClient(
                self.url, connection_timeout=timeout, network_timeout=timeout
            )
        return clients[timeout]

    def close_thread_clients(self) -> None:
        """Close the clients this thread made and the gevent hub they started in it (an
        endpoint thread, before it ends): the hub's pipes outlive the thread otherwise."""
        clients = self._local.__dict__.pop("clients", {})
        for client in clients.values():
            client.close()
        if clients:
            gevent.get_hub().destroy(destroy_loop=True)

    def _call(self, name: str, *args, timeout: float | None = None, **kwargs):
        client = self._client(timeout or self.timeout)
        try:
            return getattr(client, name)(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 (socket errors, timeouts and Triton's own)
            raise _api_error(f"{name}{args or ''}", error) from None

    def is_ready(self) -> bool:
        try:
            return bool(self._call("is_server_ready", timeout=2.0))
        except TritonAPIError:
            return False

    def model_index(self) -> dict[str, tuple[str, str]]:
        """{model: (state, reason)} of the repository index; state 'READY' when serving."""
        index = self._call("get_model_repository_index", headers=self.headers)
        return {e["name"]: (e.get("state", ""), e.get("reason", "")) for e in index or []}

    def model_config(self, model: str) -> dict:
        return self._call("get_model_config", model)

    def load_model(self, model: str, config: Mapping | None, timeout: float) -> None:
        """Load `model`, with `config` as the override when given (a changed config makes
        Triton load a new copy and start new stubs)."""
        text = json.dumps(config) if config is not None else None
        self._call("load_model", model, headers=self.headers, config=text, timeout=timeout)

    def unload_model(self, model: str) -> None:
        self._call("unload_model", model, headers=self.headers)

    def success_counts(self) -> dict[str, int]:
        """{model: requests answered so far} from the inference statistics."""
        stats = self._call("get_inference_statistics")
        return {
            entry["name"]: int(entry["inference_stats"]["success"]["count"])
            for entry in stats.get("model_stats", [])
        }

    def probe(self, model: str, inputs: Mapping[str, np.ndarray], timeout: float = 10.0) -> str:
        """'alive', 'dead' (stub not healthy) or 'unknown' (busy, timeout, other error)."""
        try:
            self._call("infer", model, infer_inputs(httpclient, inputs), timeout=timeout)
            return "alive"
        except TritonAPIError as error:
            if NOT_HEALTHY in str(error):
                return "dead"
            return "alive" if error.status == 400 else "unknown"
