"""Start and stop a tritonserver (triton_install says which); it never outlives its launcher."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

from phoenix.ops.triton_install import TritonServerError, server_and_backends
from phoenix.stub.registry import STUB_DIR_ENV
from phoenix.util.processes import (
    LOOPBACK,
    StartsReady,
    client_host,
    dying_with_us,
    http_get_status,
    pick_free_ports,
    read_log_tail,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
# How long a start may take to be ready: loading the models (JAX compiles) can take minutes.
DEFAULT_READY_TIMEOUT_S = 600.0
# Error lines of a tritonserver log, and the ones every GPU-less machine prints.
_ERROR_LINE = re.compile(r"^E\d{4} |UNAVAILABLE")
_HARMLESS_ERROR = re.compile("CudaDriverHelper has not been initialized|Failed to initialize NVML")
# Where the Python backend keeps each model instance's shared memory with its stub: a region
# per instance, created by the backend and removed by it when the instance unloads. A server
# that is killed, or exits before every instance is unloaded (--exit-timeout-secs), leaves its
# regions behind (1 MiB and up each) until the machine restarts; each server names its own
# with a prefix of its own, so that they can be found and removed.
SHARED_MEMORY = Path("/dev/shm")
SHARED_MEMORY_PREFIX = "phoenix-triton-"
# `--http-restricted-api=<apis>:<header>=<key>` (and the gRPC twin) carry a secret.
_RESTRICTION_KEY = re.compile(r"^(--(?:http-restricted-api|grpc-restricted-protocol)=[^=]*=).*$")


def redact_secrets(command: Sequence[str]) -> list[str]:
    """`command` with the admin key of restricted-API flags replaced by '***'."""
    return [_RESTRICTION_KEY.sub(r"\1***", arg) for arg in command]


def flags_to_args(flags: Mapping[str, object]) -> list[str]:
    """{"load_model": ["a", "b"], "strict": True} as `--load-model=a --load-model=b --strict`
    (False and None are left out)."""
    args = []
    for key, value in flags.items():
        for item in value if isinstance(value, list | tuple) else [value]:
            if item is True:
                args.append(f"--{key.replace('_', '-')}")
            elif item is not None and item is not False:
                args.append(f"--{key.replace('_', '-')}={item}")
    return args


class TritonServer(StartsReady):
    """One tritonserver over a model repository; ports 0 or None are picked free now. As a
    context manager it starts, waits until ready and stops."""

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
        ready_timeout: float = DEFAULT_READY_TIMEOUT_S,
    ) -> None:
        self.model_repository = Path(model_repository).resolve()
        self.artifacts_dir = Path(artifacts_dir).resolve() if artifacts_dir else None
        self.host = host
        free = iter(pick_free_ports(3, host or LOOPBACK))
        ports = [port or next(free) for port in (http_port, grpc_port, metrics_port)]
        self.http_port, self.grpc_port, self.metrics_port = ports
        # `host:port`, as tritonclient's url= takes it
        self.http_url, self.grpc_url = (f"{client_host(host)}:{port}" for port in ports[:2])
        self.metrics_url = f"http://{client_host(host)}:{self.metrics_port}/metrics"
        self.ready_url = f"http://{self.http_url}/v2/health/ready"
        self.extra_args = list(extra_args)
        self.env_overrides = dict(env or {})
        self.log_path = Path(log_path) if log_path else None
        self.ready_timeout = ready_timeout
        self.process: subprocess.Popen | None = None
        self.stub_dir: Path | None = None
        # With artifacts_dir: the copy of the repository tritonserver serves, its configs naming
        # those artifacts (served_artifacts); removed by stop() and kill().
        self.served_repository: Path | None = None
        self.last_command: list[str] = []
        self.shared_memory_prefix = f"{SHARED_MEMORY_PREFIX}{uuid.uuid4().hex[:12]}-"
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def command(self) -> list[str]:
        """The tritonserver command line (the server and backends of triton_install)."""
        binary, backends = server_and_backends()
        return [
            str(binary),
            f"--model-repository={self.served_repository or self.model_repository}",
            f"--backend-directory={backends}",
            *(f"--{api}-address={self.host}" for api in ("http", "grpc", "metrics")),
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            f"--backend-config=python,shm-region-prefix-name={self.shared_memory_prefix}",
            *self.extra_args,
        ]

    def start(self) -> TritonServer:
        """Launch tritonserver (no-op when running), from the thread that lives as long as the
        server, normally the main thread: it is killed when that thread ends (`die_with_parent`)."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise TritonServerError(f"model repository not found: {self.model_repository}")
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.served_repository = self._write_served_repository()
        try:
            self._launch()
        except BaseException:  # no server to stop(): remove what it would have
            self._remove_temporary_folders()
            raise
        self.started_at = time.monotonic()
        self.ready_after_s = None
        return self

    def _launch(self) -> None:
        assert self.log_path is not None  # set by start()
        self.last_command = command = self.command()
        self.stub_dir = Path(tempfile.mkdtemp(prefix=f"{self.log_path.stem}.stubs-",
                                              dir=self.log_path.parent))  # fmt: skip
        with self.log_path.open("wb") as log:
            # A session of its own: a terminal's Ctrl-C reaches only us (serve drains first),
            # and the stubs share the server's process group so stop() can reap leftovers.
            self.process = subprocess.Popen(
                dying_with_us(command), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=self._environment(), cwd=REPO_ROOT, start_new_session=True,
            )  # fmt: skip

    def _remove_temporary_folders(self) -> None:
        for folder in (self.stub_dir, self.served_repository):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    def _write_served_repository(self) -> Path | None:
        """With artifacts_dir, a copy of the repository beside the log whose configs say which
        artifacts are served (GET /v2/models/<m>/config tells clients); else None."""
        if self.artifacts_dir is None:
            return None
        from phoenix.ops.served_repository import write_served_repository

        assert self.log_path is not None  # set by start()
        dest = tempfile.mkdtemp(
            prefix=f"{self.log_path.stem}.repository-", dir=self.log_path.parent
        )
        try:
            return write_served_repository(self.model_repository, Path(dest), self.artifacts_dir)
        except Exception as error:  # no config.json, a config Triton could not read either
            shutil.rmtree(dest, ignore_errors=True)
            raise TritonServerError(f"cannot serve {self.artifacts_dir}: {error}") from None

    def _environment(self) -> dict[str, str]:
        """A stub runs model.py in the Python first on PATH (the venv's), importing this checkout,
        and registers itself in `stub_dir` (supervisor/stubs.py)."""
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join(filter(None, (f"{sys.prefix}/bin", env.get("PATH"))))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(REPO_ROOT), env.get("PYTHONPATH"))))
        # Without this the first JAX stub on a GPU grabs 75% of its memory and the others fail.
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        env.setdefault("PYTHONUNBUFFERED", "1")
        # numpy's OpenBLAS threads spin after each matmul and starve the other instances: with
        # a 100 k corpus store searched exactly, recommend fell from 88 to 65 req/s on 2 cores
        # (docs/retrieval.md). Instances are the parallelism; each uses one BLAS thread.
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        # The served configs name the artifacts (absolute): no $PHOENIX_ARTIFACT_DIR may
        # override what a rollout's config override says.
        if self.artifacts_dir is not None:
            env.pop("PHOENIX_ARTIFACT_DIR", None)
        return {**env, **self.env_overrides, STUB_DIR_ENV: str(self.stub_dir)}

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def is_ready(self) -> bool:
        return self.is_running() and http_get_status(self.ready_url) == 200

    def log_tail(self, lines: int = 40) -> str:
        return read_log_tail(self.log_path, lines)

    def _failure(self, reason: str) -> TritonServerError:
        lines = self.log_tail(2000).splitlines()
        errors = [x for x in lines if _ERROR_LINE.search(x) and not _HARMLESS_ERROR.search(x)]
        errors_text = "\n".join(errors[:10]) or "(none)"
        return TritonServerError(
            f"{reason}\nerrors in the server log:\n{errors_text}\n"
            f"command: {' '.join(redact_secrets(self.last_command))}\n"
            f"server log ({self.log_path}), last lines:\n{self.log_tail()}"
        )

    def wait_ready(self, timeout: float | None = None, poll_interval: float = 0.2) -> float:
        """Seconds from start to /v2/health/ready answering 200; TritonServerError with the log's
        errors and tail when the process exits or `timeout` passes first."""
        if self.process is None or self.started_at is None:
            raise TritonServerError("wait_ready() called before start()")
        timeout = self.ready_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while http_get_status(self.ready_url) != 200:
            if (code := self.process.poll()) is not None:
                raise self._failure(f"tritonserver exited with code {code} before it was ready")
            if time.monotonic() > deadline:
                raise self._failure(f"tritonserver was not ready after {timeout:.0f} s")
            time.sleep(poll_interval)
        self.ready_after_s = time.monotonic() - self.started_at
        return self.ready_after_s

    def shared_memory_regions(self) -> list[Path]:
        """This server's shared-memory regions that exist now (one per loaded instance)."""
        return sorted(SHARED_MEMORY.glob(f"{self.shared_memory_prefix}*"))

    def _kill_group(self) -> None:
        assert self.process is not None  # started
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def _remove_leftovers(self) -> None:
        """What a server that did not unload every instance leaves: its shared-memory regions
        (a stub still running keeps its mapping) and its temporary folders."""
        for region in self.shared_memory_regions():
            with contextlib.suppress(OSError):
                region.unlink()
        self._remove_temporary_folders()

    def kill(self) -> None:
        """SIGKILL the server and its process group (its stubs) if it runs, then remove what it
        leaves behind."""
        if self.process is None:
            return
        if self.process.poll() is None:  # once reaped, its pid and group id may be reused
            self._kill_group()
        self.process.wait()
        self._remove_leftovers()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout` seconds; remove what it leaves behind; return
        the exit code."""
        if self.process is None:
            return None
        running = self.process.poll() is None
        self.process.send_signal(signal.SIGTERM)  # a no-op once it has exited
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        if running:  # stubs an exit timeout left in its group; reaped just now, its id is ours
            self._kill_group()
        self.kill()
        return self.process.returncode
