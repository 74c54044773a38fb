"""Heal dead Python-backend stubs and tell a load balancer the truth about readiness.

Triton 2.51 does not restart a model's stub process when it dies: every request to that model
then fails with "Stub process '<instance>' is not healthy" while `/v2/health/ready` and the
model's ready endpoint keep answering 200. The supervisor runs beside the server (the serve
command starts it) and

- watches the stub processes that are children of tritonserver (their command line names the
  model instance); a known stub that exits or turns zombie is noticed within one poll;
- optionally probes each model with a request its own validation refuses, which proves the stub
  alive without doing work ("is not healthy" in the answer means dead);
- reloads a dead model through the model-repository API (explicit model control mode) with
  its *current* config plus a restart marker parameter: the override makes Triton start a new
  stub, and keeps whatever an operator loaded before (for example a swapped corpus);
- serves `/ready` (200 only when Triton is ready, no model is dead or reloading and the server
  is not draining), `/live` and `/status` (JSON) on a port of its own.

`python -m phoenix.serving.supervisor --help` runs it against a server started some other way.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

logger = logging.getLogger("phoenix.supervisor")

STUB_NAME = "triton_python_backend_stub"
# Triton 2.51 starts a stub as: stub model.py shm-region shm-size shm-growth parent-pid
# backend-dir ipc-size instance-name runtime-modifier; the instance name is argument 8.
STUB_INSTANCE_ARG = 8
_INSTANCE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+_\d+_\d+$")
RESTART_PARAMETER = "phoenix_supervisor_restart"
ADMIN_KEY_ENV = "PHOENIX_ADMIN_KEY"
ADMIN_HEADER = "phoenix-admin-key"
NOT_HEALTHY = "is not healthy"
DEFAULT_POLL_S = 0.25
DEFAULT_RESCAN_S = 5.0
DEFAULT_LOAD_TIMEOUT_S = 600.0
MAX_BACKOFF_S = 60.0


# ------------------------------------------------------------------------------------------
# Stub processes
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StubProcess:
    """One live Python-backend stub: its pid and the model instance it serves."""

    pid: int
    instance: str


def stub_instance_of(argv: list[str]) -> str | None:
    """Instance name (e.g. 'retriever_0_0') from a stub's argv; None for other processes."""
    if not argv or Path(argv[0]).name != STUB_NAME or len(argv) <= STUB_INSTANCE_ARG:
        return None
    name = argv[STUB_INSTANCE_ARG]
    return name if _INSTANCE_NAME.match(name) else None


def read_stat(pid: int, proc_root: Path) -> tuple[str, int] | None:
    """(state letter, parent pid) of a process, or None when it is gone."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may contain spaces: split after its closing ')'.
    fields = text[text.rfind(")") + 2 :].split()
    return fields[0], int(fields[1])


def read_argv(pid: int, proc_root: Path) -> list[str]:
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def is_alive(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """True while the process exists and is not a zombie (a killed stub stays a zombie:
    tritonserver never reaps it)."""
    stat = read_stat(pid, proc_root)
    return stat is not None and stat[0] not in ("Z", "X")


def list_stubs(server_pid: int, proc_root: Path = Path("/proc")) -> list[StubProcess]:
    """Live stub processes whose parent is `server_pid`."""
    stubs = []
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        stat = read_stat(pid, proc_root)
        if stat is None or stat[1] != server_pid or stat[0] in ("Z", "X"):
            continue
        instance = stub_instance_of(read_argv(pid, proc_root))
        if instance:
            stubs.append(StubProcess(pid, instance))
    return stubs


def rss_bytes(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """Resident memory of a process (VmRSS), or None when it is gone."""
    try:
        status = (proc_root / str(pid) / "status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


# ------------------------------------------------------------------------------------------
# Model configs
# ------------------------------------------------------------------------------------------


def has_stubs(config: Mapping) -> bool:
    """Python-backend models run in stubs; ensembles and other backends do not."""
    return config.get("backend") == "python"


def expected_instances(config: Mapping) -> set[str]:
    """Instance names Triton gives a model's instances: '<group name>_<index>'."""
    names = set()
    for index, group in enumerate(config.get("instance_group") or []):
        group_name = group.get("name") or f"{config['name']}_{index}"
        names.update(f"{group_name}_{i}" for i in range(int(group.get("count", 1))))
    return names


def with_restart_marker(config: Mapping, marker: str) -> dict:
    """A copy of `config` with the restart marker parameter set to `marker`.

    A load request whose config differs from the loaded one makes Triton load a new copy of
    the model (and start a new stub); an unchanged config would be a no-op.
    """
    override = copy.deepcopy(dict(config))
    parameters = dict(override.get("parameters") or {})
    parameters[RESTART_PARAMETER] = {"string_value": marker}
    override["parameters"] = parameters
    return override


_PROBE_VALUES = {"INT64": -1, "INT32": -1, "INT16": -1, "INT8": -1, "FP32": -1.0, "FP64": -1.0}


def probe_body(config: Mapping) -> dict | None:
    """A one-row inference request that reaches the stub and is refused by its validation.

    Every input is -1 (ids must be >= 0, top_k >= 1, actions in [0, 1], embeddings have D > 1
    values), so the stub answers INVALID_ARG at once. Triton itself only checks names, types
    and shapes, which are right. None when an input has a type we cannot fill.
    """
    batched = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for spec in config.get("input") or []:
        if spec.get("optional"):
            continue
        datatype = spec["data_type"].removeprefix("TYPE_")
        if datatype not in _PROBE_VALUES:
            return None
        shape = [1 if d == -1 else int(d) for d in spec.get("dims") or []]
        shape = ([1] if batched else []) + shape
        count = 1
        for size in shape:
            count *= size
        inputs.append(
            {
                "name": spec["name"],
                "shape": shape,
                "datatype": datatype,
                "data": [_PROBE_VALUES[datatype]] * count,
            }
        )
    return {"inputs": inputs}


# ------------------------------------------------------------------------------------------
# Triton's HTTP API
# ------------------------------------------------------------------------------------------


class TritonAPIError(RuntimeError):
    """Triton answered with an error status (or did not answer)."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class TritonAdmin:
    """The few KServe v2 / Triton HTTP calls the supervisor needs, with the admin header."""

    def __init__(self, http_url: str, admin_key: str | None = None, timeout: float = 5.0):
        self.base = "http://" + http_url.split("://", 1)[-1].rstrip("/")
        self.headers = {ADMIN_HEADER: admin_key} if admin_key else {}
        self.timeout = timeout

    def _call(self, method: str, path: str, body: object = None, timeout: float | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base + path, data=data, method=method, headers=dict(self.headers)
        )
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout) as response:
                text = response.read().decode(errors="replace")
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            raise TritonAPIError(
                f"{method} {path}: HTTP {error.code}: {text}", error.code
            ) from None
        except (urllib.error.URLError, OSError) as error:
            raise TritonAPIError(f"{method} {path}: {error}") from None
        return json.loads(text) if text.strip() else None

    def is_ready(self) -> bool:
        try:
            self._call("GET", "/v2/health/ready", timeout=2.0)
            return True
        except TritonAPIError:
            return False

    def model_states(self) -> dict[str, str]:
        """{model: state} of the repository index (state 'READY' when serving)."""
        index = self._call("POST", "/v2/repository/index", {})
        return {entry["name"]: entry.get("state", "") for entry in index or []}

    def model_config(self, model: str) -> dict:
        return self._call("GET", f"/v2/models/{model}/config")

    def load_model(self, model: str, config: Mapping, timeout: float) -> None:
        body = {"parameters": {"config": json.dumps(config)}}
        self._call("POST", f"/v2/repository/models/{model}/load", body, timeout=timeout)

    def probe(self, model: str, body: Mapping, timeout: float = 10.0) -> str:
        """'alive', 'dead' (stub not healthy) or 'unknown' (busy, timeout, other error)."""
        try:
            self._call("POST", f"/v2/models/{model}/infer", body, timeout=timeout)
            return "alive"
        except TritonAPIError as error:
            if NOT_HEALTHY in str(error):
                return "dead"
            return "alive" if error.status == 400 else "unknown"


# ------------------------------------------------------------------------------------------
# The supervisor
# ------------------------------------------------------------------------------------------

HEALTHY, DEAD, RELOADING, FAILED = "healthy", "dead", "reloading", "failed"


@dataclass
class ModelState:
    """What the supervisor knows about one Python-backend model."""

    instances: set[str] = field(default_factory=set)
    state: str = HEALTHY
    restarts: int = 0
    next_attempt: float = 0.0
    backoff_s: float = 1.0
    detail: str = ""


class Supervisor:
    """Watch the stubs of one tritonserver, reload models whose stub died, report readiness.

    `server_pid` enables the process watch (same machine); `probe_interval_s` > 0 enables
    inference probes (works without a pid). `events` records what happened, with
    `time.monotonic()` timestamps, for tests and the /status page.
    """

    def __init__(
        self,
        http_url: str,
        server_pid: int | None = None,
        *,
        admin_key: str | None = None,
        poll_interval_s: float = DEFAULT_POLL_S,
        rescan_interval_s: float = DEFAULT_RESCAN_S,
        probe_interval_s: float = 0.0,
        load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S,
        proc_root: Path = Path("/proc"),
        admin: TritonAdmin | None = None,
        stub_lister: Callable[[int], list[StubProcess]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.admin = admin or TritonAdmin(http_url, admin_key)
        self.server_pid = server_pid
        self.poll_interval_s = poll_interval_s
        self.rescan_interval_s = rescan_interval_s
        self.probe_interval_s = probe_interval_s
        self.load_timeout_s = load_timeout_s
        self.proc_root = proc_root
        self.list_stubs = stub_lister or (lambda pid: list_stubs(pid, proc_root))
        self.clock = clock
        self.models: dict[str, ModelState] = {}
        self.configs: dict[str, dict] = {}
        self.known_pids: dict[int, str] = {}
        self.events: list[dict] = []
        self.draining = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_rescan = 0.0
        self._next_probe = 0.0

    # -- bookkeeping ---------------------------------------------------------------------
    def _record(self, event: str, model: str = "", **details) -> None:
        entry = {"time": self.clock(), "event": event, "model": model, **details}
        with self._lock:
            self.events.append(entry)
            del self.events[:-200]  # bounded: a flapping model must not grow memory
        logger.warning("supervisor: %s %s %s", event, model, details or "")

    def _set_state(self, model: str, state: str, detail: str = "") -> None:
        with self._lock:
            self.models[model].state = state
            self.models[model].detail = detail

    def refresh_models(self) -> None:
        """Learn the Python-backend models that are READY and the instances they should have."""
        states = self.admin.model_states()
        for model, state in states.items():
            if state != "READY":
                continue
            config = self.admin.model_config(model)
            if not has_stubs(config):
                continue
            self.configs[model] = config
            with self._lock:
                entry = self.models.setdefault(model, ModelState())
                entry.instances = expected_instances(config)
        with self._lock:
            for model in list(self.models):
                if states.get(model) != "READY" and self.models[model].state == HEALTHY:
                    del self.models[model]  # unloaded on purpose: nothing to heal

    # -- detection -----------------------------------------------------------------------
    def _known_stub_died(self) -> bool:
        return any(not is_alive(pid, self.proc_root) for pid in self.known_pids)

    def dead_by_process_watch(self) -> set[str]:
        """Models with an expected instance that has no live stub process."""
        stubs = self.list_stubs(self.server_pid)
        live = {stub.instance for stub in stubs}
        self.known_pids = {stub.pid: stub.instance for stub in stubs}
        with self._lock:
            return {
                model
                for model, entry in self.models.items()
                if entry.state == HEALTHY and entry.instances - live
            }

    def dead_by_probe(self) -> set[str]:
        dead = set()
        for model in list(self.models):
            body = probe_body(self.configs.get(model, {}))
            if (
                self.models[model].state == HEALTHY
                and body
                and self.admin.probe(model, body) == "dead"
            ):
                dead.add(model)
        return dead

    def confirm_dead(self, suspects: Iterable[str]) -> set[str]:
        """Re-read index and configs: a model unloaded or reconfigured on purpose is not dead."""
        self.refresh_models()
        if self.server_pid is None:
            return set(suspects) & set(self.models)
        return set(suspects) & self.dead_by_process_watch()

    # -- healing -------------------------------------------------------------------------
    def current_config(self, model: str) -> dict:
        """The model's config as loaded now; the last one seen when Triton cannot say (a model
        whose reload failed is unavailable and has no config to read)."""
        try:
            config = self.admin.model_config(model)
        except TritonAPIError:
            if model not in self.configs:
                raise
            return self.configs[model]
        self.configs[model] = config
        return config

    def heal(self, model: str) -> bool:
        """Reload `model` with its current config plus a new restart marker."""
        entry = self.models[model]
        entry.restarts += 1
        self._set_state(model, RELOADING)
        started = self.clock()
        marker = f"{entry.restarts}@{time.time():.3f}"
        try:
            config = self.current_config(model)
            self.admin.load_model(model, with_restart_marker(config, marker), self.load_timeout_s)
        except TritonAPIError as error:
            entry.next_attempt = self.clock() + entry.backoff_s
            entry.backoff_s = min(entry.backoff_s * 2, MAX_BACKOFF_S)
            self._set_state(model, FAILED, str(error)[:300])
            self._record("reload_failed", model, error=str(error)[:300])
            return False
        entry.backoff_s = 1.0
        self._set_state(model, HEALTHY)
        self._record("reloaded", model, seconds=round(self.clock() - started, 3))
        self.refresh_models()
        if self.server_pid is not None:
            self.dead_by_process_watch()  # learn the new stub's pid
        return True

    def poll_once(self) -> None:
        """One round: detect dead stubs, then reload what is dead (or failed and due)."""
        now = self.clock()
        suspects: set[str] = set()
        if self.server_pid is not None and (now >= self._next_rescan or self._known_stub_died()):
            self._next_rescan = now + self.rescan_interval_s
            suspects |= self.dead_by_process_watch()
        if self.probe_interval_s > 0 and now >= self._next_probe:
            self._next_probe = now + self.probe_interval_s
            suspects |= self.dead_by_probe()
        if suspects:
            for model in sorted(self.confirm_dead(suspects)):
                self._set_state(model, DEAD)
                self._record("dead", model)
        with self._lock:
            due = [
                model
                for model, entry in sorted(self.models.items())
                if entry.state == DEAD or (entry.state == FAILED and now >= entry.next_attempt)
            ]
        for model in due:
            if self._stop.is_set():
                return
            self.heal(model)

    # -- readiness -----------------------------------------------------------------------
    def unhealthy_models(self) -> dict[str, str]:
        with self._lock:
            return {m: e.state for m, e in self.models.items() if e.state != HEALTHY}

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons it is not) as a load balancer should see it."""
        reasons = []
        if self.draining:
            reasons.append("draining: the server is shutting down")
        if self._thread is not None and not self.is_running():
            reasons.append("supervisor loop stopped")
        reasons += [f"model {m} is {state}" for m, state in sorted(self.unhealthy_models().items())]
        if not reasons and not self.admin.is_ready():
            reasons.append("triton is not ready")
        return not reasons, reasons

    def drain(self) -> None:
        """From now on /ready answers 503, so load balancers stop sending new requests."""
        self.draining = True
        self._record("draining")

    def status(self) -> dict:
        ready, reasons = self.readiness()
        with self._lock:
            models = {
                m: {
                    "state": e.state,
                    "restarts": e.restarts,
                    "instances": sorted(e.instances),
                    "detail": e.detail,
                }
                for m, e in sorted(self.models.items())
            }
            events = list(self.events[-50:])
        return {
            "ready": ready,
            "reasons": reasons,
            "server_pid": self.server_pid,
            "stub_pids": {str(pid): name for pid, name in sorted(self.known_pids.items())},
            "models": models,
            "events": events,
            "clock": self.clock(),
        }

    # -- thread --------------------------------------------------------------------------
    def run(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                # While draining, Triton unloads every model on purpose: nothing to heal.
                if not self.draining:
                    if not self.models:
                        self.refresh_models()
                    self.poll_once()
                last_error = ""
            except TritonAPIError as error:  # Triton busy or restarting: try again next round
                if str(error) != last_error:  # once, not four times a second
                    logger.warning("supervisor: %s", error)
                last_error = str(error)
            except Exception:  # never let the watch die silently
                logger.exception("supervisor: poll failed")
            self._stop.wait(self.poll_interval_s)

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def prime(self) -> None:
        """Learn the models and their stubs as they are now (all taken as healthy)."""
        self.refresh_models()
        if self.server_pid is not None:
            self.dead_by_process_watch()
            self._next_rescan = self.clock() + self.rescan_interval_s

    def start(self) -> Supervisor:
        self.prime()
        self._thread = threading.Thread(target=self.run, name="phoenix-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)


# ------------------------------------------------------------------------------------------
# /ready, /live and /status
# ------------------------------------------------------------------------------------------


def _handler_for(supervisor: Supervisor, is_live: Callable[[], bool]):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            path = self.path.split("?", 1)[0].rstrip("/")
            if path == "/ready":
                ready, reasons = supervisor.readiness()
                self._reply(200 if ready else 503, {"ready": ready, "reasons": reasons})
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


def admin_key_from_env(name: str = ADMIN_KEY_ENV) -> str | None:
    return os.environ.get(name) or None


# ------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m phoenix.serving.supervisor",
        description="Watch a running tritonserver (explicit model control mode), reload models "
        "whose Python-backend stub died, and serve /ready, /live and /status for a load "
        "balancer. `python -m phoenix.serving.serve` already runs this beside its server.",
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
        help="seconds between checks of the stub processes (default: %(default)s)",
    )
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        metavar="NAME",
        help="environment variable holding the key for Triton's restricted model-repository "
        f"API, sent as header '{ADMIN_HEADER}' (default: %(default)s)",
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
        admin_key=admin_key_from_env(args.admin_key_env),
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


if __name__ == "__main__":
    sys.exit(main())
