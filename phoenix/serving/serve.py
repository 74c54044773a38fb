"""Run the Phoenix models on Triton: `python -m phoenix.serving.serve --help`.

Foreground mode runs until Ctrl-C (or SIGTERM), which is forwarded to tritonserver so it shuts
down cleanly. `--demo` starts the server, runs one end-to-end recommendation and stops.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from phoenix.serving.repository import PbtxtError, derive_repository
from phoenix.serving.triton_server import TritonServer, TritonServerError, flags_to_args

DEFAULT_ARTIFACTS = Path("artifacts/demo")
DEFAULT_MODEL_REPOSITORY = Path("model_repository")
DEFAULT_BUILD_DIR = Path("build/serve")
EXIT_TIMEOUT_S = 10


class ServeError(RuntimeError):
    """A problem the user can fix (printed without a traceback)."""


def port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0..65535; 0 = any free port)")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m phoenix.serving.serve",
        description="Serve the Phoenix ranker and retriever on Triton Inference Server "
        "(the tritonserver shipped in nvidia-pytriton, Python backend).",
        epilog="Examples:\n"
        "  python -m phoenix.serving.serve --artifacts artifacts/demo\n"
        "  python -m phoenix.serving.serve --device gpu --http-port 9000\n"
        "  python -m phoenix.serving.serve --demo\n"
        "Port 0 picks a free port. Metrics: curl http://HOST:METRICS_PORT/metrics",
        formatter_class=argparse.RawDescriptionHelpFormatter,
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
    return parser


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
    if device == "gpu" and importlib.util.find_spec("jax_cuda12_plugin") is None:
        print(
            "warning: --device gpu but jax's CUDA plugin is not installed; the models will run "
            "on the CPU. Install it with: pip install 'jax[cuda12]==0.6.2'",
            file=sys.stderr,
        )


def make_server(args: argparse.Namespace, repository: Path, artifacts: Path) -> TritonServer:
    return TritonServer(
        repository,
        artifacts_dir=artifacts,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=flags_to_args({"exit_timeout_secs": EXIT_TIMEOUT_S}),
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


def describe(server: TritonServer) -> str:
    return (
        f"Triton is ready after {server.ready_after_s:.1f} s\n"
        f"  HTTP     http://{server.http_url}  (tritonclient url: {server.http_url})\n"
        f"  gRPC     {server.grpc_url}\n"
        f"  metrics  {server.metrics_url}\n"
        f"  log      {server.log_path}"
    )


def exit_code_of(returncode: int) -> int:
    """Shell-style exit code: a server killed by signal N gives 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def forward_signals(server: TritonServer) -> None:
    """First SIGINT/SIGTERM asks the server to shut down; a second one kills it."""
    received = []

    def handler(signum, _frame):
        received.append(signum)
        if len(received) == 1:
            print(f"\nstopping tritonserver ({signal.Signals(signum).name})...", file=sys.stderr)
            server.send_signal(signal.SIGTERM)
        else:
            print("\nkilling tritonserver", file=sys.stderr)
            server.kill()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)


def serve_foreground(server: TritonServer, echo_log: bool) -> int:
    """Run until the server exits (on its own or on a forwarded signal)."""
    echo = start_log_echo(server) if echo_log else None
    try:
        server.wait_ready()
        print(describe(server), flush=True)
        print("Ctrl-C stops the server.", flush=True)
        forward_signals(server)
        return exit_code_of(server.wait())
    finally:
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
        server = make_server(args, repository, artifacts)
        print(f"starting tritonserver over {repository} (artifacts: {artifacts})", flush=True)
        server.start()
        if args.demo:
            return run_demo_once(server, artifacts, run_demo)
        return serve_foreground(server, echo_log=not args.quiet)
    except (ServeError, TritonServerError, PbtxtError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
