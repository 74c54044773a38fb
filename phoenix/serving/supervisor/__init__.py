"""Heal dead models and tell a load balancer the truth about readiness.

Triton 2.51 does not restart a model's stub process when it dies: every request to that model
then fails with "Stub process '<instance>' is not healthy" while `/v2/health/ready` and the
model's ready endpoint keep answering 200. The supervisor runs beside the server (the serve
command starts it) and

- watches the stub processes that are children of tritonserver (`processes`, psutil);
  optionally probes each model with a request its own validation refuses (`probe`);
- reads the repository index: a served model that is no longer READY was either unloaded by
  an operator (the admin key is needed for that: respected) or lost (healed) (`state`);
- reloads a dead model through the model-repository API (`admin`, tritonclient) with its
  *current* config plus a restart marker, with back-off and a cap on failed reloads;
- serves `/ready` (200 only when every served model is READY and healthy, ensembles' steps
  included, and the server is not draining), `/live` and `/status` (`endpoints`).

`python -m phoenix.serving.supervisor --help` runs it against a server started some other way.
"""

from phoenix.serving.admin_key import ADMIN_HEADER, ADMIN_KEY_ENV
from phoenix.serving.supervisor.admin import NOT_HEALTHY, TritonAdmin, TritonAPIError
from phoenix.serving.supervisor.configs import (
    RESTART_PARAMETER,
    composing_models,
    expected_instances,
    has_stubs,
    with_restart_marker,
)
from phoenix.serving.supervisor.endpoints import ReadinessServer
from phoenix.serving.supervisor.probe import probe_inputs
from phoenix.serving.supervisor.processes import (
    StubProcess,
    is_alive,
    list_stubs,
    rss_bytes,
    stub_instance_of,
)
from phoenix.serving.supervisor.state import ModelState, Supervisor

__all__ = [
    "ADMIN_HEADER",
    "ADMIN_KEY_ENV",
    "NOT_HEALTHY",
    "RESTART_PARAMETER",
    "ModelState",
    "ReadinessServer",
    "StubProcess",
    "Supervisor",
    "TritonAPIError",
    "TritonAdmin",
    "composing_models",
    "expected_instances",
    "has_stubs",
    "is_alive",
    "list_stubs",
    "probe_inputs",
    "rss_bytes",
    "stub_instance_of",
    "with_restart_marker",
]
