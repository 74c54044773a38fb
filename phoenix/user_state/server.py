"""A local ``redis-server`` (or a 3-node Redis Cluster of them) as child processes, for tests,
benchmarks and demos: free loopback ports, no persistence, a temporary directory, and they die
with the process that started them (SIGKILL on the parent's death, as tritonserver does).

    with RedisServer() as server:            # server.url: redis://127.0.0.1:<port>/0
        ...
    with RedisClusterNodes(3) as cluster:    # cluster.url: redis+cluster://<a node>; connect(url)
        ...

``redis-server`` and ``redis-cli`` come from Debian's redis-server / redis-tools packages, which
``make setup`` installs; without them ``RedisServerMissing`` says so.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from phoenix.util.processes import LOOPBACK, dying_with_us, pick_free_ports

READY_TIMEOUT_S = 10.0
CLUSTER_BUS_OFFSET = 10_000  # a cluster node also listens on its port + 10000 (Redis's rule)


class RedisServerMissing(RuntimeError):
    """redis-server or redis-cli is not installed."""


class RedisServerError(RuntimeError):
    """A local redis-server did not start, or a cluster did not form."""


def redis_binary(name: str) -> str:
    """The path of ``name`` (redis-server, redis-cli) on PATH, or RedisServerMissing."""
    path = shutil.which(name)
    if path is None:
        raise RedisServerMissing(
            f"{name} not found on PATH: run `make setup` (it installs Debian's redis-server and "
            "redis-tools), or `apt-get install redis-server`"
        )
    return path


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    for _ in range(100):
        (port,) = pick_free_ports(1)
        if port + CLUSTER_BUS_OFFSET < 65_536 and port_is_free(port + CLUSTER_BUS_OFFSET):
            return port
    raise RedisServerError("no free port pair (port, port + 10000) found for a cluster node")


def port_is_free(port: int) -> bool:
    """A server could listen on ``port`` of loopback now (as redis-server does, with
    SO_REUSEADDR: connections of a stopped one closing in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


class RedisServer:
    """One redis-server child on a free loopback port, without persistence, in a temporary
    folder removed when it stops (``phoenix.user_state.embedded`` keeps one instead)."""

    def __init__(
        self,
        *,
        cluster_node: bool = False,
        extra_args: tuple[str, ...] = (),
        port: int | None = None,  # None: a free one; a port: e.g. to restart a stopped server
        work_dir: Path | None = None,  # where its folder is made (None: the system's temp)
    ):
        self.cluster_node = cluster_node
        self.work_dir = work_dir
        self.extra_args = tuple(extra_args)
        self.requested_port = port
        self.port: int | None = None
        self.dir: Path | None = None
        self.process: subprocess.Popen | None = None
        self.pass_fds: tuple[int, ...] = ()  # descriptors redis-server inherits (a lock's)

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        assert self.dir is not None, "redis-server was not started"
        return self.dir / "redis.log"

    def persistence_args(self) -> list[str]:
        return ["--save", "", "--appendonly", "no"]  # no RDB snapshots, no append-only file

    def make_dir(self) -> Path:
        """The folder it runs in: a new temporary one in ``work_dir``. Removed by stop(); a
        parent SIGKILLed cannot remove it, so serve puts it in its build folder, beside the
        tritonserver's repository copy, rather than in the system's temp. Absolute:
        redis-server enters --dir before it opens --logfile."""
        return Path(tempfile.mkdtemp(prefix="redis-", dir=self.work_dir)).resolve()

    def remove_dir(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    def command(self) -> list[str]:
        args = [
            redis_binary("redis-server"),
            "--port", str(self.port),
            "--bind", LOOPBACK,
            "--dir", str(self.dir),
            *self.persistence_args(),
            "--logfile", str(self.log_path),
        ]  # fmt: skip
        if self.cluster_node:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        return args + list(self.extra_args)

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> RedisServer:
        """Start and wait until it answers PING; RedisServerError with its log otherwise."""
        if self.requested_port is not None:
            self.port = self.requested_port
        else:
            self.port = _free_cluster_port() if self.cluster_node else pick_free_ports(1)[0]
        self.dir = self.make_dir()
        self.process = subprocess.Popen(
            dying_with_us(self.command()),  # redis-server dies with us, as tritonserver does
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the parent only
            pass_fds=self.pass_fds,
        )
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        # no retries of its own: redis-py's default backs off for seconds on a refused connection
        assert self.process is not None and self.port is not None  # set by start()
        client = redis.Redis(host=LOOPBACK, port=self.port, socket_connect_timeout=0.2,
                             socket_timeout=0.5, retry=Retry(NoBackoff(), 0))  # fmt: skip
        deadline = time.monotonic() + timeout_s
        with contextlib.closing(client):
            while True:
                with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                    if client.ping():
                        return
                if (code := self.process.poll()) is not None:
                    raise self._failure(f"redis-server exited with code {code}")
                if time.monotonic() > deadline:
                    raise self._failure(
                        f"redis-server did not answer PING within {timeout_s:.0f} s"
                    )
                time.sleep(0.02)

    def _failure(self, reason: str) -> RedisServerError:
        assert self.process is not None and self.process.stderr is not None  # start()'s PIPE
        stderr = (
            self.process.stderr.read().decode(errors="replace")
            if self.process.poll() is not None
            else ""
        )
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.is_file() else ""
        command = " ".join(self.command())  # before stop(), which forgets the folder
        self.stop()
        return RedisServerError(f"{reason}\ncommand: {command}\n{stderr}{log}")

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM (redis-server's clean shutdown), SIGKILL after ``timeout_s``; removes its
        directory (``remove_dir``)."""
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.process.stderr is not None:  # start()'s PIPE
                self.process.stderr.close()
            self.process = None
        if self.dir is not None:
            self.remove_dir(self.dir)
            self.dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class RedisClusterNodes:
    """``count`` cluster-enabled redis-servers joined into one cluster, no replicas."""

    def __init__(self, count: int = 3):
        if count < 3:
            raise ValueError("a Redis Cluster needs at least 3 masters")
        self.nodes = [RedisServer(cluster_node=True) for _ in range(count)]

    @property
    def url(self) -> str:
        """Its first node under the cluster scheme (phoenix.user_state.client)."""
        return f"redis+cluster://{LOOPBACK}:{self.nodes[0].port}"

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> RedisClusterNodes:
        try:
            for node in self.nodes:
                node.start(timeout_s)
            self._create(timeout_s)
            self._wait_ok(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self, timeout_s: float) -> None:
        addresses = [f"{LOOPBACK}:{node.port}" for node in self.nodes]
        command = [redis_binary("redis-cli"), "--cluster", "create", *addresses,
                   "--cluster-replicas", "0", "--cluster-yes"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s * 3)
        if done.returncode != 0:
            raise RedisServerError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")

    def _wait_ok(self, timeout_s: float) -> None:
        """Until every node says cluster_state:ok (slots assigned, nodes agree)."""
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            assert node.port is not None  # started
            client = redis.Redis(host=LOOPBACK, port=node.port, socket_timeout=0.5)
            with contextlib.closing(client):
                while client.cluster("info").get("cluster_state") != "ok":
                    if time.monotonic() > deadline:
                        raise RedisServerError(
                            f"cluster node {node.url} not ok after {timeout_s} s"
                        )
                    time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> RedisClusterNodes:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
