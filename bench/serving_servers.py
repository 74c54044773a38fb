"""The servers the benchmarks start: for the serving benchmark one per dynamic-batching
setting, all up at once; for the reliability benchmark and the fault tests the serve command
(`ServePorts`); for the start-up and replica benchmarks a serve command they start, wait for
and stop (`ServeProcess`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from bench.loadgen import wait_until
from phoenix.serving.configs import write_repository
from phoenix.serving.profiles import profile
from phoenix.serving.triton_server import (
    TritonServer,
    flags_to_args,
    http_get_status,
    pick_free_ports,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def start_server(repo: Path, artifacts: Path, log: Path) -> TritonServer:
    server = TritonServer(
        repo,
        artifacts_dir=artifacts,
        extra_args=flags_to_args({"exit_timeout_secs": 5}),
        log_path=log,
        ready_timeout=600,
    )
    server.start_ready()
    return server


def repository_for(batching: str, args) -> Path:
    if batching == "on" and args.device == "cpu":
        return args.model_repository.resolve()
    device = "" if args.device == "cpu" else f"-{args.device}"
    dest = args.build_dir / f"model_repository{device}{'-nobatch' if batching == 'off' else ''}"
    return write_repository(
        dest, profile(args.device), dynamic_batching=batching == "on", source=args.model_repository
    )


def start_servers(args) -> dict[str, TritonServer]:
    """One server per batching setting, all up at once (an idle server costs no CPU)."""
    servers: dict[str, TritonServer] = {}
    try:
        for batching in args.batching:
            log = args.build_dir / f"tritonserver-batching-{batching}.log"
            print(f"== dynamic batching {batching}: starting tritonserver (log {log})", flush=True)
            servers[batching] = start_server(repository_for(batching, args), args.artifacts, log)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, TritonServer]) -> None:
    for server in servers.values():
        server.stop()


class ServePorts(NamedTuple):
    """The four ports of one serve command (loopback)."""

    http: int
    grpc: int
    metrics: int
    ready: int

    @classmethod
    def free(cls) -> ServePorts:
        return cls(*pick_free_ports(4))

    def command(
        self, artifacts: Path, build_dir: Path, drain_seconds: float, extra: Sequence[str] = ()
    ) -> list[str]:
        """The quiet serve command line on these ports, as tests and benchmarks start it;
        ``extra``: more serve options."""
        return [
            sys.executable, "-m", "phoenix.serving.serve", "--artifacts", str(artifacts),
            "--http-port", str(self.http), "--grpc-port", str(self.grpc),
            "--metrics-port", str(self.metrics), "--supervisor-port", str(self.ready),
            "--drain-seconds", str(drain_seconds), "--build-dir", str(build_dir), "--quiet",
            *extra,
        ]  # fmt: skip


class ServeProcess:
    """One serve command on free loopback ports: each ``start`` (a restart too) takes new
    ports and writes its output to ``work``; ``stop`` sends SIGTERM (serve drains) and kills
    the process group if it outlives ``timeout_s``."""

    def __init__(
        self, artifacts: Path, work: Path, drain_seconds: float, extra: Sequence[str] = ()
    ):
        self.artifacts, self.work, self.drain_seconds = artifacts, work, drain_seconds
        self.extra = tuple(extra)  # more serve options
        self.process: subprocess.Popen | None = None
        self.ports: ServePorts | None = None
        self.started = 0.0

    def start(self) -> ServeProcess:
        self.ports = ServePorts.free()
        self.work.mkdir(parents=True, exist_ok=True)
        build = self.work / "build"
        command = self.ports.command(self.artifacts, build, self.drain_seconds, self.extra)
        self.out = self.work / f"serve-{int(time.time())}.out"
        with self.out.open("wb") as out:
            self.process = subprocess.Popen(
                command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.started = time.monotonic()
        return self

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    @property
    def ready_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.ready}/ready"

    def is_ready(self) -> bool:
        return self.process.poll() is None and http_get_status(self.ready_url) == 200

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from the start to /ready 200."""
        if wait_until(self.is_ready, timeout_s, 0.05) is None:
            raise SystemExit(f"serve not ready after {timeout_s:.0f} s; see {self.out}")
        return time.monotonic() - self.started

    def status(self) -> dict:
        """The supervisor's /status (stub pids, models, events)."""
        url = f"http://127.0.0.1:{self.ports.ready}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read())

    def stop(self, timeout_s: float = 120) -> int | None:
        """The exit code (None if it never started)."""
        if self.process is None or self.process.poll() is not None:
            return self.process.poll() if self.process else None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()
