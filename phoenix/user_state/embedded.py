"""The user-state store `phoenix-serve` starts when no URL names one: a local redis-server whose
data lives in a folder that outlives it (docs/user-state.md, "The store serve starts").

    with EmbeddedStore(Path("build/serve/user-state"), port=8004) as store:
        store.url    # redis://127.0.0.1:8004/0
        ...

The folder holds redis-server's append-only file (``appendonlydir/``), its log, and three
files of ours:

- ``owner.lock``: locked (flock) by the process that started the store, for its life: a second
  serve on the same folder is refused, naming the first, instead of writing beside it;
- ``store.lock``: locked by the redis-server process itself (it inherits the locked
  descriptor), for its life: a store left running by an owner that was SIGKILLed is found and
  shut down cleanly (SIGTERM: it writes and syncs what it holds) before a new one starts on
  the folder, so two redis-servers never append to one file;
- ``store.json``: the last store's pid, port, URL and fsync policy, for those messages and so
  that a restart takes the same port again when it is free.

Every write is appended to the file before its reply is sent (``appendonly yes``), so what a
client was told is written survives a SIGKILL of redis-server and of serve; ``appendfsync`` says
when the file reaches the disk, what survives a machine's crash or power loss
(``FSYNC_POLICIES``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phoenix.user_state.server import RedisServer, RedisServerError, port_is_free
from phoenix.util.processes import LOOPBACK, pick_free_ports

# appendfsync: when the append-only file reaches the disk. Under every policy redis-server writes
# a command to the file (the kernel's page cache) before it sends the reply, so what a client was
# told is written survives a SIGKILL of redis-server; except under "everysec" while the previous
# second's sync still runs (a slow or busy disk): then it holds the write back, up to 2 s, and
# sends the replies before it. "no" is the default: the SIGKILL guarantee at no measured cost;
# "always" makes every write, and every command queued behind it, wait for the disk
# (docs/user-state.md, "The store serve starts", has the figures).
FSYNC_POLICIES = {  # what each loses, for help texts
    "always": "nothing lost; each write waits for the disk",
    "everysec": "a crash loses up to about 2 s, a SIGKILL the writes made while a sync runs long",
    "no": "a SIGKILL loses nothing, a crash up to about 30 s",
}
DEFAULT_FSYNC = "no"
OWNER_LOCK, STORE_LOCK, STATE_FILE = "owner.lock", "store.lock", "store.json"
# A store loads its append-only file before it answers: 17 MB took 0.8-3.0 s on a busy 2-core
# machine (bench/bench_store_persistence.py); a bound for a few GB.
LOAD_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 30.0  # a clean shutdown syncs the file; never SIGKILL a store that is syncing
PREVIOUS_STOP_TIMEOUT_S = 30.0


class StoreFolderBusy(RedisServerError):
    """The folder is in use by a store another running process owns."""


@dataclass(frozen=True)
class StoreState:
    """``store.json``: the folder's last store (its redis-server may be gone)."""

    pid: int
    port: int
    url: str
    owner_pid: int
    appendfsync: str

    @classmethod
    def read(cls, folder: Path) -> StoreState | None:
        try:
            fields = json.loads((folder / STATE_FILE).read_text())
            return cls(**{name: fields[name] for name in cls.__dataclass_fields__})
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, folder: Path) -> None:
        partial = folder / f".{STATE_FILE}.{os.getpid()}"
        partial.write_text(json.dumps(self.__dict__, indent=1) + "\n")
        os.replace(partial, folder / STATE_FILE)


class PersistentRedisServer(RedisServer):
    """A redis-server on ``folder`` (kept when it stops) with an append-only file."""

    def __init__(self, folder: Path, *, port: int, appendfsync: str, lock_fd: int):
        super().__init__(port=port)
        self.folder, self.appendfsync = folder, appendfsync
        self.pass_fds = (lock_fd,)

    def make_dir(self) -> Path:
        return self.folder

    def remove_dir(self, folder: Path) -> None:
        pass  # the data stays

    def persistence_args(self) -> list[str]:
        return [
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",  # no RDB snapshots beside the append-only file
        ]  # fmt: skip


def _lock(path: Path) -> int | None:
    """A descriptor of ``path`` locked (flock, exclusive) by us, or None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


def _lock_within(path: Path, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while (fd := _lock(path)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return fd


def _runs_in(pid: int, folder: Path) -> bool:
    """Whether ``pid`` is a redis-server working in ``folder`` (it enters its --dir; it renames
    its command line, so that is not read)."""
    try:
        executable = Path(os.readlink(f"/proc/{pid}/exe")).name
        return executable.startswith("redis") and Path(os.readlink(f"/proc/{pid}/cwd")) == folder
    except OSError:
        return False


class EmbeddedStore:
    """The store of ``folder`` started for the block (``start``/``stop``): ``port`` 0 takes the
    folder's last port when it is free, else any free one. ``say`` gets a line about what was
    found (a previous store shut down)."""

    def __init__(
        self,
        folder: Path,
        *,
        port: int = 0,
        appendfsync: str = DEFAULT_FSYNC,
        say: Callable[[str], None] = lambda line: None,
    ):
        if appendfsync not in FSYNC_POLICIES:
            raise ValueError(f"appendfsync {appendfsync!r}: expected one of {list(FSYNC_POLICIES)}")
        self.folder = Path(folder).absolute()
        self.requested_port, self.appendfsync, self.say = port, appendfsync, say
        self.server: PersistentRedisServer | None = None
        self._owner_fd: int | None = None

    @property
    def url(self) -> str:
        if self.server is None:
            raise RuntimeError("the store is not started")
        return self.server.url

    @property
    def pid(self) -> int:
        if self.server is None or self.server.process is None:
            raise RuntimeError("the store is not started")
        return self.server.process.pid

    def start(self) -> EmbeddedStore:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RedisServerError(f"cannot make the store folder {self.folder}: {error}") from None
        self.folder = self.folder.resolve()
        self._owner_fd = _lock(self.folder / OWNER_LOCK)
        if self._owner_fd is None:
            raise self._busy()
        try:
            store_fd = self._take_over()
            try:
                self._start_server(store_fd)
            finally:
                os.close(store_fd)  # redis-server holds its own copy, and the lock with it
        except BaseException:
            self.stop()
            raise
        return self

    def _busy(self) -> StoreFolderBusy:
        last = StoreState.read(self.folder)
        whose = f"phoenix-serve pid {last.owner_pid}, its store at {last.url}" if last else "?"
        return StoreFolderBusy(
            f"the user-state store folder {self.folder} is in use by a running server ({whose}): "
            "stop that server, or give this one another --store-dir, --redis URL to share that "
            "store, or --ephemeral-store"
        )

    def _take_over(self) -> int:
        """The folder's store lock, once no redis-server holds it: one left running by a killed
        owner is shut down cleanly (SIGTERM) first."""
        store_lock = self.folder / STORE_LOCK
        if (fd := _lock(store_lock)) is not None:
            return fd
        last = StoreState.read(self.folder)
        if last is not None and _runs_in(last.pid, self.folder):
            self.say(
                f"user state: the store a stopped server left running on {self.folder} (pid "
                f"{last.pid}, {last.url}) is shut down cleanly, its data kept, and started again"
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(last.pid, signal.SIGTERM)
            fd = _lock_within(store_lock, PREVIOUS_STOP_TIMEOUT_S)
        else:  # a store's child (an append-only file rewrite) may hold it a moment longer
            fd = _lock_within(store_lock, 5.0)
        if fd is None:
            raise RedisServerError(
                f"a process still holds {store_lock} (a redis-server of an earlier run on this "
                f"folder; `fuser -v {store_lock}` names it): stop it, then start again"
            )
        return fd

    def _port(self) -> int:
        if self.requested_port:
            if not port_is_free(self.requested_port):
                raise RedisServerError(
                    f"--store-port {self.requested_port} on {LOOPBACK} is not free: pick "
                    "another, or 0 for any free one"
                )
            return self.requested_port
        last = StoreState.read(self.folder)
        if last is not None and port_is_free(last.port):
            return last.port
        return pick_free_ports(1)[0]

    def _start_server(self, store_fd: int) -> None:
        aof = self.folder / "appendonlydir"
        if (size := sum(f.stat().st_size for f in aof.iterdir()) if aof.is_dir() else 0) > 1e8:
            self.say(f"user state: loading {size / 1e6:,.0f} MB of {self.folder}")
        self.server = PersistentRedisServer(
            self.folder, port=self._port(), appendfsync=self.appendfsync, lock_fd=store_fd
        )
        self.server.start(LOAD_TIMEOUT_S)
        StoreState(self.pid, self.server.port or 0, self.url, os.getpid(), self.appendfsync).write(
            self.folder
        )

    def stop(self) -> None:
        """redis-server shut down cleanly (it syncs its file), the folder's lock released."""
        if self.server is not None:
            self.server.stop(STOP_TIMEOUT_S)
            self.server = None
        if self._owner_fd is not None:
            os.close(self._owner_fd)
            self._owner_fd = None

    def __enter__(self) -> EmbeddedStore:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass(frozen=True)
class StoreChoice:
    """The store a serve process uses: its URL, and the folder of the embedded one (None when
    the store was named, or is the throwaway one)."""

    url: str
    folder: Path | None = None
    appendfsync: str | None = None
    named: bool = False  # given by --redis or the environment


@contextlib.contextmanager
def serve_store(
    url: str | None,
    folder: Path | None,
    *,
    port: int = 0,
    appendfsync: str = DEFAULT_FSYNC,
    ephemeral_work_dir: Path | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Iterator[StoreChoice]:
    """The store for the block: ``url`` when given (nothing started); else the embedded store
    of ``folder``; else (``folder`` None) an empty one without persistence in a temporary
    folder of ``ephemeral_work_dir``, removed when it stops."""
    if url:
        yield StoreChoice(url, named=True)
    elif folder is not None:
        with EmbeddedStore(folder, port=port, appendfsync=appendfsync, say=say) as store:
            yield StoreChoice(store.url, store.folder, appendfsync)
    else:
        with RedisServer(work_dir=ephemeral_work_dir, port=port or None) as server:
            yield StoreChoice(server.url)
