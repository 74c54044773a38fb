"""The servers the benchmarks start: for the serving benchmark one per dynamic-batching
setting, all up at once; for the reliability benchmark and the fault tests the serve command
(`ServePorts`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from phoenix.serving.configs import write_repository
from phoenix.serving.profiles import profile
from phoenix.serving.triton_server import TritonServer, flags_to_args, pick_free_ports


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

    def command(self, artifacts: Path, build_dir: Path, drain_seconds: float) -> list[str]:
        """The quiet serve command line on these ports, as tests and benchmarks start it."""
        return [
            sys.executable, "-m", "phoenix.serving.serve", "--artifacts", str(artifacts),
            "--http-port", str(self.http), "--grpc-port", str(self.grpc),
            "--metrics-port", str(self.metrics), "--supervisor-port", str(self.ready),
            "--drain-seconds", str(drain_seconds), "--build-dir", str(build_dir), "--quiet",
        ]  # fmt: skip
