"""The Triton calls the supervisor makes: KServe v2 HTTP/JSON with the admin key, standard library
only. A connection per call keeps every thread (the watch loop, the shutdown, each /ready
request) independent, with nothing to close afterwards."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import quote

import numpy as np
from tritonclient.utils import np_to_triton_dtype

from phoenix.serving.admin_key import admin_headers
from phoenix.serving.contracts import CONTRACTS

NOT_HEALTHY = "is not healthy"


class TritonAPIError(RuntimeError):
    """Triton answered with an error status (or did not answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def probe_inputs(model: str) -> dict[str, np.ndarray] | None:
    """{input name: array} of one probe request of `model`; None for a model without a contract
    (nothing known to send) or an ensemble (it has no stub of its own).

    Every required input of the model's contract, one row, every value -1: ids must be >= 0,
    top_k >= 1, actions in [0, 1] and embeddings have D > 1 values, so the stub answers
    INVALID_ARG at once, proof that it is alive, without doing work. Triton itself only checks
    names, types and shapes, which are right.
    """
    spec = CONTRACTS.get(model)
    if spec is None or spec.is_ensemble:
        return None
    return {
        tensor.name: np.full([1] + [1 if d == -1 else d for d in tensor.dims], -1, tensor.dtype)
        for tensor in spec.inputs
        if not tensor.optional
    }


def _error_message(error: urllib.error.HTTPError) -> str:
    """Triton's own words: the `error` of its JSON answer."""
    try:
        return json.loads(error.read())["error"]
    except (OSError, ValueError, KeyError, TypeError):
        return str(error.reason)


def _json_tensor(name: str, array: np.ndarray) -> dict:
    datatype = np_to_triton_dtype(array.dtype)
    return {
        "name": name,
        "shape": list(array.shape),
        "datatype": datatype,
        "data": array.ravel().tolist(),
    }


class TritonAdmin:
    """Health, repository index, configs, loads, unloads, statistics and probes of one server."""

    def __init__(self, http_url: str, admin_key: str | None = None, timeout: float = 5.0):
        self.url = "http://" + http_url.split("://", 1)[-1].rstrip("/")
        self.headers = admin_headers(admin_key) or {}
        self.timeout = timeout

    def _call(self, path: str, body: dict | None = None, timeout: float | None = None):
        """The JSON answer of GET `path` (POST when there is a `body`)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data, self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            message = f"{path}: HTTP {error.code}: {_error_message(error)}"
            raise TritonAPIError(message, error.code) from None
        except (OSError, ValueError) as error:  # refused, reset, timed out; not JSON
            raise TritonAPIError(f"{path}: {error}") from None
        return json.loads(text) if text else None

    def is_ready(self) -> bool:
        try:
            self._call("/v2/health/ready", timeout=2.0)
            return True
        except TritonAPIError:
            return False

    def model_index(self) -> dict[str, tuple[str, str]]:
        """{model: (state, reason)} of the repository index; state 'READY' when serving."""
        index = self._call("/v2/repository/index", {})
        return {e["name"]: (e.get("state", ""), e.get("reason", "")) for e in index or []}

    def model_config(self, model: str) -> dict:
        return self._call(f"/v2/models/{quote(model)}/config")

    def load_model(self, model: str, config: Mapping | None, timeout: float) -> None:
        """Load `model`, with `config` as the override when given (a changed config makes Triton
        load a new copy and start new stubs)."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._call(f"/v2/repository/models/{quote(model)}/load", body, timeout)

    def unload_model(self, model: str) -> None:
        self._call(f"/v2/repository/models/{quote(model)}/unload", {})

    def success_counts(self) -> dict[str, int]:
        """{model: requests answered so far} from the inference statistics."""
        stats = self._call("/v2/models/stats")
        return {
            entry["name"]: int(entry["inference_stats"]["success"]["count"])
            for entry in stats.get("model_stats", [])
        }

    def probe(self, model: str, inputs: Mapping[str, np.ndarray], timeout: float = 10.0) -> str:
        """'alive', 'dead' (stub not healthy) or 'unknown' (busy, timeout, other error)."""
        tensors = [_json_tensor(name, array) for name, array in inputs.items()]
        try:
            self._call(f"/v2/models/{quote(model)}/infer", {"inputs": tensors}, timeout)
            return "alive"
        except TritonAPIError as error:
            if NOT_HEALTHY in str(error):
                return "dead"
            return "alive" if error.status == 400 else "unknown"
