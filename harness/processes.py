"""A command started in a session of its own, its output kept in a log file, stopped as a
process group: SIGTERM first (the command may drain), SIGKILL to the group when it outlives
the bound (its children, say tritonserver's stubs, go with it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from harness import REPO_ROOT
from phoenix.util.processes import read_log_tail


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (killed, not reaped by its parent)."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


class LoggedProcess:
    """``command`` run from ``cwd`` with its stdout and stderr in ``log``."""

    def __init__(
        self,
        command: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = REPO_ROOT,
    ):
        self.command, self.log, self.cwd = list(command), Path(log), cwd
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen | None = None

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
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def send_signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None when it still runs after ``timeout_s``."""
        try:
            return self.process.wait(timeout_s)
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
