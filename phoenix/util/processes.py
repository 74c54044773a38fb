"""Child processes of ours (tritonserver, redis-server, serve in tests): started so that they
die with us, on free ports, probed over HTTP, their logs' last lines."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

LOOPBACK = "127.0.0.1"
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

# A child (tritonserver, redis-server) is started through a fresh interpreter that asks for
# SIGKILL on its launcher's death and then becomes the child (same pid): no Python runs in the
# forked child of this multithreaded process (a preexec_fn would, and may deadlock; JAX warns).
_EXEC_DYING_WITH_PARENT = (
    "import os, signal, sys; from phoenix.util.processes import die_with_parent; "
    "die_with_parent(signal.SIGKILL, int(sys.argv[1])); os.execv(sys.argv[2], sys.argv[2:])"
)


def dying_with_us(command: Sequence[str]) -> list[str]:
    """``command`` (its first word a path) run so that it is SIGKILLed when we die."""
    return [sys.executable, "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *command]


def die_with_parent(signum: int, parent_pid: int) -> None:
    """Have the kernel send `signum` to this process when its parent *thread* dies (Linux); a
    parent that died before this call (getppid() is no longer `parent_pid`) sends it at once."""
    if _LIBC is None:
        return
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signum)


def stop_process(process: subprocess.Popen, timeout_s: float) -> Optional[int]:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


# "low-high": pick_free_ports draws from this range instead of the kernel's ephemeral ports.
# Processes given disjoint ranges (the test workers of `make test`) never pick a port the
# other has picked but not yet bound (a server binds seconds after its ports are chosen).
PORT_RANGE_ENV = "PHOENIX_PORT_RANGE"


def pick_free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports free on `host` right now (held together so they differ), from
    $PHOENIX_PORT_RANGE when it is set."""
    span = os.environ.get(PORT_RANGE_ENV)
    with contextlib.ExitStack() as held:
        if not span:
            sockets = [held.enter_context(socket.socket()) for _ in range(count)]
            for sock in sockets:
                sock.bind((host, 0))
            return [sock.getsockname()[1] for sock in sockets]
        low, high = (int(end) for end in span.split("-"))
        ports: list[int] = []
        for port in random.sample(range(low, high + 1), high + 1 - low):
            sock = socket.socket()
            try:
                sock.bind((host, port))
            except OSError:  # in use
                sock.close()
                continue
            held.enter_context(sock)
            ports.append(port)
            if len(ports) == count:
                return ports
        raise OSError(f"fewer than {count} free ports in ${PORT_RANGE_ENV}={span}")


def client_host(bind_host: str) -> str:
    """Address a client on this machine should dial for a server bound to `bind_host`."""
    return LOOPBACK if bind_host in ("", "0.0.0.0") else bind_host


def read_log_tail(path: Path | None, lines: int = 40) -> str:
    """Last `lines` lines of a log file ('' when there is none)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(max(0, handle.seek(0, os.SEEK_END) - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def http_get_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of GET `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:  # refused, reset, timed out
        return None


class StartsReady:
    """A process with ``start``, ``wait_ready`` and ``stop``: as a context manager it starts,
    waits until ready and stops; one that fails to get ready is stopped."""

    def start_ready(self):
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self):
        return self.start_ready()

    def __exit__(self, *exc_info) -> None:
        self.stop()


def echo_log(path: Path, stop: threading.Event) -> None:
    """Copy the lines appended to `path` onto stdout until `stop` is set (then the rest)."""
    with path.open("r", errors="replace") as log:
        while (line := log.readline()) or not stop.is_set():
            if line:
                print(line, end="", flush=True)
            else:
                time.sleep(0.1)
