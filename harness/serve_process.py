"""The serve command (`python -m phoenix.ops.serve`, what `phoenix-serve` runs) on free
loopback ports, as the tests and the benchmarks start it: quiet, its output in a log file
under its work folder, waited for until its supervisor's /ready answers 200, stopped with
SIGTERM (serve drains, then unloads) and killed as a process group when it outlives the bound.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from phoenix.ops.triton_server import DEFAULT_READY_TIMEOUT_S
from phoenix.util.processes import (
    LOOPBACK,
    LoggedProcess,
    StartsReady,
    http_get_status,
    pick_free_ports,
)

DEFAULT_STOP_TIMEOUT_S = 120.0


class ServeError(RuntimeError):
    """The serve command exited or was not ready in time (the message holds its log's tail)."""


class ServePorts(NamedTuple):
    """The four ports of one serve command (loopback); ``ready``: the supervisor's."""

    http: int
    grpc: int
    metrics: int
    ready: int

    @classmethod
    def free(cls) -> ServePorts:
        return cls(*pick_free_ports(4))


def serve_command(
    ports: ServePorts,
    artifacts: Path,
    build_dir: Path,
    drain_seconds: float,
    extra: Sequence[str] = (),
) -> list[str]:
    """The quiet serve command line on ``ports``; ``extra``: more serve options."""
    return [
        sys.executable, "-m", "phoenix.ops.serve", "--artifacts", str(artifacts),
        "--http-port", str(ports.http), "--grpc-port", str(ports.grpc),
        "--metrics-port", str(ports.metrics), "--supervisor-port", str(ports.ready),
        "--drain-seconds", str(drain_seconds), "--build-dir", str(build_dir), "--quiet",
        *extra,
    ]  # fmt: skip


class ServeProcess(StartsReady):
    """One serve command over ``artifacts``; each ``start`` (a restart too) takes new free
    ports and a new log file in ``work`` (serve.out, then serve-2.out, ...); its build folder
    (generated repository, admin key) is ``work/build``.

    ``extra``: more serve options; ``env``: its environment (default: this one's); ``wrap``:
    turns the command line into the one to run (say, a `make` recipe that runs it). As a
    context manager it starts, waits until ready and stops.
    """

    def __init__(
        self,
        artifacts: Path,
        work: Path,
        drain_seconds: float,
        extra: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ):
        self.artifacts, self.work, self.drain_seconds = Path(artifacts), Path(work), drain_seconds
        self.extra, self.env, self.wrap = tuple(extra), env, wrap
        self.ready_timeout_s = ready_timeout_s
        self.ports: ServePorts | None = None
        self.process: LoggedProcess | None = None
        self.starts = 0
        self.started = 0.0

    @property
    def build_dir(self) -> Path:
        return self.work / "build"

    def running(self) -> LoggedProcess:
        """The serve process (``start`` first: otherwise a RuntimeError)."""
        if self.process is None:
            raise RuntimeError("serve was not started")
        return self.process

    @property
    def log(self) -> Path:
        return self.running().log

    def _name_urls(self) -> None:
        """Where this start answers (each start takes new ports): http_url and grpc_url as
        tritonclient takes them, the metrics, /ready and /status URLs."""
        assert self.ports is not None  # start() picked them
        http, grpc, metrics, ready = (f"{LOOPBACK}:{port}" for port in self.ports)
        self.http_url, self.grpc_url = http, grpc
        self.metrics_url = f"http://{metrics}/metrics"
        self.ready_url, self.status_url = f"http://{ready}/ready", f"http://{ready}/status"

    def start(self) -> ServeProcess:
        self.ports = ServePorts.free()
        self._name_urls()
        self.starts += 1
        command = serve_command(
            self.ports, self.artifacts, self.build_dir, self.drain_seconds, self.extra
        )
        if self.wrap is not None:
            command = self.wrap(command)
        name = "serve.out" if self.starts == 1 else f"serve-{self.starts}.out"
        self.process = LoggedProcess(command, self.work / name, env=self.env).start()
        self.started = time.monotonic()
        return self

    # -- readiness ---------------------------------------------------------------------
    def is_ready(self) -> bool:
        return self.running().is_running() and http_get_status(self.ready_url) == 200

    def wait_ready(self, timeout_s: float | None = None, interval_s: float = 0.05) -> float:
        """Seconds from the start to /ready 200; ServeError, with the log's tail, when serve
        exits first or ``timeout_s`` (default: the constructor's) passes."""
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline, process = time.monotonic() + timeout_s, self.running()
        while http_get_status(self.ready_url) != 200:
            if not process.is_running():
                raise ServeError(process.failure("serve exited before it was ready"))
            if time.monotonic() > deadline:
                raise ServeError(process.failure(f"serve not ready after {timeout_s:.0f} s"))
            time.sleep(interval_s)
        return time.monotonic() - self.started

    def status(self) -> dict:
        """The supervisor's /status (server pid, stub pids, models, events)."""
        with urllib.request.urlopen(self.status_url, timeout=5) as response:
            return json.loads(response.read())

    # -- stopping ----------------------------------------------------------------------
    def terminate(self) -> None:
        """SIGTERM: serve turns /ready 503, drains, unloads and exits."""
        self.running().send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit code, or None when serve still runs after ``timeout_s``."""
        return self.running().wait_exit(timeout_s)

    def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL to its group after ``timeout_s``; the exit code (None if it
        never started)."""
        return self.process.stop(timeout_s) if self.process else None

    def kill(self) -> int | None:
        return self.process.kill() if self.process else None
