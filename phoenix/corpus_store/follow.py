"""Following a store while serving: each new manifest generation is opened beside the current
one and swapped in, so requests always see one whole generation.

Two paths notice a new generation: a background thread every POLL_SECONDS, and the request
path itself, which checks the manifest (one stat, a few microseconds) on every call. The
second is needed in Triton's Python-backend stubs: an instance that gets no request may not
run its other threads at all, and its first request must not be answered from an old
generation (seen here: a deleted post came back from the idle instance of two). It checks on
every call, not once per poll, because two instances answering one user in turn must not
differ by a poll: a deleted post, gone from one instance's answer, came back in the other's
(1 of 67 answers under load while the request path checked every 0.5 s). For the same
reason the request path waits, up to REQUEST_WAIT_S, for a refresh the background thread has
begun: a stub that went idle mid-refresh leaves that thread holding the refresh lock, and
without the wait the next requests would be answered from the generation before (a suspect,
not shown, for a deleted post that came back in 7 of 66 answers under load:
docs/design/corpus-store-following.md, "Why every request checks"). A refresh that takes
longer (a compacted segment's index being read) costs one request that wait; the requests
after it are answered from the old generation, whole, until the new one is in."""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from phoenix.corpus_store.manifest import MANIFEST_FILE, EmbeddedBy, StoreError
from phoenix.corpus_store.snapshot import Snapshot
from phoenix.corpus_store.store import CorpusStore
from phoenix.corpus_store.towers import check_tower

POLL_SECONDS = 0.5  # the background thread's; requests check on every call
REQUEST_WAIT_S = 0.25  # a request's wait for a refresh under way (a new small segment: ms)
log = logging.getLogger(__name__)


class StoreFollower:
    """The latest good generation of the store at ``root``.

    The first generation is opened in the constructor, so a bad store fails the start with
    the file and the problem. A later generation that fails to open (a torn copy, a wrong
    width, vectors of another candidate tower than ``tower``) is reported through
    ``on_error``, counted in ``skipped`` and skipped: the previous one keeps serving.
    ``tower`` None: the vectors are not compared with any user's (look-ups only).

    Every segment it opens is warmed before it serves (``Segment.warm``: its columns' pages
    in this process): the first generation in the constructor, so a server is ready only once
    its store is warm; a later one (a compacted segment) before it is swapped in.
    """

    def __init__(
        self,
        root,
        emb_size: int,
        poll_seconds: float = POLL_SECONDS,
        on_error: Callable[[str], None] = log.warning,
        searchable: bool = True,
        tower: Optional[EmbeddedBy] = None,
    ):
        self.store = CorpusStore(root)
        self.tower = tower
        self.skipped = 0  # generations not loaded, since this process started
        self._warned_unrecorded = False
        self.searchable = searchable  # False: look-ups only, no ANN index loaded
        self.poll_seconds = poll_seconds
        self.on_error = on_error
        self.emb_size = emb_size
        self._snapshot = self._opened()
        self._stamp = self._manifest_stamp()
        self._failed_stamp = None
        self._behind_since: Optional[float] = None  # when a generation not served was written
        self._refreshing = threading.Lock()
        self._refresh_count = 0  # refreshes begun: names the one under way
        self._given_up = -1  # the refresh under way a request stopped waiting for
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _opened(self, previous: Optional[Snapshot] = None) -> Snapshot:
        """The store's current generation, which must hold vectors of the model's width
        and tower (checked on the manifest, before any segment or index is opened)."""
        manifest = self.store.manifest()
        if manifest.emb_size != self.emb_size:
            raise StoreError(
                f"{self.store.root / MANIFEST_FILE}: emb_size {manifest.emb_size}, "
                f"but the model's candidate vectors have {self.emb_size}"
            )
        unchecked = check_tower(self.store.root, manifest, self.tower)
        if unchecked and not self._warned_unrecorded:
            self._warned_unrecorded = True  # once: the next generations say the same
            log.warning(unchecked)
        return Snapshot(self.store.root, manifest, previous, self.searchable, warm=True)

    def current(self) -> Snapshot:
        """The newest good generation, the manifest checked for a newer one on every call; a
        refresh under way elsewhere is waited for up to REQUEST_WAIT_S, once: the requests
        after one that gave up on it do not wait for it again."""
        refreshing = self._refresh_count  # the refresh under way, if the lock is held
        if self._refreshing.locked():
            if refreshing != self._given_up and not self._waited_for_refresh():
                self._given_up = refreshing
        else:
            self.refresh()
        return self._snapshot  # one reference read: a whole generation

    def _waited_for_refresh(self) -> bool:
        """Whether the refresh under way ended within REQUEST_WAIT_S (waiting releases the
        GIL, so a background thread held mid-refresh finishes meanwhile)."""
        if not self._refreshing.acquire(timeout=REQUEST_WAIT_S):
            return False
        self._refreshing.release()
        return True

    def start(self) -> StoreFollower:
        self._thread = threading.Thread(target=self._run, name="store-follower", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _manifest_stamp(self):
        try:
            stat = (self.store.root / MANIFEST_FILE).stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def refresh(self) -> bool:
        """Open the newest generation if the manifest changed; True when one was swapped in.
        A refresh already under way elsewhere is not waited for (``current`` may wait)."""
        if not self._refreshing.acquire(blocking=False):
            return False
        self._refresh_count += 1
        try:
            return self._refresh()
        finally:
            self._refreshing.release()

    def _refresh(self) -> bool:
        stamp = self._manifest_stamp()
        if stamp is None or stamp == self._stamp or stamp == self._failed_stamp:
            return False
        try:
            snapshot = self._opened(previous=self._snapshot)
        except (StoreError, OSError) as error:
            self._failed_stamp = stamp
            self.skipped += 1
            if self._behind_since is None:  # the manifest's write time, in epoch seconds
                self._behind_since = stamp[0] / 1e9
            self.on_error(
                f"corpus store generation not loaded, still serving the previous: {error}"
            )
            return False
        if snapshot.generation < self._snapshot.generation:
            return False
        self._snapshot, self._stamp = snapshot, stamp
        self._behind_since = None
        return True

    def lag_seconds(self, now: Optional[float] = None) -> float:
        """How long the newest generation seen has waited while an older one serves (one that
        failed to open); 0 when the newest seen is served."""
        if self._behind_since is None:
            return 0.0
        return max(0.0, (time.time() if now is None else now) - self._behind_since)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.refresh()
            except Exception as error:  # noqa: BLE001 - the thread must outlive any one failure
                self.on_error(f"corpus store follower: {error!r}")
