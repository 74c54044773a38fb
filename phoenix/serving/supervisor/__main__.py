"""`python -m phoenix.serving.supervisor` (`phoenix-supervisor`): supervise a tritonserver started
some other way (`serve` runs the supervisor beside its own server). It reloads models whose stub
died or whose load failed and serves /ready, /live and /status. The server needs explicit model
control mode; the admin key is found as the other tools find it (admin_key.find_admin_key)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from phoenix.serving.admin_key import find_admin_key
from phoenix.serving.supervisor.admin import TritonAPIError
from phoenix.serving.supervisor.endpoints import ReadinessServer
from phoenix.serving.supervisor.state import Supervisor
from phoenix.serving.supervisor.stubs import STUB_DIR_ENV, stub_dir_of


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m phoenix.serving.supervisor", description=__doc__
    )
    add = parser.add_argument
    add("--http-url", default="127.0.0.1:8000", help="Triton HTTP host:port (%(default)s)")
    add(
        "--server-pid", type=int, help=f"watch the stubs of this tritonserver (has ${STUB_DIR_ENV})"
    )
    add("--probe-interval", type=float, default=2.0, help="without --server-pid (%(default)s s)")
    add("--admin-key-file", metavar="PATH", help="default: $PHOENIX_ADMIN_KEY_FILE, build/serve")
    add("--host", default="127.0.0.1", help="address of /ready (%(default)s)")
    add("--port", type=int, default=8003, help="port of /ready (%(default)s)")
    args = parser.parse_args(argv)
    if args.server_pid and stub_dir_of(args.server_pid) is None:
        parser.error(
            f"tritonserver {args.server_pid} has no ${STUB_DIR_ENV}: leave out --server-pid"
        )
    probe_s = 0.0 if args.server_pid else args.probe_interval
    admin_key = find_admin_key(key_file=args.admin_key_file)
    supervisor = Supervisor(
        args.http_url, args.server_pid, admin_key=admin_key, probe_interval_s=probe_s
    )
    try:
        supervisor.start()
    except TritonAPIError as error:
        parser.exit(1, f"error: cannot read the repository of {args.http_url}: {error}\n")
    endpoint = ReadinessServer(supervisor, args.host, args.port).start()
    print(
        f"supervising {args.http_url}; readiness at {args.host}:{endpoint.port}/ready", flush=True
    )
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    endpoint.stop()
    supervisor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
