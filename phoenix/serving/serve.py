"""Run the Phoenix models on Triton: `python -m phoenix.serving.serve --help`.

Foreground mode runs until Ctrl-C (or SIGTERM), then drains and stops cleanly (`shutdown.py`).
Triton's admin APIs always need the admin key (`admin_key.py`). `make_server` builds the server
this command runs; `clients/demo.py` starts the same one.

Nothing outlives the command: tritonserver and its stubs die with it, even when it is killed
with SIGKILL (`triton_server.py`), and it stops as on SIGTERM when the process that started it
dies (`make serve` when make is killed), unless it was detached on purpose (`stop_with_parent`).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from phoenix.command_line import command_parser
from phoenix.serving.admin_key import ADMIN_HEADER, ADMIN_KEY_ENV, AdminKeyError, server_admin_key
from phoenix.serving.configs import ConfigError, write_repository
from phoenix.serving.profiles import profile
from phoenix.serving.shutdown import Shutdown, wait_in_short_naps
from phoenix.serving.supervisor.endpoints import ReadinessServer
from phoenix.serving.supervisor.state import Supervisor
from phoenix.serving.triton_server import (
    LOOPBACK,
    TritonServer,
    TritonServerError,
    client_host,
    die_with_parent,
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
DEFAULT_READY_TIMEOUT_S = 600.0
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
        "Port 0 picks a free port. Metrics: curl http://HOST:METRICS_PORT/metrics",
    )
    add = parser.add_argument
    artifacts = "artifact directory (config.json, weights); `make artifacts` makes %(default)s"
    add("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help=artifacts)
    device = "the device the models run on; gpu needs `make setup DEVICE=gpu` (%(default)s)"
    add("--device", choices=("cpu", "gpu"), default="cpu", help=device)
    add("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    for name, default, what in (
        ("--http-port", 8000, "HTTP/REST (KServe v2)"),
        ("--grpc-port", 8001, "gRPC (KServe v2)"),
        ("--metrics-port", 8002, "Prometheus metrics"),
        ("--supervisor-port", 8003, "the supervisor's /ready (probe it), /live and /status"),
    ):
        add(name, type=port, default=default, metavar="PORT", help=f"{what} (%(default)s)")
    repository = "the model repository to serve (default: %(default)s)"
    add("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY, help=repository)
    one = "serve a generated copy without dynamic batching (one request per execution)"
    add("--no-dynamic-batching", action="store_true", help=one)
    delay = "serve a generated copy with this max_queue_delay_microseconds"
    add("--max-queue-delay-us", type=int, metavar="US", help=delay)
    logs = "where generated repositories, server logs and the admin key go (%(default)s)"
    add("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help=logs)
    ready = "seconds to wait for all models to load (%(default)s)"
    add("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S, metavar="S", help=ready)
    add("--quiet", action="store_true", help="do not echo the server log to the terminal")
    alone = "no supervisor: no stub healing, no /ready, model control mode 'none'"
    add("--no-supervisor", action="store_true", help=alone)
    drain = "on SIGTERM/Ctrl-C, /ready answers 503 for S seconds before the stop (%(default)s)"
    add("--drain-seconds", type=float, default=0.0, metavar="S", help=drain)
    stop = "seconds in-flight requests get to finish while the models unload (%(default)s)"
    add("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="S", help=stop)
    key = f"environment variable with the admin key (header '{ADMIN_HEADER}'); unset: a random "
    key += "key kept in BUILD_DIR/admin-key, mode 0600 (%(default)s)"
    add("--admin-key-env", default=ADMIN_KEY_ENV, metavar="NAME", help=key)
    return parser


def validate_artifacts(artifacts: Path) -> Path:
    """Absolute artifact directory, or ServeError saying how to create it."""
    if not (artifacts / "config.json").is_file():
        raise ServeError(
            f"{artifacts} is no Phoenix artifact directory (no config.json). Create demo "
            f"artifacts with `python -m phoenix.artifacts --preset mini --out {artifacts}`."
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
    """Fail before starting Triton when a port we must bind is taken (0 = any: always free).
    SO_REUSEADDR as the /ready server sets it: closed connections in TIME_WAIT do not count."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port_))
        except OSError as error:
            raise ServeError(
                f"{option} {port_} on {host} is not free ({error.strerror}): pick another port, "
                "0 for any free one, or --no-supervisor"
            ) from None


def server_flags(supervised: bool, admin_key: str, device: str = "cpu") -> dict[str, object]:
    """tritonserver options: exit timeout, the device profile's configs (a model without one
    keeps config.pbtxt), explicit model control for the supervisor's reloads and the clean
    stop's unloads, and the admin-key restriction of the APIs that change the server (on every
    bind, loopback too)."""
    flags: dict[str, object] = {"exit_timeout_secs": EXIT_TIMEOUT_S}
    config_name = profile(device).config_name
    if config_name:
        flags["model_config_name"] = config_name
    if supervised:
        flags.update(model_control_mode="explicit", load_model="*")
    restriction = f"{RESTRICTED_APIS}:{ADMIN_HEADER}={admin_key}"
    flags.update(http_restricted_api=restriction, grpc_restricted_protocol=restriction)
    return flags


def prepare_repository(args: argparse.Namespace) -> Path:
    """The repository to serve: the committed one (whose GPU configs Triton picks with
    --model-config-name), or for a benchmark variant (no dynamic batching, another queue
    delay) one generated under --build-dir from the device's profile."""
    source = validate_model_repository(args.model_repository)
    if not args.no_dynamic_batching and args.max_queue_delay_us is None:
        return source
    deployment = profile(args.device)
    if args.max_queue_delay_us is not None:
        deployment = deployment.with_queue_delay(args.max_queue_delay_us)
    suffix = args.device + ("-nobatch" if args.no_dynamic_batching else "")
    return write_repository(
        args.build_dir / f"model_repository-{suffix}",
        deployment,
        dynamic_batching=not args.no_dynamic_batching,
        source=source,
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


def stop_with_parent() -> None:
    """Stop as on SIGTERM (drain, unload, exit) when the process that started us dies, even by
    SIGKILL: `make serve` must not leave a server behind when make is killed. Not when started
    detached on purpose: under nohup (SIGHUP ignored) or setsid (a session of its own)."""
    detached = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN or os.getsid(0) == os.getpid()
    if not detached:
        die_with_parent(signal.SIGTERM, os.getppid())


def make_server(
    artifacts: Path,
    admin_key: str,
    *,
    repository: Path = DEFAULT_MODEL_REPOSITORY,
    device: str = "cpu",
    host: str = LOOPBACK,
    ports: Sequence[int] = (0, 0, 0),
    build_dir: Path = DEFAULT_BUILD_DIR,
    supervised: bool = True,
    ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
) -> TritonServer:
    """The tritonserver of this command, not started: HTTP, gRPC and metrics on `ports` (0: a
    free one) and `server_flags`. clients/demo.py starts its server here too."""
    http_port, grpc_port, metrics_port = ports
    return TritonServer(
        repository,
        artifacts_dir=artifacts,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        extra_args=flags_to_args(server_flags(supervised, admin_key, device)),
        # One log per run: several people may serve from the same checkout at once.
        log_path=build_dir / f"tritonserver-{os.getpid()}.log",
        ready_timeout=ready_timeout,
    )


def echo_log(path: Path, stop: threading.Event) -> None:
    """Copy the lines appended to `path` onto stdout until `stop` is set (then the rest)."""
    with path.open("r", errors="replace") as log:
        while True:
            line = log.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif stop.is_set():
                return
            else:
                time.sleep(0.1)


def describe(server: TritonServer, ready_url: str | None, key_file: Path | None) -> str:
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


def serve_foreground(
    server: TritonServer, args: argparse.Namespace, admin_key: str, key_file: Path | None
) -> int:
    """Run until the server exits (on its own or after a signal, see shutdown.py); unless
    --no-supervisor, the supervisor heals dead stubs and serves /ready meanwhile."""
    stop_echo = threading.Event()
    echo = threading.Thread(target=echo_log, args=(server.log_path, stop_echo), daemon=True)
    if not args.quiet:
        echo.start()
    supervisor = endpoint = None
    try:
        server.wait_ready()
        ready_url = None
        if not args.no_supervisor:
            supervisor = Supervisor(server.http_url, server.pid, admin_key=admin_key).start()
            endpoint = ReadinessServer(supervisor, server.host, args.supervisor_port).start()
            ready_url = f"http://{client_host(server.host)}:{endpoint.port}/ready"
        print(describe(server, ready_url, key_file) + "\nCtrl-C stops the server.", flush=True)
        shutdown = Shutdown(server, supervisor, args.drain_seconds, args.stop_timeout)
        shutdown.install()
        return shutdown.exit_code(wait_in_short_naps(server.wait))
    finally:
        if endpoint is not None:
            endpoint.stop()
        if supervisor is not None:
            supervisor.stop()
        server.stop()
        stop_echo.set()
        if echo.is_alive():
            echo.join(timeout=2)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    stop_with_parent()
    try:
        artifacts = validate_artifacts(args.artifacts)
        repository = prepare_repository(args)
        warn_if_no_gpu_jax(args.device)
        admin_key, key_file = admin_key_for(args.build_dir, args.admin_key_env)
        if not args.no_supervisor and args.supervisor_port:
            check_port_free(args.host, args.supervisor_port, "--supervisor-port")
        server = make_server(
            artifacts,
            admin_key,
            repository=repository,
            device=args.device,
            host=args.host,
            ports=(args.http_port, args.grpc_port, args.metrics_port),
            build_dir=args.build_dir,
            supervised=not args.no_supervisor,
            ready_timeout=args.ready_timeout,
        )
        print(f"starting tritonserver over {repository} (artifacts: {artifacts})", flush=True)
        server.start()
        return serve_foreground(server, args, admin_key, key_file)
    except (ServeError, TritonServerError, ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
