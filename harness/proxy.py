"""nginx in front of serve replicas, balanced as deploy/k8s balances them: one HTTP and one
gRPC (h2c) listener on free loopback ports, each request sent round-robin to a replica
(as ingress-nginx does over a Service's ready endpoints)."""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from harness.polling import wait_until
from harness.serve_process import ServePorts
from phoenix.util.processes import LoggedProcess, http_get_status, pick_free_ports

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
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0


class ProxyError(RuntimeError):
    """nginx is missing or did not start."""


class Upstream(Protocol):
    """A replica as the proxy sees it: a name and the serve command's ports (once started)."""

    name: str
    ports: ServePorts | None


def nginx_binary() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if not found:
        raise ProxyError("nginx not found: `make setup` installs it (Debian package nginx)")
    return found


class Proxy:
    """nginx over ``replicas`` with its files in ``work/nginx``; `configure` rewrites the
    upstreams and reloads gracefully (old workers finish their requests), as an ingress
    controller does when endpoints change."""

    def __init__(self, work: Path, replicas: Sequence[Upstream]):
        self.work, self.replicas = work / "nginx", replicas
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o777)  # nginx's workers may run as another user (root's master)
        self.http_port, self.grpc_port = pick_free_ports(2)
        self.process: LoggedProcess | None = None
        self.retries = True
        self.lock = threading.Lock()

    @property
    def conf(self) -> Path:
        return self.work / "nginx.conf"

    def command(self, *options: str) -> list[str]:
        """nginx on this proxy's files; ``options``: more (`-t` tests the configuration)."""
        return [nginx_binary(), *options, "-p", str(self.work), "-c", str(self.conf),
                "-e", str(self.work / "error.log")]  # fmt: skip

    def write(self, ready: set[str]) -> None:
        """The configuration: replicas not in ``ready`` marked down."""

        def servers(port_of) -> str:
            lines = []
            for r in self.replicas:
                down = "" if r.name in ready else " down"
                lines.append(f"        server 127.0.0.1:{port_of(r)}{down};")
            return "\n".join(lines)

        text = NGINX_CONF.format(
            work=self.work, http_port=self.http_port, grpc_port=self.grpc_port,
            http_servers=servers(lambda r: r.ports.http),
            grpc_servers=servers(lambda r: r.ports.grpc),
            http_retry=RETRY_HTTP if self.retries else NO_RETRY_HTTP,
            grpc_retry=RETRY_GRPC if self.retries else NO_RETRY_GRPC,
        )  # fmt: skip
        self.conf.write_text(text)

    def start(self, ready: set[str]) -> Proxy:
        self.write(ready)
        self.process = LoggedProcess(self.command(), self.work / "nginx.out").start()
        url = f"http://127.0.0.1:{self.http_port}/v2"
        if wait_until(lambda: http_get_status(url) is not None, START_TIMEOUT_S, 0.1) is None:
            raise ProxyError(f"nginx did not start; see {self.work}/error.log")
        return self

    def configure(self, ready: set[str], retries: bool | None = None) -> None:
        with self.lock:
            if retries is not None:
                self.retries = retries
            self.write(ready)
            assert self.process is not None, "nginx was not started"
            self.process.send_signal(signal.SIGHUP)

    def stop(self) -> None:
        """SIGQUIT (nginx's graceful stop), then SIGKILL to its group past the bound."""
        if self.process and self.process.is_running():
            self.process.send_signal(signal.SIGQUIT)
            if self.process.wait_exit(STOP_TIMEOUT_S) is None:
                self.process.kill()
