"""Run the Phoenix models on Triton: `python -m phoenix.serving.serve --help`.

Foreground mode runs until Ctrl-C (or SIGTERM), then drains and stops cleanly
(`phoenix/serving/shutdown.py`). `--demo` starts the server, runs one end-to-end recommendation
and stops. Triton's admin APIs always need the admin key (`phoenix/serving/admin_key.py`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple, TextIO

from phoenix.command_line import command_parser
from phoenix.serving.admin_key import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    AdminKeyError,
    server_admin_key,
)
from phoenix.serving.repository import PbtxtError, derive_repository
from phoenix.serving.shutdown import Shutdown, wait_in_short_naps
from phoenix.serving.supervisor import ReadinessServer, Supervisor
from phoenix.serving.triton_server import (
    TritonServer,
    TritonServerError,
    client_host,
    flags_to_args,
    pick_free_ports,
)

DEFAULT_ARTIFACTS = Path("artifacts/demo")
DEFAULT_MODEL_REPOSITORY = Path("model_repository")
DEFAULT_BUILD_DIR = Path("build/serve")
# Triton's own exit timeout: after our unloads (shutdown.py) it only waits for idle HTTP
# keep-alive connections, which clients never close on their own.
EXIT_TIMEOUT_S = 3
DEFAULT_STOP_TIMEOUT_S = 30.0
DEFAULT_SUPERVISOR_PORT = 8003
# APIs that change the server (load/unload = run model code, shared memory, trace, log settings)
# need the admin key; inference, health, metadata, config and statistics stay open.
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"


class ServeError(RuntimeError):
    """A problem the user can fix (printed without a traceback)."""


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0..65535; 0 = any free port)")
    return value


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


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m phoenix.serving.serve",
        "Serve the Phoenix ranker and retriever on Triton Inference Server "
        "(the tritonserver shipped in nvidia-pytriton, Python backend).",
        "Examples:\n"
        "  python -m phoenix.serving.serve --artifacts artifacts/demo\n"
        "  python -m phoenix.serving.serve --device gpu --http-port 9000\n"
        "  python -m phoenix.serving.serve --demo\n"
        "Port 0 picks a free port. Metrics: curl http://HOST:METRICS_PORT/metrics",
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=DEFAULT_ARTIFACTS,
        help="artifact directory with config.json and weights, passed to the models as "
        "PHOENIX_ARTIFACT_DIR (default: %(default)s; `make artifacts` creates it)",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="cpu: serve model_repository as is; gpu: serve a copy whose instance groups are "
        "KIND_GPU (needs jax[cuda12]==0.6.2) (default: %(default)s)",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    for name, default, what in (
        ("--http-port", 8000, "HTTP/REST (KServe v2)"),
        ("--grpc-port", 8001, "gRPC (KServe v2)"),
        ("--metrics-port", 8002, "Prometheus metrics"),
    ):
        parser.add_argument(
            name,
            type=port,
            default=default,
            metavar="PORT",
            help=f"{what} port; 0 picks a free one (default: %(default)s)",
        )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=DEFAULT_MODEL_REPOSITORY,
        help="source model repository (default: %(default)s)",
    )
    parser.add_argument(
        "--no-dynamic-batching",
        action="store_true",
        help="serve a copy without dynamic_batching blocks (one request per execution)",
    )
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        metavar="US",
        help="serve a copy with this max_queue_delay_microseconds in every dynamic_batching",
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=DEFAULT_BUILD_DIR,
        help="where derived repositories and server logs go (default: %(default)s)",
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds to wait for all models to load (default: %(default)s)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="do not echo the server log to the terminal"
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="start, wait until ready, run one end-to-end recommendation, stop",
    )
    add_reliability_arguments(parser)
    return parser


def add_reliability_arguments(parser: argparse.ArgumentParser) -> None:
    """Supervisor, drain and admin-key options (see docs/reliability.md and SECURITY.md)."""
    parser.add_argument(
        "--supervisor-port",
        type=port,
        default=DEFAULT_SUPERVISOR_PORT,
        metavar="PORT",
        help="port of the supervisor's /ready, /live and /status; load balancers should probe "
        "/ready; 0 picks a free one (default: %(default)s)",
    )
    parser.add_argument(
        "--no-supervisor",
        action="store_true",
        help="do not run the supervisor (no stub healing, no /ready; model control mode stays "
        "'none')",
    )
    parser.add_argument(
        "--drain-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="on SIGTERM/Ctrl-C, answer 503 on /ready for S seconds before stopping Triton, so "
        "load balancers stop sending first (default: %(default)s)",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=DEFAULT_STOP_TIMEOUT_S,
        metavar="S",
        help="after the drain, seconds that in-flight requests get to finish while the models "
        "unload; a stop that takes longer exits 1 and says why (default: %(default)s)",
    )
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        metavar="NAME",
        help="environment variable with the admin key that Triton's model-repository, "
        f"shared-memory, trace and logging APIs need (header '{ADMIN_HEADER}: <key>'); unset: "
        "a random key kept in BUILD_DIR/admin-key (mode 0600) (default: %(default)s)",
    )


def validate_artifacts(artifacts: Path) -> Path:
    """Absolute artifact directory, or ServeError saying how to create it."""
    if not artifacts.is_dir():
        raise ServeError(
            f"artifact directory {artifacts} does not exist. Create demo artifacts with "
            f"`make artifacts` or `python -m phoenix.artifacts --preset mini --out {artifacts}`."
        )
    if not (artifacts / "config.json").is_file():
        raise ServeError(
            f"{artifacts} has no config.json: it is not a Phoenix artifact directory "
            "(see `python -m phoenix.artifacts --help`)."
        )
    return artifacts.resolve()


def validate_model_repository(repository: Path) -> Path:
    if not repository.is_dir():
        raise ServeError(f"model repository {repository} does not exist.")
    return repository.resolve()


def admin_key_for(build_dir: Path, env_name: str = ADMIN_KEY_ENV) -> tuple[str, Path | None]:
    """The admin key (from $env_name, else generated into BUILD_DIR/admin-key) and its file."""
    try:
        return server_admin_key(build_dir, env_name)
    except AdminKeyError as error:
        raise ServeError(str(error)) from None


def check_port_free(host: str, port_: int, option: str) -> None:
    """Fail before starting Triton when a port we must bind is taken (0 = any: always free)."""
    if port_ == 0:
        return
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port_))
        except OSError as error:
            raise ServeError(
                f"{option} {port_} on {host} is not free ({error.strerror}): pick another port, "
                "0 for any free one, or --no-supervisor"
            ) from None


def server_flags(supervised: bool, admin_key: str) -> dict[str, object]:
    """tritonserver options: exit timeout, explicit model control for the supervisor's
    reloads and the clean stop's unloads, and the admin-key restriction of the APIs that
    change the server (on every bind, loopback too)."""
    flags: dict[str, object] = {"exit_timeout_secs": EXIT_TIMEOUT_S}
    if supervised:
        flags.update(model_control_mode="explicit", load_model="*")
    restriction = f"{RESTRICTED_APIS}:{ADMIN_HEADER}={admin_key}"
    flags.update(http_restricted_api=restriction, grpc_restricted_protocol=restriction)
    return flags


def needs_derived_repository(args: argparse.Namespace) -> bool:
    return args.device == "gpu" or args.no_dynamic_batching or args.max_queue_delay_us is not None


def prepare_repository(args: argparse.Namespace) -> Path:
    """The repository to serve: the source itself, or a derived copy under --build-dir."""
    source = validate_model_repository(args.model_repository)
    if not needs_derived_repository(args):
        return source
    suffix = args.device + ("-nobatch" if args.no_dynamic_batching else "")
    return derive_repository(
        source,
        args.build_dir / f"model_repository-{suffix}",
        device=args.device,
        dynamic_batching=not args.no_dynamic_batching,
        max_queue_delay_us=args.max_queue_delay_us,
    )


def warn_if_no_gpu_jax(device: str) -> None:
    """JAX without its CUDA plugin silently runs on the CPU: say so up front."""
    plugins = ("jax_cuda13_plugin", "jax_cuda12_plugin")
    if device == "gpu" and not any(importlib.util.find_spec(p) for p in plugins):
        print(
            "warning: --device gpu but jax's CUDA plugin is not installed; the models will run "
            "on the CPU. Install it with: make setup DEVICE=gpu (requirements-gpu.txt)",
            file=sys.stderr,
        )


def make_server(
    args: argparse.Namespace, repository: Path, artifacts: Path, admin_key: str
) -> TritonServer:
    supervised = not (getattr(args, "no_supervisor", True) or getattr(args, "demo", False))
    return TritonServer(
        repository,
        artifacts_dir=artifacts,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=flags_to_args(server_flags(supervised, admin_key)),
        # One log per run: several people may serve from the same checkout at once.
        log_path=args.build_dir / f"tritonserver-{os.getpid()}.log",
        ready_timeout=args.ready_timeout,
    )


def follow_log(path: Path, stop: threading.Event, out: TextIO) -> None:
    """Copy lines appended to `path` onto `out` until `stop` is set (then drain the rest)."""
    while not path.exists() and not stop.is_set():
        time.sleep(0.1)
    if not path.exists():
        return
    with path.open("r", errors="replace") as log:
        while True:
            line = log.readline()
            if line:
                out.write(line)
                out.flush()
            elif stop.is_set():
                return
            else:
                time.sleep(0.1)


def start_log_echo(server: TritonServer) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(
        target=follow_log, args=(server.log_path, stop, sys.stdout), daemon=True
    )
    thread.start()
    return thread, stop


def describe(
    server: TritonServer, ready_url: str | None = None, key_file: Path | None = None
) -> str:
    key = f"in {key_file} (mode 0600)" if key_file else "from $" + ADMIN_KEY_ENV
    text = (
        f"Triton is ready after {server.ready_after_s:.1f} s\n"
        f"  HTTP     http://{server.http_url}  (tritonclient url: {server.http_url})\n"
        f"  gRPC     {server.grpc_url}\n"
        f"  metrics  {server.metrics_url}\n"
        f"  log      {server.log_path}\n"
        f"  admin    key {key}; header '{ADMIN_HEADER}' (SECURITY.md)"
    )
    if ready_url:
        text += f"\n  ready    {ready_url}  (supervisor: probe this from a load balancer)"
    return text


def start_supervisor(
    server: TritonServer, port_: int, admin_key: str
) -> tuple[Supervisor, ReadinessServer]:
    """The supervisor over a ready server, and its /ready endpoint on the server's host."""
    supervisor = Supervisor(server.http_url, server.pid, admin_key=admin_key).start()
    endpoint = ReadinessServer(supervisor, server.host, port_).start()
    return supervisor, endpoint


def serve_foreground(
    server: TritonServer,
    echo_log: bool,
    admin_key: str,
    supervisor_port: int | None = None,
    drain_seconds: float = 0.0,
    key_file: Path | None = None,
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
) -> int:
    """Run until the server exits (on its own or after a signal, see shutdown.py); with a
    `supervisor_port`, the supervisor heals dead stubs and serves /ready meanwhile."""
    echo = start_log_echo(server) if echo_log else None
    supervisor = endpoint = None
    try:
        server.wait_ready()
        ready_url = None
        if supervisor_port is not None:
            supervisor, endpoint = start_supervisor(server, supervisor_port, admin_key)
            ready_url = f"http://{client_host(server.host)}:{endpoint.port}/ready"
        print(describe(server, ready_url, key_file), flush=True)
        print("Ctrl-C stops the server.", flush=True)
        # Unloading before the stop needs explicit model control, which the supervisor brings.
        admin = supervisor.admin if supervisor is not None else None
        shutdown = Shutdown(server, admin, supervisor, drain_seconds, stop_timeout_s)
        shutdown.install()
        return shutdown.exit_code(wait_in_short_naps(server.wait))
    finally:
        if supervisor is not None:
            supervisor.stop()
            endpoint.stop()
        server.stop()
        if echo:
            thread, stop = echo
            stop.set()
            thread.join(timeout=2)


def load_demo():
    """`phoenix.serving.demo.run_demo`, imported only for --demo (it pulls in model code)."""
    try:
        from phoenix.serving.demo import run_demo
    except ModuleNotFoundError as error:
        if error.name not in ("phoenix.serving.demo", "phoenix.serving"):
            raise
        raise ServeError("--demo needs phoenix/serving/demo.py, which is missing") from error
    return run_demo


def run_demo_once(server: TritonServer, artifacts: Path, run_demo) -> int:
    """Wait until ready, run one end-to-end recommendation, stop the server."""
    try:
        server.wait_ready()
        print(describe(server), flush=True)
        run_demo(server.http_url, artifacts)
    finally:
        server.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        artifacts = validate_artifacts(args.artifacts)
        repository = prepare_repository(args)
        warn_if_no_gpu_jax(args.device)
        run_demo = load_demo() if args.demo else None
        admin_key, key_file = admin_key_for(args.build_dir, args.admin_key_env)
        if not (args.no_supervisor or args.demo):
            check_port_free(args.host, args.supervisor_port, "--supervisor-port")
        server = make_server(args, repository, artifacts, admin_key)
        print(f"starting tritonserver over {repository} (artifacts: {artifacts})", flush=True)
        server.start()
        if args.demo:
            return run_demo_once(server, artifacts, run_demo)
        return serve_foreground(
            server,
            echo_log=not args.quiet,
            admin_key=admin_key,
            supervisor_port=None if args.no_supervisor else args.supervisor_port,
            drain_seconds=args.drain_seconds,
            key_file=key_file,
            stop_timeout_s=args.stop_timeout,
        )
    except (ServeError, TritonServerError, PbtxtError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
