"""The Triton calls of the supervisor and the clean stop: HTTP/JSON with the admin key, a
connection per call, so every thread (the watch, the stop, each /ready request) is independent."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from urllib.parse import quote

from phoenix.ops.admin_key import admin_headers
from phoenix.util.processes import http_get_status


class TritonAPIError(RuntimeError):
    """Triton answered with an error status (or did not answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class TritonAdmin:
    """Health, repository index, configs, loads and unloads of one server."""

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
            try:  # Triton's own words
                message = json.loads(error.read())["error"]
            except (OSError, ValueError, KeyError, TypeError):
                message = str(error.reason)
            raise TritonAPIError(f"{path}: HTTP {error.code}: {message}", error.code) from None
        except (OSError, ValueError) as error:  # refused, reset, timed out; not JSON
            raise TritonAPIError(f"{path}: {error}") from None
        return json.loads(text) if text else None

    def is_ready(self) -> bool:
        return http_get_status(self.url + "/v2/health/ready") == 200

    def ready_status(self, timeout: float | None = None) -> int | None:
        """HTTP status of Triton's readiness endpoint; None when it did not answer in time."""
        return http_get_status(self.url + "/v2/health/ready", timeout or self.timeout)

    def model_index(self, timeout: float | None = None) -> dict[str, tuple[str, str]]:
        """{model: (state, reason)} of the repository index; state 'READY' when serving."""
        index = self._call("/v2/repository/index", {}, timeout)
        return {e["name"]: (e.get("state", ""), e.get("reason", "")) for e in index or []}

    def model_config(self, model: str, timeout: float | None = None) -> dict:
        return self._call(f"/v2/models/{quote(model)}/config", timeout=timeout)

    def load_model(self, model: str, config: Mapping | None, timeout: float) -> None:
        """Load `model`, with `config` as the override when given (a changed config makes Triton
        load a new copy and start new stubs)."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        self._call(f"/v2/repository/models/{quote(model)}/load", body, timeout)

    def unload_model(self, model: str) -> None:
        self._call(f"/v2/repository/models/{quote(model)}/unload", {})
