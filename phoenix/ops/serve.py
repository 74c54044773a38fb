"""Serve the models on Triton until Ctrl-C or SIGTERM, then drain, unload and stop
(docs/reliability.md, "Shutdown"). Nothing outlives it, even when SIGKILLed, and it dies with
the process that started it (`make serve` killed), unless started detached. Without a store's
URL it starts the user-state store, whose data stays in --store-dir (docs/user-state.md).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.files import resolve_inside
from phoenix.checkpoint.identity import artifact_version, servable_artifact_dir
from phoenix.ops.admin_key import ADMIN_HEADER, ADMIN_KEY_ENV, AdminKeyError, server_admin_key
from phoenix.ops.compile import ensure_programs, warn_if_no_gpu_jax
from phoenix.ops.configs import ConfigError, variant_repository
from phoenix.ops.profiles import instance_counts_arg, profile
from phoenix.ops.serve_store import (
    StoreChoice,
    add_store_arguments,
    check_store_arguments,
    store_line,
    store_state,
    user_state_store,
)
from phoenix.ops.serving_state import remove_serving_state, write_serving_state
from phoenix.ops.supervisor.admin import TritonAdmin, TritonAPIError
from phoenix.ops.supervisor.endpoints import ReadinessServer
from phoenix.ops.supervisor.state import Supervisor
from phoenix.ops.triton_server import (
    DEFAULT_READY_TIMEOUT_S,
    TritonServer,
    TritonServerError,
    flags_to_args,
)
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state.embedded import StoreFolderBusy
from phoenix.user_state.server import RedisServerError, RedisServerMissing
from phoenix.user_state.store import reachability_check
from phoenix.util.command_line import command_name, command_parser, port_number
from phoenix.util.processes import LOOPBACK, client_host, die_with_parent, echo_log

DEFAULT_ARTIFACTS = Path("artifacts/demo")
DEFAULT_MODEL_REPOSITORY = Path("model_repository")
DEFAULT_BUILD_DIR = Path("build/serve")
DEFAULT_STOP_TIMEOUT_S = 30.0
# Triton's own exit timeout: after our unloads it only waits for idle HTTP keep-alive
# connections, which clients never close on their own.
EXIT_TIMEOUT_S = 3
# APIs that change the server (load/unload = run model code, shared memory, trace, log settings)
# need the admin key; inference, health, metadata, config and statistics stay open.
RESTRICTED_APIS = "model-repository,shared-memory,trace,logging"


class ServeError(RuntimeError):
    """A problem the user can fix (printed without a traceback)."""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        command_name("phoenix.ops.serve"),
        "Serve the Phoenix ranker and retriever on Triton Inference Server "
        "(the tritonserver shipped in nvidia-pytriton, Python backend).",
        "Examples:\n"
        "  phoenix-serve --artifacts artifacts/trained-demo\n"
        "  phoenix-serve --device gpu --http-port 9000\n"
        "Port 0 picks a free port. Metrics: curl http://HOST:METRICS_PORT/metrics",
    )
    add = parser.add_argument
    add("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help="artifact folder (%(default)s)")
    add("--device", choices=("cpu", "gpu"), default="cpu", help="gpu needs `make setup DEVICE=gpu`")
    add("--host", default=LOOPBACK, help="address to bind (%(default)s)")
    for name, default, what in (
        ("--http-port", 8000, "HTTP/REST (KServe v2)"),
        ("--grpc-port", 8001, "gRPC (KServe v2)"),
        ("--metrics-port", 8002, "Prometheus metrics"),
        ("--supervisor-port", 8003, "the supervisor's /ready (probe it), /live and /status"),
    ):
        add(name, type=port_number, default=default, metavar="PORT", help=f"{what} (%(default)s)")
    add("--model-repository", type=Path, default=DEFAULT_MODEL_REPOSITORY, help="%(default)s")
    corpus = "serve a copy reading this corpus file or store directory inside the artifacts"
    add("--corpus", metavar="NAME", help=corpus)
    add("--no-dynamic-batching", action="store_true", help="serve a copy without dynamic batching")
    add("--max-queue-delay-us", type=int, metavar="US", help="serve a copy with this queue delay")
    instances = "serve a copy with these instance counts, e.g. ranker=8 (on an H200 the ranker's "
    instances += "host work a request bounds the rate: 8 instances served 2.9-3.3x the profile's "
    instances += "2 at concurrency 256; docs/performance.md)"
    add("--instances", type=instance_counts_arg, metavar="MODEL=N,...", help=instances)
    logs = "generated repositories, server logs and the admin key (%(default)s)"
    add("--build-dir", type=Path, default=DEFAULT_BUILD_DIR, help=logs)
    ready = "seconds the models get to load (%(default)s)"
    add("--ready-timeout", type=float, default=DEFAULT_READY_TIMEOUT_S, metavar="S", help=ready)
    add("--quiet", action="store_true", help="do not echo the server log")
    redis = "the user-state store recommend reads by user id: redis://host:port/db (one server) "
    redis += "or redis+cluster://host:port (any node of a Redis Cluster); rediss:// and "
    redis += f"rediss+cluster:// with TLS (default: ${USER_STATE_URL_ENV}; unset: serve starts a "
    redis += "local redis-server whose data stays in --store-dir, and stops it with itself)"
    add(
        "--redis",
        metavar="URL",
        type=redis_url,
        default=os.environ.get(USER_STATE_URL_ENV) or None,
        help=redis,
    )
    add_store_arguments(parser)
    add("--no-supervisor", action="store_true", help="no stub healing, no /ready, no clean unloads")
    drain = "on SIGTERM/Ctrl-C, /ready answers 503 for S seconds before the stop (%(default)s)"
    add("--drain-seconds", type=float, default=0.0, metavar="S", help=drain)
    stop = "seconds in-flight requests get to finish (%(default)s)"
    add("--stop-timeout", type=float, default=DEFAULT_STOP_TIMEOUT_S, metavar="S", help=stop)
    key = "variable with the admin key; unset: a random one in BUILD_DIR/admin-key (%(default)s)"
    add("--admin-key-env", default=ADMIN_KEY_ENV, metavar="NAME", help=key)
    return parser


def server_flags(supervised: bool, admin_key: str, device: str = "cpu") -> dict[str, object]:
    """tritonserver options: the device's configs, explicit model control for the supervisor's
    reloads, the rollouts' loads and the clean stop's unloads, the admin key on every bind.
    Supervised, Triton's own readiness says the server is up (not that no model anywhere is
    loading: a rollout's copy loading beside the served models would turn it false); the
    supervisor's /ready says whether the served models answer (docs/reliability.md)."""
    flags: dict[str, object] = {"exit_timeout_secs": EXIT_TIMEOUT_S}
    if config_name := profile(device).config_name:
        flags["model_config_name"] = config_name
    if supervised:
        flags.update(model_control_mode="explicit", load_model="*", strict_readiness="false")
    restriction = f"{RESTRICTED_APIS}:{ADMIN_HEADER}={admin_key}"
    flags.update(http_restricted_api=restriction, grpc_restricted_protocol=restriction)
    return flags


def stop_with_parent() -> None:
    """SIGKILL when our parent dies (`make serve` killed hard: so are we, and tritonserver with
    us), unless started detached (nohup, setsid). Ctrl-C and SIGTERM to serve still drain."""
    detached = signal.getsignal(signal.SIGHUP) is signal.SIG_IGN or os.getsid(0) == os.getpid()
    if not detached:
        die_with_parent(signal.SIGKILL, os.getppid())


def make_server(
    args: argparse.Namespace,
    artifacts: Path,
    repository: Path,
    admin_key: str,
    supervised: bool,
    user_state_url: str = "",
) -> TritonServer:
    """The tritonserver of this command and of clients/demo.py, not started, with serve's options
    in `args` (device, host, http_port, grpc_port, metrics_port, build_dir, ready_timeout); its
    user_state model reads the store at `user_state_url` ("": none, by-id requests fail)."""
    return TritonServer(
        repository,
        artifacts_dir=artifacts,
        host=args.host,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        extra_args=flags_to_args(server_flags(supervised, admin_key, args.device)),
        # One log per run: several people may serve from the same checkout at once.
        log_path=args.build_dir / f"tritonserver-{os.getpid()}.log",
        ready_timeout=args.ready_timeout,
        env={USER_STATE_URL_ENV: user_state_url} if user_state_url else None,
    )


def redis_url(text: str) -> str:
    """--redis: a store URL (phoenix.user_state.client.URL_FORMS), else argparse's error."""
    from phoenix.user_state.client import url_argument

    return url_argument(text)


def describe(
    server: TritonServer,
    ready_url: str | None,
    key_file: Path | None,
    store: StoreChoice | None = None,
) -> str:
    key = f"in {key_file} (mode 0600)" if key_file else "from $" + ADMIN_KEY_ENV
    ready = f"\n  ready    {ready_url}  (load balancers: probe this)" if ready_url else ""
    if store is not None:
        ready += f"\n  store    {store_line(store)}"
    return (
        f"Triton is ready after {server.ready_after_s:.1f} s\n"
        f"  HTTP     http://{server.http_url}  (tritonclient url: {server.http_url})\n"
        f"  gRPC     {server.grpc_url}\n"
        f"  metrics  {server.metrics_url}\n"
        f"  log      {server.log_path}\n"
        f"{served_version_line(server)}"
        f"  models   {server.served_repository or server.model_repository}  (phoenix-rollout "
        "--repository)\n"
        f"  admin    key {key}; header '{ADMIN_HEADER}' (SECURITY.md){ready}"
    )


def served_version_line(server: TritonServer) -> str:
    """The banner's line naming the artifacts served and their version label ("" without)."""
    if server.artifacts_dir is None:
        return ""
    return f"  version  {artifact_version(server.artifacts_dir)}  ({server.artifacts_dir})\n"


def check_corpus(artifacts: Path, name: str) -> None:
    """--corpus must name a corpus file or store inside the artifacts (ArtifactError if not)."""
    path = resolve_inside(artifacts, name)
    if not path.exists():
        raise ArtifactError(
            f"--corpus {name}: no corpus file or store {path} in the artifacts {artifacts} "
            "(build one with phoenix-build-corpus)"
        )


def serving_state(
    server: TritonServer,
    ready_url: str | None,
    key_file: Path | None,
    store: StoreChoice | None = None,
) -> dict:
    """What an operator's tool needs to find this server (``serving_state``)."""
    return {
        "http": server.http_url,
        "grpc": server.grpc_url,
        "metrics": server.metrics_url,
        "ready": ready_url,
        "repository": str(server.served_repository or server.model_repository),
        "artifacts": str(server.artifacts_dir),
        "artifact_version": (
            artifact_version(server.artifacts_dir) if server.artifacts_dir is not None else None
        ),
        "admin_key_file": str(Path(key_file).resolve()) if key_file else None,
        "user_state": store_state(store) if store is not None else None,
    }


def wait_in_short_naps(wait: Callable[[float], int], nap_s: float = 0.1) -> int:
    """`wait(timeout)` until it returns, waking every `nap_s`: the kernel may hand SIGTERM to any
    thread, and in one long waitpid() the main thread would not run the drain handler."""
    while True:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return wait(nap_s)


def unload_all(admin: TritonAdmin, timeout_s: float) -> list[str]:
    """Unload every model, ensembles first (none left pointing at a missing step), and wait up
    to `timeout_s` for their requests in flight; returns the models still loaded then."""

    def models(wanted: Callable[[str], bool]) -> list[str]:
        return [m for m, (state, _) in sorted(admin.model_index().items()) if wanted(state)]

    loaded = models(lambda state: state == "READY")
    ensembles = [m for m in loaded if admin.model_config(m).get("platform") == "ensemble"]
    for model in ensembles + [m for m in loaded if m not in ensembles]:
        try:
            admin.unload_model(model)
        except TritonAPIError as error:
            say(f"stopping: could not unload {model}: {error}")
    deadline = time.monotonic() + timeout_s
    while (left := models(lambda s: s != "UNAVAILABLE")) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@dataclass
class Shutdown:
    """The signal handling of a foreground server (install() from the main thread)."""

    server: TritonServer
    supervisor: Supervisor | None = None
    drain_seconds: float = 0.0
    stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S
    signals: list[int] = field(default_factory=list)
    started_at: float | None = None
    overran: str = ""  # why the stop took longer than its limit

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.signals.append(signum)
        name = signal.Signals(signum).name
        if len(self.signals) > 1:
            say(f"\n{name} again: killing tritonserver without waiting for requests")
            self.server.kill()
            return
        self.started_at = time.monotonic()
        then = "then stopping; a second signal kills the server"
        say(f"\n{name}: draining for {self.drain_seconds:g} s (/ready answers 503), {then}")
        if self.supervisor is not None:
            self.supervisor.drain()
        threading.Thread(target=self._stop_serving, daemon=True, name="phoenix-stop").start()

    def _stop_serving(self) -> None:
        time.sleep(self.drain_seconds)
        # Unloading needs explicit model control, which comes with the supervisor.
        if self.supervisor is not None:
            try:
                left = unload_all(self.supervisor.admin, self.stop_timeout_s)
            except TritonAPIError as error:
                left = [f"(Triton did not answer: {error})"]
            if left:
                self.overran = (
                    f"models still loaded {self.stop_timeout_s:g} s after the unload: "
                    f"{', '.join(left)} (a request that does not finish, or a stub that died "
                    "earlier and cannot be unloaded)"
                )
                say(f"stopping: {self.overran}")
        assert self.server.process is not None  # serve_foreground's server runs
        self.server.process.send_signal(signal.SIGTERM)  # a no-op once it has exited

    def exit_code(self, returncode: int) -> int:
        """Our exit code for tritonserver's, with the reason on stderr unless the stop was clean."""
        if len(self.signals) > 1:
            say("exit: killed on a second signal; in-flight requests may have been cut")
            return 128 + self.signals[-1]
        if self.overran:
            say(f"exit 1: the stop outlived its limit: {self.overran}")
            return 1
        if returncode == 0:
            if self.started_at is not None:
                say(f"stopped cleanly {time.monotonic() - self.started_at:.1f} s after the signal")
            return 0
        code = 128 - returncode if returncode < 0 else returncode
        if "Exit timeout expired" in self.server.log_tail(200):
            why = "the stop outlived Triton's exit timeout: a request still in flight or a model "
            why += "that could not be unloaded"
            events = self.supervisor.events if self.supervisor is not None else []
            if healed := sorted({e["model"] for e in events if e["event"] == "reloaded"}):
                why += f"; here the version of {', '.join(healed)} whose stub died before the "
                why += "supervisor reloaded it (Triton 2.51 never finishes unloading it)"
        elif returncode < 0 or code > 128:
            why = f"tritonserver died of signal {code - 128}"
        else:
            why = "tritonserver failed"
        say(f"exit {code}: {why}; see {self.server.log_path}")
        return code


def serve_foreground(
    server: TritonServer,
    args: argparse.Namespace,
    admin_key: str,
    key_file: Path | None,
    store: StoreChoice | None = None,
) -> int:
    """Run until the server exits (on its own or after a signal); unless --no-supervisor, the
    supervisor serves /ready (503 while the models load) and heals dead stubs meanwhile."""
    user_state_url = store.url if store is not None else ""
    assert server.process is not None and server.pid is not None  # started by the caller
    stop_echo = threading.Event()
    echo = threading.Thread(target=echo_log, args=(server.log_path, stop_echo), daemon=True)
    if not args.quiet:
        echo.start()
    supervisor = endpoint = ready_url = None
    try:
        if not args.no_supervisor:  # bound at once: a port in use fails before the models load
            degraded_by = [reachability_check(user_state_url)] if user_state_url else []
            supervisor = Supervisor(
                server.http_url, server.pid, admin_key=admin_key, degraded_by=degraded_by
            )
            try:
                endpoint = ReadinessServer(supervisor, server.host, args.supervisor_port).start()
            except OSError as error:
                raise ServeError(
                    f"--supervisor-port {args.supervisor_port} on {server.host} is not free "
                    f"({error.strerror}): pick another port, 0 for any free one, or --no-supervisor"
                ) from None
            ready_url = f"http://{client_host(server.host)}:{endpoint.port}/ready"
        server.wait_ready()
        if supervisor is not None:
            supervisor.start()
        state = serving_state(server, ready_url, key_file, store)
        state_file = write_serving_state(args.build_dir, state)
        banner = describe(server, ready_url, key_file, store)
        print(banner + "\nCtrl-C stops the server.", flush=True)
        print(f"  state    {state_file}  (read by phoenix-rollout, phoenix-events)", flush=True)
        shutdown = Shutdown(server, supervisor, args.drain_seconds, args.stop_timeout)
        shutdown.install()
        return shutdown.exit_code(wait_in_short_naps(server.process.wait))
    finally:
        remove_serving_state(args.build_dir)
        if endpoint is not None:
            endpoint.stop()
        if supervisor is not None:
            supervisor.stop()
        server.stop()
        stop_echo.set()
        if echo.is_alive():
            echo.join(timeout=2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_store_arguments(parser, args)
    stop_with_parent()
    try:
        artifacts = servable_artifact_dir(args.artifacts)
        if args.corpus is not None:
            check_corpus(artifacts, args.corpus)  # before Triton's start-up, not after it
        repository = variant_repository(
            args.model_repository, args.build_dir, args.device, not args.no_dynamic_batching,
            queue_delay_us=args.max_queue_delay_us, corpus=args.corpus, instances=args.instances,
        )  # fmt: skip
        warn_if_no_gpu_jax(args.device)
        ensure_programs(artifacts, args.device)  # once here; the model instances only load
        admin_key, key_file = server_admin_key(args.build_dir, args.admin_key_env)
        with user_state_store(args) as store:
            server = make_server(
                args, artifacts, repository, admin_key, not args.no_supervisor, store.url
            )
            print(f"starting tritonserver over {repository} (artifacts: {artifacts})", flush=True)
            server.start()
            return serve_foreground(server, args, admin_key, key_file, store)
    except (ServeError, AdminKeyError, TritonServerError, ConfigError, ArtifactError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except (RedisServerMissing, RedisServerError) as error:
        busy = isinstance(error, StoreFolderBusy)  # its message says what to do
        hint = "" if busy else "\n(or name a running store with --redis URL)"
        print(f"error: {error}{hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
