"""Serving Phoenix on Triton: server process control, generated model configs, CLI.

Names are imported lazily so `python -m phoenix.serving.<module>` and model.py files inside
Triton's stubs only load what they use.
"""

from importlib import import_module

_EXPORTS = {
    "TritonServer": "phoenix.serving.triton_server",
    "TritonServerError": "phoenix.serving.triton_server",
    "write_repository": "phoenix.serving.configs",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
