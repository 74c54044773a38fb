"""`python -m phoenix.serving.supervisor`: supervise a server started some other way."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from phoenix.serving.admin_key import ADMIN_HEADER, ADMIN_KEY_ENV, find_admin_key
from phoenix.serving.supervisor.admin import TritonAPIError
from phoenix.serving.supervisor.endpoints import ReadinessServer
from phoenix.serving.supervisor.state import DEFAULT_POLL_S, Supervisor


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m phoenix.serving.supervisor",
        description="Watch a running tritonserver (explicit model control mode), reload models "
        "whose Python-backend stub died or whose load failed, and serve /ready, /live and "
        "/status for a load balancer. `python -m phoenix.serving.serve` already runs this "
        "beside its server.",
    )
    parser.add_argument("--http-url", default="127.0.0.1:8000", help="Triton HTTP host:port")
    parser.add_argument(
        "--server-pid",
        type=int,
        help="pid of tritonserver on this machine: enables the stub-process watch",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address for /ready (%(default)s)")
    parser.add_argument("--port", type=int, default=8003, help="port for /ready (%(default)s)")
    parser.add_argument(
        "--probe-interval",
        type=float,
        metavar="S",
        help="seconds between inference probes of each model (default: 0 = off with "
        "--server-pid, 2 without)",
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=DEFAULT_POLL_S,
        metavar="S",
        help="seconds between checks of the stubs and the repository index (%(default)s)",
    )
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        metavar="NAME",
        help="environment variable with the key of Triton's restricted model-repository API, "
        f"sent as header '{ADMIN_HEADER}' (default: %(default)s; unset: read --admin-key-file)",
    )
    parser.add_argument(
        "--admin-key-file",
        metavar="PATH",
        help="file with the key (default: $PHOENIX_ADMIN_KEY_FILE, else build/serve/admin-key, "
        "where `serve` keeps the key it generates)",
    )
    parser.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="stop after S seconds (default: run until SIGINT/SIGTERM)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    probe = args.probe_interval
    if probe is None:
        probe = 0.0 if args.server_pid else 2.0
    supervisor = Supervisor(
        args.http_url,
        args.server_pid,
        admin_key=find_admin_key(args.admin_key_env, args.admin_key_file),
        poll_interval_s=args.poll_interval,
        probe_interval_s=probe,
    )
    try:
        supervisor.start()
    except TritonAPIError as error:
        print(
            f"error: cannot read the model repository of {args.http_url}: {error}", file=sys.stderr
        )
        return 1
    endpoint = ReadinessServer(supervisor, args.host, args.port).start()
    print(
        f"supervising {args.http_url}; readiness at http://{args.host}:{endpoint.port}/ready",
        flush=True,
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait(args.duration)
    endpoint.stop()
    supervisor.stop()
    return 0
