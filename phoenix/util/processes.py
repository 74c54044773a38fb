"""Child processes of ours (tritonserver, redis-server, serve in tests): started so that they
die with us, on free ports, probed over HTTP, their logs' last lines; a command logged to a
file and stopped as a process group (``LoggedProcess``)."""

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
from collections.abc import Mapping, Sequence
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

    def start(self) -> object:
        raise NotImplementedError

    def wait_ready(self) -> object:
        raise NotImplementedError

    def stop(self) -> object:
        raise NotImplementedError

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


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (killed, not reaped by its parent)."""
    import psutil  # here: this package imports the standard library only at import time

    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


class LoggedProcess:
    """``command`` run from ``cwd`` (ours when None) with its stdout and stderr in ``log``, in a
    session of its own, stopped as a process group: SIGTERM first (the command may drain),
    SIGKILL to the group when it outlives the bound (its children, say tritonserver's stubs,
    go with it)."""

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Optional[Path] = None,
    ):
        self.command, self.log, self.cwd = list(command), Path(log), cwd
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen | None = None

    def started(self) -> subprocess.Popen:
        """The child process (``start`` first: otherwise a RuntimeError)."""
        if self.process is None:
            raise RuntimeError(f"{self.command[0]} was not started")
        return self.process

    def start(self) -> LoggedProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            # A session of its own: signals to the test's terminal never reach it, and its
            # whole group can be killed at once.
            self.process = subprocess.Popen(
                self.command, cwd=self.cwd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        return self.started().pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send_signal(self, signum: int) -> None:
        self.started().send_signal(signum)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None when it still runs after ``timeout_s``."""
        try:
            return self.started().wait(timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> int | None:
        """SIGKILL to the whole group (if it still runs); the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        return self.process.wait()

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM, then `kill` when it outlives ``timeout_s``; the exit code (None if it never
        started)."""
        if not self.is_running():
            return self.returncode
        self.send_signal(signal.SIGTERM)
        code = self.wait_exit(timeout_s)
        return code if code is not None else self.kill()

    def log_tail(self, lines: int = 60) -> str:
        return read_log_tail(self.log, lines)

    def failure(self, reason: str) -> str:
        """``reason``, the command's exit code and the tail of its log, for an error."""
        return f"{reason} (exit code {self.returncode}); {self.log}, last lines:\n{self.log_tail()}"
