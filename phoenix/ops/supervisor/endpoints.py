"""/ready, /live and /status over HTTP, for load balancers and operators."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from phoenix.ops.supervisor.state import Supervisor


def _handler_for(supervisor: Supervisor, is_live: Callable[[], bool]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/ready":
                ready, reasons = supervisor.readiness()
                answer = {"ready": ready, "reasons": reasons, "degraded": supervisor.degraded()}
                self._reply(200 if ready else 503, answer)
            elif path == "/live":
                live = is_live()
                self._reply(200 if live else 503, {"live": live})
            elif path == "/status":
                self._reply(200, supervisor.status())
            else:
                self._reply(404, {"error": "try /ready, /live or /status"})

        def _reply(self, code: int, payload: dict) -> None:
            body = json.dumps(payload, indent=1).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # probes every second would flood the terminal
            pass

    return Handler


class ReadinessServer:
    """HTTP endpoint for load balancers: GET /ready, /live, /status on host:port."""

    def __init__(self, supervisor: Supervisor, host: str, port: int, is_live=None):
        live = is_live or supervisor.is_running
        # A thread per request, so a slow Triton call delays no other probe.
        self.httpd = ThreadingHTTPServer((host, port), _handler_for(supervisor, live))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def start(self) -> ReadinessServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
