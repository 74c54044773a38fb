"""Where a running `serve` can be found: `<build dir>/serving.json`, written once the server is
ready and removed when it stops (imports the standard library only, so clients read it cheaply).

    {"pid": 1234, "http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001",
     "metrics": "http://127.0.0.1:8002/metrics", "ready": "http://127.0.0.1:8003/ready",
     "repository": "/abs/build/serve/tritonserver-1234.repository-x", "artifacts": "/abs/...",
     "artifact_version": "sha256-4df3b6153bfd",
     "admin_key_file": "/abs/build/serve/admin-key" or null,
     "user_state": {"url": "redis://127.0.0.1:8004/0", "password_left_out": false,
                    "dir": "/abs/build/serve/user-state" or null, "appendfsync": "no" or null,
                    "started_by_serve": true}}

The operators' tools (`phoenix-rollout`, `phoenix-events`) read it so that nobody hunts for the
repository copy tritonserver serves, the admin key's file or the user-state store.
`phoenix-rollout` rewrites "artifacts" and "artifact_version" after it switches the server to
another version (or back), so the file names what is served, not what serve started with.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

SERVING_FILE = "serving.json"
DEFAULT_SERVE_DIR = Path("build/serve")


class ServingStateError(RuntimeError):
    """No running server's state where it was looked for (the message says what to do)."""


def write_serving_state(build_dir: Path, state: dict[str, Any]) -> Path:
    """The state of this serve process in ``build_dir`` (atomically: readers never see half)."""
    path = Path(build_dir) / SERVING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"pid": os.getpid(), **state}, indent=1) + "\n")
    os.replace(partial, path)
    return path


def update_serving_state(build_dir: Path, pid: int, changes: dict[str, Any]) -> bool:
    """``changes`` written into the state in ``build_dir`` (atomically) when it is still that of
    the serve process ``pid``; False, and nothing written, when it is not (gone, replaced or
    unreadable)."""
    path = Path(build_dir) / SERVING_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    if state.get("pid") != pid:
        return False
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({**state, **changes}, indent=1) + "\n")
    os.replace(partial, path)
    return True


def remove_serving_state(build_dir: Path) -> None:
    """Remove the state file when it is this process's (another serve may have replaced it)."""
    path = Path(build_dir) / SERVING_FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def read_serving_state(build_dir: Path, url: Optional[str] = None) -> dict[str, Any]:
    """The state of the server running from ``build_dir``, which must answer at ``url``
    (host:port, HTTP or gRPC) when given; ServingStateError naming the file otherwise."""
    path = Path(build_dir) / SERVING_FILE
    start = f"start one with `phoenix-serve` or `make serve` (--build-dir {build_dir})"
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise ServingStateError(f"no running server described in {path}: {start}") from None
    except (OSError, ValueError) as error:
        raise ServingStateError(f"{path} is not readable JSON ({error})") from None
    if not isinstance(state.get("pid"), int) or not _alive(state["pid"]):
        raise ServingStateError(
            f"the server {path} describes (pid {state.get('pid')}) is not running: {start}"
        )
    if url is not None:
        address = url.split("://", 1)[-1]
        served = {state.get("http"), state.get("grpc")}
        if address not in served:
            raise ServingStateError(
                f"{path} describes a server at {' and '.join(sorted(map(str, served)))}, not "
                f"{address}: give its --build-dir, or --repository and the admin key"
            )
    return state
