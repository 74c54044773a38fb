"""Start and stop a real Triton Inference Server from the `nvidia-pytriton` wheel.

`nvidia-pytriton` ships a complete `tritonserver` binary, the Python backend and one backend stub
per Python version. The backend looks for `triton_python_backend_stub` beside
`libtriton_python.so`, so we build a backend folder of our own (links only, site-packages stays
untouched) and pass it with `--backend-directory`.

Run `python -m phoenix.serving.triton_server --build-backend-dir DIR` to build that folder.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB_NAME = "triton_python_backend_stub"
BACKEND_DIR_STAMP = ".phoenix-backend-dir"
DEFAULT_READY_TIMEOUT_S = 180.0
DEFAULT_STOP_TIMEOUT_S = 15.0
LOOPBACK = "127.0.0.1"
HARMLESS_LOG_ERRORS = ("CudaDriverHelper has not been initialized", "Failed to initialize NVML")
_ERROR_LINE = re.compile(r"^E\d{4} ")
# `--http-restricted-api=<apis>:<header>=<key>` (and the gRPC twin) carry a secret.
_RESTRICTION_KEY = re.compile(r"^(--(?:http-restricted-api|grpc-restricted-protocol)=[^=]*=).*$")


class TritonServerError(RuntimeError):
    """The server could not be found, started, or did not become ready."""


def pytriton_server_root() -> Path:
    """Folder `pytriton/tritonserver` of the installed `nvidia-pytriton` wheel."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonServerError(
            "nvidia-pytriton is not installed in this Python environment "
            f"({sys.prefix}); run `make setup`."
        )
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    if not root.is_dir():
        raise TritonServerError(f"{root} is missing: is nvidia-pytriton installed completely?")
    return root


def find_tritonserver_binary() -> Path:
    """Path of the `tritonserver` executable shipped in the pytriton wheel."""
    binary = pytriton_server_root() / "bin" / "tritonserver"
    if not os.access(binary, os.X_OK):
        raise TritonServerError(f"tritonserver binary not found or not executable: {binary}")
    return binary


def python_stub_path(python_version: str | None = None) -> Path:
    """Python backend stub matching `python_version` (default: this interpreter's X.Y)."""
    version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = pytriton_server_root() / "python_backend_stubs" / version / STUB_NAME
    if not stub.is_file():
        raise TritonServerError(f"no Python {version} backend stub in the pytriton wheel: {stub}")
    return stub


def default_backend_dir() -> Path:
    """Where our backend folder lives: inside the active environment (the venv)."""
    return Path(sys.prefix) / "triton-backends"


def _link(target: Path, link: Path) -> None:
    """Make `link` a symlink to `target`, replacing whatever was there."""
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(target)


def build_backend_dir(dest: str | os.PathLike | None = None) -> Path:
    """Build (or refresh) `dest/python/` with links to the Python backend and its stub.

    Links rather than copies: the stub finds its bundled libcudart through an $ORIGIN-relative
    rpath, which the kernel resolves from the link's real location. Returns `dest`.
    """
    dest = Path(dest) if dest is not None else default_backend_dir()
    backend_src = pytriton_server_root() / "backends" / "python"
    python_dir = dest / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for name in BACKEND_FILES:
        _link(backend_src / name, python_dir / name)
    _link(python_stub_path(), python_dir / STUB_NAME)
    (dest / BACKEND_DIR_STAMP).touch()
    return dest


def ensure_backend_dir(dest: str | os.PathLike | None = None) -> Path:
    """Return a usable backend folder, building it when its links are missing or broken."""
    dest = Path(dest) if dest is not None else default_backend_dir()
    wanted = [dest / "python" / name for name in (*BACKEND_FILES, STUB_NAME)]
    if all(path.exists() for path in wanted):
        return dest
    return build_backend_dir(dest)


def pick_free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports free on `host` right now (held together so they differ)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((host, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def client_host(bind_host: str) -> str:
    """Address a client on this machine should dial for a server bound to `bind_host`."""
    return LOOPBACK if bind_host in ("", "0.0.0.0") else bind_host


def server_environment(
    artifacts_dir: str | os.PathLike | None = None,
    overrides: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for tritonserver and the stubs it spawns.

    The stub runs model.py in the Python environment found first on PATH, so the venv's bin
    goes first; PYTHONPATH gets the repo root so model.py can `import phoenix`.
    """
    env = dict(os.environ if base is None else base)
    env["PATH"] = os.pathsep.join(
        p for p in (str(Path(sys.prefix) / "bin"), env.get("PATH", "")) if p
    )
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    # Without this the first JAX stub on a GPU grabs 75% of its memory and the others fail.
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if artifacts_dir is not None:
        env["PHOENIX_ARTIFACT_DIR"] = str(Path(artifacts_dir).resolve())
    env.update(overrides or {})
    return env


def redact_secrets(command: Sequence[str]) -> list[str]:
    """`command` with the admin key of restricted-API flags replaced by '***'."""
    return [_RESTRICTION_KEY.sub(r"\1***", arg) for arg in command]


def read_log_tail(path: Path | None, lines: int = 40) -> str:
    """Last `lines` lines of a log file ('' when there is none)."""
    if path is None or not path.exists():
        return ""
    with path.open("rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def log_error_lines(text: str, limit: int = 10) -> list[str]:
    """Error lines of a tritonserver log (E-level entries, UNAVAILABLE models), minus the
    warnings every GPU-less machine prints."""
    errors = [
        line
        for line in text.splitlines()
        if (_ERROR_LINE.match(line) or "UNAVAILABLE" in line)
        and not any(noise in line for noise in HARMLESS_LOG_ERRORS)
    ]
    return errors[:limit]


def http_get_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of GET `url`, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None


class TritonServer:
    """One tritonserver process over a model repository.

    Ports given as 0 or None are picked free at start. `http_url` and `grpc_url` are
    `host:port`, the form tritonclient's `url=` takes; `metrics_url` is the full Prometheus URL.
    Used as a context manager it starts, waits until ready, and stops on exit.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike,
        *,
        artifacts_dir: str | os.PathLike | None = None,
        host: str = LOOPBACK,
        http_port: int | None = 0,
        grpc_port: int | None = 0,
        metrics_port: int | None = 0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: str | os.PathLike | None = None,
        backend_dir: str | os.PathLike | None = None,
        binary: str | os.PathLike | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.artifacts_dir = Path(artifacts_dir).resolve() if artifacts_dir else None
        self.host = host
        self.requested_ports = (http_port, grpc_port, metrics_port)
        self.http_port = self.grpc_port = self.metrics_port = 0
        self.extra_args = list(extra_args)
        self.env_overrides = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.backend_dir = Path(backend_dir) if backend_dir else None
        self.binary = Path(binary) if binary else None
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self.last_command: list[str] = []
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    # -- addresses -------------------------------------------------------------------------
    @property
    def http_url(self) -> str:
        """`host:port` of the HTTP/REST endpoint (tritonclient.http `url=`)."""
        return f"{client_host(self.host)}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        """`host:port` of the gRPC endpoint (tritonclient.grpc `url=`)."""
        return f"{client_host(self.host)}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        """Full URL of the Prometheus metrics page."""
        return f"http://{client_host(self.host)}:{self.metrics_port}/metrics"

    @property
    def ready_url(self) -> str:
        return f"http://{self.http_url}/v2/health/ready"

    # -- lifecycle -------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The tritonserver command line (ports must be assigned already)."""
        return [
            str(self.binary or find_tritonserver_binary()),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={ensure_backend_dir(self.backend_dir)}",
            f"--http-address={self.host}",
            f"--grpc-address={self.host}",
            f"--metrics-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            *self.extra_args,
        ]

    def _assign_ports(self) -> None:
        wanted = [port or 0 for port in self.requested_ports]
        free = iter(pick_free_ports(wanted.count(0), self.host or LOOPBACK))
        self.http_port, self.grpc_port, self.metrics_port = (p or next(free) for p in wanted)

    def _open_log(self):
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        return self.log_path.open("wb")

    def start(self) -> TritonServer:
        """Launch tritonserver in the background (no-op when already running)."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise TritonServerError(f"model repository not found: {self.model_repository}")
        self._assign_ports()
        self.last_command = command = self.command()
        env = server_environment(self.artifacts_dir, self.env_overrides)
        with self._open_log() as log:
            # A session of its own: a terminal's Ctrl-C reaches only us (we forward it), and
            # the stubs share the server's process group so stop() can reap leftovers.
            self.process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,
            )
        self.started_at = time.monotonic()
        self.ready_after_s = None
        return self

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def returncode(self) -> int | None:
        return self.process.poll() if self.process else None

    def is_ready(self) -> bool:
        return self.is_running() and http_get_status(self.ready_url) == 200

    def log_tail(self, lines: int = 40) -> str:
        return read_log_tail(self.log_path, lines)

    def _failure(self, reason: str) -> TritonServerError:
        full_log = read_log_tail(self.log_path, lines=2000)
        errors = "\n".join(log_error_lines(full_log)) or "(none)"
        return TritonServerError(
            f"{reason}\nerrors in the server log:\n{errors}\n"
            f"command: {' '.join(redact_secrets(self.last_command))}\n"
            f"server log ({self.log_path}), last lines:\n{self.log_tail()}"
        )

    def wait_ready(self, timeout: float | None = None, poll_interval: float = 0.2) -> float:
        """Poll /v2/health/ready until 200; return seconds since start.

        Raises TritonServerError, with the tail of the server log, when the process exits or
        `timeout` seconds pass first.
        """
        if self.process is None or self.started_at is None:
            raise TritonServerError("wait_ready() called before start()")
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise self._failure(f"tritonserver exited with code {code} before it was ready")
            if http_get_status(self.ready_url) == 200:
                self.ready_after_s = time.monotonic() - self.started_at
                return self.ready_after_s
            if time.monotonic() > deadline:
                raise self._failure(f"tritonserver was not ready after {timeout:.0f} s")
            time.sleep(poll_interval)

    def send_signal(self, signum: int) -> None:
        if self.is_running():
            self.process.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        """Block until the server exits; return its exit code."""
        if self.process is None:
            raise TritonServerError("wait() called before start()")
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the server and its stubs at once (no graceful shutdown)."""
        if self.process is not None:
            self._kill_process_group()
            self.process.wait()

    def _kill_process_group(self) -> None:
        """SIGKILL whatever is left in the server's group (stubs orphaned by a hard kill)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT_S) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; return the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._kill_process_group()
                self.process.wait(timeout)
        self._kill_process_group()
        return self.process.returncode

    def start_ready(self) -> TritonServer:
        """Start and wait until ready; a server that fails to get ready is stopped."""
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> TritonServer:
        self.start_ready()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else f"exited({self.returncode})"
        return f"TritonServer({self.model_repository}, http={self.http_url}, {state})"


def flags_to_args(flags: Mapping[str, object]) -> list[str]:
    """Turn {"model_control_mode": "explicit", "load_model": ["a", "b"]} into CLI flags.

    True gives a bare `--flag`, False/None are skipped, lists repeat the flag.
    """
    args: list[str] = []
    for key, value in flags.items():
        name = "--" + key.replace("_", "-")
        values: Iterable = value if isinstance(value, list | tuple) else [value]
        for item in values:
            if item is True:
                args.append(name)
            elif item is not None and item is not False:
                args.append(f"{name}={item}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m phoenix.serving.triton_server",
        description="Helpers around the tritonserver shipped in nvidia-pytriton.",
    )
    parser.add_argument(
        "--build-backend-dir",
        metavar="DIR",
        help="build the backend folder (python backend + this Python's stub) in DIR",
    )
    parser.add_argument("--print-binary", action="store_true", help="print tritonserver's path")
    args = parser.parse_args(argv)
    if not (args.build_backend_dir or args.print_binary):
        parser.error("nothing to do: give --build-backend-dir or --print-binary")
    try:
        if args.build_backend_dir:
            print(build_backend_dir(args.build_backend_dir))
        if args.print_binary:
            print(find_tritonserver_binary())
    except TritonServerError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
