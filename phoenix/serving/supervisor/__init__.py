"""Heal dead models and tell a load balancer the truth about readiness.

Triton 2.51 does not restart a model's stub process when it dies: every request to that model
then fails with "Stub process '<instance>' is not healthy" while `/v2/health/ready` and the
model's ready endpoint keep answering 200. The supervisor runs beside the server (the serve
command starts it) and

- watches the stub processes, which register themselves (`stubs`); optionally probes each model
  with a request its own validation refuses (`admin.probe_inputs`);
- reads the repository index: a served model that is no longer READY was either unloaded by an
  operator (the admin key is needed for that: respected) or lost (healed) (`state`);
- reloads a dead model through the model-repository API (`admin`, tritonclient) with its
  *current* config plus a restart marker, with back-off and a cap on failed reloads;
- serves `/ready` (200 only when every served model is READY and healthy, ensembles' steps
  included, and the server is not draining), `/live` and `/status` (`endpoints`).

`python -m phoenix.serving.supervisor --help` runs it against a server started some other way.
Names are imported lazily: a stub imports `stubs` alone, without tritonclient and gevent.
"""

from importlib import import_module

_NAMES = {
    "phoenix.serving.admin_key": "ADMIN_HEADER ADMIN_KEY_ENV",
    "phoenix.serving.supervisor.admin": "NOT_HEALTHY TritonAdmin TritonAPIError probe_inputs",
    "phoenix.serving.supervisor.endpoints": "ReadinessServer",
    "phoenix.serving.supervisor.state": "RESTART_PARAMETER ModelState Supervisor composing_models "
    "expected_instances has_stubs with_restart_marker",
    "phoenix.serving.supervisor.stubs": "StubProcess is_alive list_stubs register_stub rss_bytes "
    "stub_dir_of",
}
_EXPORTS = {name: module for module, names in _NAMES.items() for name in names.split()}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
