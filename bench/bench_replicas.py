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
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.bench_reliability import failure_kinds, start_locust
from bench.loadgen import wait_until
from bench.serving_servers import ServeProcess
from phoenix.serving.triton_server import http_get_status, pick_free_ports

HTTP_USER, GRPC_USER = "TritonHttpUser", "TritonGrpcUser"
POLL_S = 0.5

# Retries of requests that never ran: a connection error before the request reached Triton,
# or Triton's refusals (404 while unloading, 503 queue full). POST is not idempotent to nginx,
# hence non_idempotent for those statuses, which also resends an HTTP request cut after it was
# sent (read-only models: harmless); gRPC retries only calls that never reached a replica.
RETRY_HTTP = (
    "proxy_next_upstream error timeout http_404 http_503 non_idempotent;\n"
    "        proxy_next_upstream_tries 2;"
)
RETRY_GRPC = "grpc_next_upstream error timeout;\n        grpc_next_upstream_tries 2;"
NO_RETRY_HTTP = "proxy_next_upstream off;"
NO_RETRY_GRPC = "grpc_next_upstream off;"

NGINX_CONF = """
daemon off;
worker_processes 1;
pid {work}/nginx.pid;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {work}/client_body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    client_max_body_size 16m;
    client_body_buffer_size 1m;
    upstream triton_http {{
{http_servers}
        keepalive 32;
    }}
    upstream triton_grpc {{
{grpc_servers}
        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{http_port};
        location / {{
            proxy_pass http://triton_http;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {http_retry}
        }}
    }}
    server {{
        listen 127.0.0.1:{grpc_port} http2;
        location / {{
            grpc_pass grpc://triton_grpc;
            {grpc_retry}
        }}
    }}
}}
"""


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise SystemExit("nginx not found: `make setup` installs it (Debian package nginx)")
    return found


class Replica(ServeProcess):
    """One `serve` command on free loopback ports, named for the proxy's upstreams."""

    def __init__(self, name: str, args, work: Path):
        super().__init__(args.artifacts, work / name, args.drain)
        self.name = name

    def successes(self) -> int:
        """Requests answered so far, every model (a counter: take differences)."""
        url = f"http://127.0.0.1:{self.ports.metrics}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        pattern = r"^nv_inference_request_success\{[^}]*\} (\S+)$"
        return int(sum(float(v) for v in re.findall(pattern, text, re.M)))


class Proxy:
    """nginx over the replicas; `configure` rewrites the upstreams and reloads gracefully (old
    workers finish their requests), as an ingress controller does when endpoints change."""

    def __init__(self, work: Path, replicas: list[Replica]):
        self.work, self.replicas = work / "nginx", replicas
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o777)  # nginx's workers may run as another user (root's master)
        self.http_port, self.grpc_port = pick_free_ports(2)
        self.process: subprocess.Popen | None = None
        self.retries = True
        self.lock = threading.Lock()
        self.reloads = 0

    def write(self, ready: set[str]) -> None:
        def servers(port_of) -> str:
            lines = []
            for r in self.replicas:
                down = "" if r.name in ready else " down"
                lines.append(f"        server 127.0.0.1:{port_of(r)}{down};")
            return "\n".join(lines)

        conf = NGINX_CONF.format(
            work=self.work, http_port=self.http_port, grpc_port=self.grpc_port,
            http_servers=servers(lambda r: r.ports.http),
            grpc_servers=servers(lambda r: r.ports.grpc),
            http_retry=RETRY_HTTP if self.retries else NO_RETRY_HTTP,
            grpc_retry=RETRY_GRPC if self.retries else NO_RETRY_GRPC,
        )  # fmt: skip
        (self.work / "nginx.conf").write_text(conf)

    def start(self, ready: set[str]) -> Proxy:
        self.write(ready)
        command = [nginx_binary(), "-p", str(self.work), "-c", str(self.work / "nginx.conf"),
                   "-e", str(self.work / "error.log")]  # fmt: skip
        self.process = subprocess.Popen(command, start_new_session=True)
        url = f"http://127.0.0.1:{self.http_port}/v2"
        if wait_until(lambda: http_get_status(url) is not None, 10, 0.1) is None:
            raise SystemExit(f"nginx did not start; see {self.work}/error.log")
        return self

    def configure(self, ready: set[str], retries: bool | None = None) -> None:
        with self.lock:
            if retries is not None:
                self.retries = retries
            self.write(ready)
            self.process.send_signal(signal.SIGHUP)
            self.reloads += 1

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)  # graceful
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)


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
    return start_locust(args, urls, prefix, run_time, ["--stop-timeout", "10", *users])


def aggregated(prefix: Path) -> tuple[int, int]:
    """(requests, failures) of Locust's Aggregated row."""
    import csv

    stats = Path(f"{prefix}_stats.csv")
    if not stats.exists():
        return 0, 0
    with stats.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["Name"] == "Aggregated":
                return int(row["Request Count"]), int(row["Failure Count"])
    return 0, 0


def finish(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)  # Locust writes its CSV files on the way out
    try:
        process.wait(90)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def balance(args, proxy: Proxy, replicas: list[Replica], user: str, work: Path) -> dict:
    before = {r.name: r.successes() for r in replicas}
    prefix = work / f"balance-{user}"
    process = locust(args, proxy, [user], prefix, f"{args.load_seconds:g}s")
    try:
        process.wait(args.load_seconds + 120)
    finally:
        finish(process)
    served = {r.name: r.successes() - before[r.name] for r in replicas}
    total = sum(served.values()) or 1
    requests, failures = aggregated(prefix)
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
        victim.process.send_signal(signal.SIGTERM)
        code = victim.process.wait(120)
        exited = time.monotonic() - termed
        time.sleep(args.after_stop_seconds)
        survivor_served = replicas[1].successes() - before[replicas[1].name]
    finally:
        finish(process)
        if controller:
            controller.halt.set()
            controller.join()
    requests, failures = aggregated(prefix)
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
    parser = argparse.ArgumentParser(
        prog="python -m bench.bench_replicas",
        description="Two serve replicas behind nginx: balance over HTTP and gRPC, and the "
        "failures when one stops under load (plain proxy vs drained).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
    result: dict = {"artifacts": str(args.artifacts), "users": args.users,
                    "load_seconds": args.load_seconds, "proxy": nginx_binary()}  # fmt: skip
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
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
