"""A bare tritonserver (no serve command, no supervisor) on free loopback ports, its options
given as keywords: ``exit_timeout_secs=5`` becomes ``--exit-timeout-secs=5``."""

from __future__ import annotations

import os

from phoenix.ops.triton_server import DEFAULT_READY_TIMEOUT_S, TritonServer, flags_to_args


def triton_server(
    model_repository: str | os.PathLike,
    artifacts_dir: str | os.PathLike | None = None,
    *,
    log_path: str | os.PathLike | None = None,
    env: dict[str, str] | None = None,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    **flags,
) -> TritonServer:
    """A TritonServer over ``model_repository``, not started (a context manager starts it,
    waits until ready and stops it)."""
    return TritonServer(
        model_repository,
        artifacts_dir=artifacts_dir,
        extra_args=flags_to_args(flags),
        env=env,
        log_path=log_path,
        ready_timeout=ready_timeout,
    )


def start_triton(model_repository, artifacts_dir=None, **options) -> TritonServer:
    """`triton_server` started and ready (stopped again when it fails to get ready)."""
    return triton_server(model_repository, artifacts_dir, **options).start_ready()
