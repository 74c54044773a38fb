"""Two replicas behind a real L7 proxy (nginx), balanced as deploy/k8s balances them: what
`make bench-replicas` runs (docs/deploy.md, "Measured here").

    python -m bench.bench_replicas --artifacts artifacts/demo

Two `serve` commands (each: tritonserver, its stubs, the supervisor) on loopback, and nginx in
front with one HTTP and one gRPC (h2c) listener, each request balanced round-robin over the
replicas (as ingress-nginx does over a Service's ready endpoints). The project's Locust traffic
goes through nginx. Phases:

1. `balance-http`, `balance-grpc`: Locust HTTP users only, then gRPC users only; each replica's
   share is counted from its own Triton metrics (nv_inference_request_success, every model).
2. `stop-plain`: SIGTERM to one replica under load (HTTP and gRPC users), with a plain proxy:
   static upstreams, no retries. Locust's failures, by kind.
3. `stop-retries`: the same with nginx's retries of requests that never ran (below), static
   upstreams: what the proxy alone can do.
4. `stop-drained`: the same, the way the manifests stop a pod: the replica's /ready (the
   readiness probe) is watched every 0.5 s and nginx's upstreams follow the ready replicas (an
   endpoint controller, as Kubernetes and ingress-nginx do); serve drains first (/ready 503 for
   --drain-seconds) and then unloads, letting in-flight requests finish; nginx sends a request
   to the other replica only when it never started on the stopping one (connection refused,
   404 "no available versions", 503 queue full).

Figures go to bench/results/replicas.json and a table on stdout; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from harness.locust_runs import failure_kinds, finish_locust, locust_totals, start_locust
from harness.proxy import Proxy, nginx_binary
from harness.results import shown_path, write_results
from harness.serve_process import ServeProcess
from phoenix.util.command_line import command_parser

HTTP_USER, GRPC_USER = "TritonHttpUser", "TritonGrpcUser"
POLL_S = 0.5


class Replica(ServeProcess):
    """One `serve` command on free loopback ports, named for the proxy's upstreams."""

    def __init__(self, name: str, args, work: Path):
        super().__init__(args.artifacts, work / name, args.drain)
        self.name = name

    def successes(self) -> int:
        """Requests answered so far, every model (a counter: take differences)."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        pattern = r"^nv_inference_request_success\{[^}]*\} (\S+)$"
        return int(sum(float(v) for v in re.findall(pattern, text, re.M)))


class EndpointController(threading.Thread):
    """Probe each replica's /ready every POLL_S; when the ready set changes, point nginx at it.
    The last ready replica is never removed (as ingress-nginx keeps its last endpoints)."""

    def __init__(self, proxy: Proxy, replicas: list[Replica]):
        super().__init__(daemon=True, name="endpoint-controller")
        self.proxy, self.replicas = proxy, replicas
        self.ready = {r.name for r in replicas}
        self.changes: list[tuple[float, list[str]]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(POLL_S):
            ready = {r.name for r in self.replicas if r.is_ready()} or self.ready
            if ready != self.ready:
                self.ready = ready
                self.proxy.configure(ready)
                self.changes.append((time.monotonic(), sorted(ready)))


def locust(args, proxy: Proxy, users: list[str], prefix: Path, run_time: str) -> subprocess.Popen:
    """Locust's ``users`` classes through the proxy."""
    urls = {"http": f"127.0.0.1:{proxy.http_port}", "grpc": f"127.0.0.1:{proxy.grpc_port}"}
    return start_locust(urls, prefix, users=args.users, artifacts=args.artifacts,
                        run_time=run_time, extra=["--stop-timeout", "10", *users])  # fmt: skip


def balance(args, proxy: Proxy, replicas: list[Replica], user: str, work: Path) -> dict:
    before = {r.name: r.successes() for r in replicas}
    prefix = work / f"balance-{user}"
    process = locust(args, proxy, [user], prefix, f"{args.load_seconds:g}s")
    try:
        process.wait(args.load_seconds + 120)
    finally:
        finish_locust(process)
    served = {r.name: r.successes() - before[r.name] for r in replicas}
    total = sum(served.values()) or 1
    requests, failures = locust_totals(prefix)
    return {
        "user": user,
        "locust_requests": requests,
        "locust_failures": failures,
        "served_by_replica": served,
        "share": {name: round(count / total, 3) for name, count in served.items()},
    }


STOPS = {  # name: (upstreams follow /ready, retries)
    "stop-plain": (False, False),
    "stop-retries": (False, True),
    "stop-drained": (True, True),
}
PROXY_SETUPS = {
    (False, False): "static upstreams, no retries",
    (False, True): "static upstreams, retries of requests that never ran",
    (True, True): "upstreams follow /ready, retries of requests that never ran",
}


def stop_one(args, proxy: Proxy, replicas: list[Replica], work: Path, name: str) -> dict:
    """SIGTERM replica a under HTTP + gRPC load; Locust's failures and the stop's timings."""
    follow_ready, retries = STOPS[name]
    victim = replicas[0]
    proxy.configure({r.name for r in replicas}, retries=retries)
    controller = EndpointController(proxy, replicas) if follow_ready else None
    if controller:
        controller.start()
    prefix = work / name
    process = locust(args, proxy, [HTTP_USER, GRPC_USER], prefix, "30m")
    try:
        time.sleep(args.load_seconds / 2)
        before = {r.name: r.successes() for r in replicas}
        termed = time.monotonic()
        victim.terminate()
        code = victim.wait_exit(120)
        exited = time.monotonic() - termed
        time.sleep(args.after_stop_seconds)
        survivor_served = replicas[1].successes() - before[replicas[1].name]
    finally:
        finish_locust(process)
        if controller:
            controller.halt.set()
            controller.join()
    requests, failures = locust_totals(prefix)
    kinds = failure_kinds(Path(f"{prefix}_failures.csv"))
    removed = [round(t - termed, 2) for t, ready in (controller.changes if controller else [])]
    return {
        "phase": name,
        "proxy": PROXY_SETUPS[STOPS[name]],
        "drain_seconds": args.drain,
        "locust_requests": requests,
        "locust_failures": failures,
        "failures_by_kind": dict(kinds),
        "stopped_replica_exit_code": code,
        "stopped_replica_exit_after_s": round(exited, 2),
        "proxy_updated_after_s": removed,
        "served_by_the_other_replica_meanwhile": survivor_served,
    }  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m bench.bench_replicas",
        "Two serve replicas behind nginx: balance over HTTP and gRPC, and the failures when one "
        "stops under load (plain proxy vs drained).",
        show_defaults=True,
    )
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts/demo"))
    parser.add_argument("--users", type=int, default=8, help="Locust users per phase")
    parser.add_argument("--load-seconds", type=float, default=30.0, help="each balance phase")
    parser.add_argument("--after-stop-seconds", type=float, default=10.0)
    parser.add_argument("--drain", type=float, default=3.0, help="serve --drain-seconds")
    parser.add_argument("--ready-timeout", type=float, default=900.0)
    parser.add_argument("--work-dir", type=Path, default=Path("build/bench-replicas"))
    parser.add_argument("--out", type=Path, default=Path("bench/results/replicas.json"))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # Stop the replicas and nginx on SIGTERM and Ctrl-C too (a background job ignores SIGINT).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    work = args.work_dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    replicas = [Replica("a", args, work), Replica("b", args, work)]
    proxy = Proxy(work, replicas)
    result: dict = {"artifacts": shown_path(args.artifacts), "users": args.users,
                    "load_seconds": args.load_seconds,
                    "proxy": shown_path(nginx_binary())}  # fmt: skip
    try:
        for replica in replicas:
            replica.start()
        result["ready_after_s"] = {r.name: round(r.wait_ready(args.ready_timeout), 1)
                                   for r in replicas}  # fmt: skip
        proxy.start({r.name for r in replicas})
        print(f"replicas ready {result['ready_after_s']}; nginx on {proxy.http_port} (HTTP), "
              f"{proxy.grpc_port} (gRPC)", flush=True)  # fmt: skip
        result["balance"] = [
            balance(args, proxy, replicas, u, work) for u in (HTTP_USER, GRPC_USER)
        ]
        for row in result["balance"]:
            print(json.dumps(row), flush=True)
        result["stops"], result["restart_ready_after_s"] = [], []
        for index, name in enumerate(STOPS):
            if index:  # the stopped replica again
                replicas[0].start()
                restarted = round(replicas[0].wait_ready(args.ready_timeout), 1)
                result["restart_ready_after_s"].append(restarted)
                proxy.configure({r.name for r in replicas})
            result["stops"].append(stop_one(args, proxy, replicas, work, name))
            print(json.dumps(result["stops"][-1]), flush=True)
    finally:
        proxy.stop()
        for replica in replicas:
            replica.stop()
    write_results(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
