"""Writing a corpus store: new posts as fresh segments, deletions as tombstones, compaction
into sealed (indexed) segments, the time window.

Every change writes its new files first and then the next manifest generation, under the
store's lock (one writer at a time changes the manifest; slow work such as building an index
happens outside it). Files a change makes obsolete are listed as retired and deleted by a
later compaction after RETIRE_GRACE_S, since readers of the previous manifest may still be
opening them.
"""

from __future__ import annotations

import contextlib
import fcntl
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from phoenix.corpus_store.ann import choose_index
from phoenix.corpus_store.manifest import (
    EXACT,
    FRESH,
    MANIFEST_FILE,
    SEALED,
    EmbeddedBy,
    IndexSpec,
    Manifest,
    Retired,
    SegmentEntry,
    StoreError,
    read_manifest,
    write_manifest,
)
from phoenix.corpus_store.npy import load_npy
from phoenix.corpus_store.segment import (
    SEGMENTS_DIR,
    Posts,
    Segment,
    check_posts,
    find_ids,
    write_segment,
)
from phoenix.corpus_store.semantic_ids import SemanticIdSpec
from phoenix.corpus_store.snapshot import TOMBSTONES_DIR, Snapshot, read_tombstones
from phoenix.corpus_store.towers import check_tower

LOCK_FILE = "store.lock"
RETIRE_GRACE_S = 60.0


def is_mergeable(entry: SegmentEntry) -> bool:
    """Fresh segments, and sealed ones too small to have an index, are merged by compaction."""
    return entry.state == FRESH or entry.index.kind == EXACT


@dataclass(frozen=True)
class CompactReport:
    sealed: int  # fresh and small sealed segments merged into one sealed segment
    sealed_rows: int
    dropped_expired: int  # segments wholly older than the window
    purged_rows: int  # deleted or expired rows left out of the sealed segment
    removed_files: int  # retired files deleted after their grace period
    seconds: float


class CorpusStore:
    """A store directory: ``open()`` for reading, the other methods change it."""

    def __init__(self, root, clock: Callable[[], float] = time.time):
        self.root = Path(root)
        self.clock = clock

    # -- creating and reading -----------------------------------------------------------

    @classmethod
    def create(
        cls,
        root,
        emb_size: int,
        window_seconds: Optional[int] = None,
        embedded_by: Optional[EmbeddedBy] = None,
        semantic_ids: SemanticIdSpec = SemanticIdSpec(),
    ) -> CorpusStore:
        """An empty store at ``root`` (a new or empty directory) for the vectors of the
        candidate tower ``embedded_by`` (recorded in every generation from now on), its
        posts' semantic IDs of the width ``semantic_ids``."""
        root = Path(root)
        if (root / MANIFEST_FILE).exists():
            raise StoreError(f"{root / MANIFEST_FILE}: a store exists already")
        if root.exists() and any(root.iterdir()):
            raise StoreError(f"{root}: not empty; a new store needs a new or empty directory")
        root.mkdir(parents=True, exist_ok=True)
        manifest = Manifest(
            emb_size,
            window_seconds=window_seconds,
            embedded_by=embedded_by,
            semantic_ids=semantic_ids,
        )
        write_manifest(root, manifest)
        return cls(root)

    def manifest(self) -> Manifest:
        return read_manifest(self.root)

    def open(self, previous: Optional[Snapshot] = None, searchable: bool = True) -> Snapshot:
        """The current generation, every segment opened and checked (without the ANN
        indexes when not ``searchable``)."""
        return Snapshot(self.root, self.manifest(), previous, searchable)

    # -- changing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self):
        """The manifest, read under the writers' lock (held until the block ends)."""
        with open(self.root / LOCK_FILE, "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self.manifest()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def add(
        self,
        posts: Posts,
        state: str = FRESH,
        index: Optional[IndexSpec] = None,
        progress: Optional[Callable[[int], object]] = None,
        embedded_by: Optional[EmbeddedBy] = None,
    ):
        """Write ``posts`` as one new segment (rows in creation order) and publish it;
        ``progress`` is told the rows added to its index as it is built (``build_index``).
        ``embedded_by``: the tower that embedded ``posts``, refused (TowerMismatch) when the
        store records another."""
        manifest = self.manifest()
        check_tower(self.root, manifest, embedded_by)  # before the work, and again under the lock
        emb_size = manifest.emb_size
        posts = check_posts(posts, emb_size, f"new posts for {self.root}", manifest.semantic_ids)
        posts = posts.take(np.argsort(posts.created_at, kind="stable"))
        if index is None:
            index = choose_index(len(posts), emb_size) if state == SEALED else IndexSpec()
        entry = write_segment(self.root, posts, state, index, progress)
        with self._locked() as manifest:
            try:
                check_tower(self.root, manifest, embedded_by)
            except StoreError:
                shutil.rmtree(self.root / SEGMENTS_DIR / entry.name, ignore_errors=True)
                raise
            write_manifest(self.root, manifest.next(segments=(*manifest.segments, entry)))
        return entry

    def delete(self, post_ids) -> int:
        """Tombstone ``post_ids``: no reader of the next generation returns them."""
        post_ids = np.unique(np.asarray(post_ids, np.int64))
        with self._locked() as manifest:
            old = read_tombstones(self.root, manifest.tombstones)
            merged = np.union1d(old, post_ids)
            if len(merged) == len(old):
                return 0
            name = self._write_tombstones(merged, manifest.generation + 1)
            replaced = [] if manifest.tombstones is None else [manifest.tombstones]
            retired, _ = self._collect(
                self._retire(manifest, [f"{TOMBSTONES_DIR}/{r}" for r in replaced])
            )
            write_manifest(self.root, manifest.next(tombstones=name, retired=retired))
        return len(merged) - len(old)

    def set_window(self, seconds: Optional[int]) -> None:
        with self._locked() as manifest:
            write_manifest(self.root, manifest.next(window_seconds=seconds))

    def compact(self, progress: bool = False) -> CompactReport:
        """Seal: merge every fresh segment, and the sealed ones still too small for an index,
        into one sealed segment (indexed once big enough), leaving deleted and expired posts
        out; drop segments wholly outside the window; prune tombstones no segment holds;
        delete files retired long enough ago.

        Small sealed segments are merged again so that frequent compactions do not leave
        hundreds of tiny exact segments, each a step of every search."""
        started = self.clock()
        snapshot = self.open()
        cutoff = snapshot.cutoff(started)
        fresh = [
            s
            for s in snapshot.segments
            if is_mergeable(s.entry) and (cutoff is None or s.entry.max_created_at >= cutoff)
        ]
        kept, purged = self._live_posts(snapshot, fresh, cutoff)
        new_entry = None
        if kept is not None and len(kept):
            index = choose_index(len(kept), kept.embeddings.shape[1])
            if progress:
                print(f"sealing {len(kept):,} posts ({index.kind})", flush=True)
            new_entry = write_segment(self.root, kept, SEALED, index)
        merged = {s.entry.name for s in fresh}
        with self._locked() as manifest:
            expired = [
                s.name
                for s in manifest.segments
                if cutoff is not None and s.max_created_at < cutoff and s.name not in merged
            ]
            gone = merged | set(expired)
            kept_entries = [s for s in manifest.segments if s.name not in gone]
            if new_entry is not None:
                kept_entries.append(new_entry)
            # oldest posts first: score ties resolve as one scan in creation order would
            order = lambda s: (s.min_created_at, s.max_created_at)  # noqa: E731
            segments = tuple(sorted(kept_entries, key=order))
            retire = [f"{SEGMENTS_DIR}/{name}" for name in sorted(gone)]
            tombstones, old_file = self._pruned_tombstones(manifest, segments)
            if old_file is not None:
                retire.append(f"{TOMBSTONES_DIR}/{old_file}")
            retired, removed = self._collect(self._retire(manifest, retire))
            write_manifest(
                self.root,
                manifest.next(segments=segments, tombstones=tombstones, retired=retired),
            )
        return CompactReport(
            len(fresh),
            0 if new_entry is None else new_entry.rows,
            len(expired),
            purged,
            removed,
            round(self.clock() - started, 3),
        )

    # -- helpers ------------------------------------------------------------------------

    def _live_posts(self, snapshot: Snapshot, fresh: list[Segment], cutoff: Optional[int]):
        """The fresh segments' posts minus deleted and expired ones (and repeats: the newest
        copy of a post wins), and how many rows were left out."""
        if not fresh:
            return None, 0
        posts = Posts.concat((s.posts() for s in fresh), snapshot.manifest.semantic_ids)
        newest_last = np.argsort(posts.created_at, kind="stable")
        posts = posts.take(newest_last)
        _, last = np.unique(posts.post_ids[::-1], return_index=True)
        keep = np.zeros(len(posts), bool)
        keep[len(posts) - 1 - last] = True
        keep &= ~np.isin(posts.post_ids, snapshot.tombstones)
        if cutoff is not None:
            keep &= posts.created_at >= cutoff
        return posts.take(np.flatnonzero(keep)), int((~keep).sum())

    def _write_tombstones(self, ids: np.ndarray, generation: int) -> str:
        name = f"tombstones-{generation:08d}.npy"
        directory = self.root / TOMBSTONES_DIR
        directory.mkdir(exist_ok=True)
        tmp = directory / f".{name}.tmp"
        with open(tmp, "wb") as out:
            np.save(out, ids)
        tmp.replace(directory / name)
        return name

    def _pruned_tombstones(self, manifest: Manifest, segments):
        """(tombstones file, retired file) keeping only ids some live segment still holds."""
        old = read_tombstones(self.root, manifest.tombstones)
        if not len(old):
            return manifest.tombstones, None
        held = np.zeros(len(old), bool)
        for entry in segments:  # the sorted ids alone: no index is loaded under the lock
            ids = load_npy(self.root / SEGMENTS_DIR / entry.name / "sorted_ids.npy", mmap_mode="r")
            held |= find_ids(ids, old)[1]
        if held.all():
            return manifest.tombstones, None
        name = self._write_tombstones(old[held], manifest.generation + 1) if held.any() else None
        return name, manifest.tombstones

    def _retire(self, manifest: Manifest, paths: list) -> tuple[Retired, ...]:
        now = self.clock()
        return (*manifest.retired, *(Retired(p, now) for p in paths))

    def _collect(self, retired: tuple[Retired, ...]) -> tuple[tuple[Retired, ...], int]:
        """Delete retired files older than the grace period; the rest stay listed."""
        now, keep, removed = self.clock(), [], 0
        for item in retired:
            if now - item.since < RETIRE_GRACE_S:
                keep.append(item)
                continue
            path = self.root / item.path
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed += 1
        return tuple(keep), removed
