"""Serving Phoenix on Triton: server process control, derived model repositories, CLI."""

from phoenix.serving.repository import derive_repository
from phoenix.serving.triton_server import TritonServer, TritonServerError

__all__ = ["TritonServer", "TritonServerError", "derive_repository"]
