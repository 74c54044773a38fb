"""Lets redis-py import inside Triton's Python-backend stubs.

The stubs embed Debian's libpython 3.11.2 over the venv's Python (pyenv's 3.11.7: its standard
library and packages). Two things redis-py 8 needs at import are then missing:

- ``async_timeout``, which redis-py imports on Pythons before 3.11.3 and pip installs only for
  them: ``asyncio.timeout`` (Python 3.11) is the same context manager;
- ``ssl``: 3.11.7's ``_ssl`` extension needs a symbol 3.11.2 lacks, and ``import redis`` fails
  without ssl (``redis.asyncio`` names ``ssl.VerifyMode``). The runtime's own ``_ssl`` (Debian's,
  built for it) is loaded instead.

Imported before anything imports redis (``phoenix.user_state`` imports it first); elsewhere it
changes nothing.
"""

import asyncio
import glob
import importlib.machinery
import importlib.util
import sys
import types


def _timeout_module() -> None:
    try:
        import async_timeout  # noqa: F401
    except ImportError:
        shim = types.ModuleType("async_timeout")
        shim.__dict__["timeout"] = asyncio.timeout
        sys.modules["async_timeout"] = shim


def _runtime_ssl() -> None:
    """Load the system Python's ``_ssl`` when the one on the path does not load."""
    try:
        import ssl  # noqa: F401

        return
    except ImportError:
        pass
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for path in sorted(glob.glob(f"/usr/lib/python{version}/lib-dynload/_ssl.*.so")):
        loader = importlib.machinery.ExtensionFileLoader("_ssl", path)
        spec = importlib.util.spec_from_file_location("_ssl", path, loader=loader)
        if spec is None:
            continue
        try:
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except ImportError:
            continue
        sys.modules["_ssl"] = module
        return


if sys.version_info < (3, 11, 3):
    _timeout_module()
    _runtime_ssl()
