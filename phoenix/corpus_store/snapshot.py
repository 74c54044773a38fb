"""A consistent view of a store (one manifest generation) and top-k search over it.

Search merges, per user, the best rows of every live segment: exact scores of small segments,
the ANN index's of sealed ones. Deleted posts (tombstones), posts older than the window and the
user's own excluded posts are never returned; results are sorted by score, best first.

Shape glossary
  B  users in a call   D  emb_size   k  results wanted per user   n  rows of a segment
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import numpy as np

from phoenix.corpus_store import score_keys
from phoenix.corpus_store.ann import scores_of_rows, search_index
from phoenix.corpus_store.manifest import Manifest, StoreError
from phoenix.corpus_store.npy import load_npy
from phoenix.corpus_store.segment import Segment, find_ids, is_in_sorted

TOMBSTONES_DIR = "tombstones"
NO_SCORE = -np.inf

# A search of many users runs in parts of at least USERS_PER_THREAD users, at most one per core,
# each on its own thread with Faiss on one thread (the first on the calling thread, the others
# on CORES - 1 search threads): Faiss' scan already ran on every core, but
# the work around it (choosing the lists, re-scoring, merging: a third of the time) ran on the
# calling thread alone. 16 users a call, 2 cores: 10 M posts 937-950 -> 1,074-1,083 queries/s
# (docs/retrieval.md). Served retrievers (at most 8 users a batch, contracts.RETRIEVER) never
# split: on a machine whose cores the other models keep busy there is no idle core to gain.
USERS_PER_THREAD = 8
SEARCH_THREADS_ENV = "PHOENIX_SEARCH_THREADS"  # overrides the cores counted (e.g. a CPU quota)


def _cores() -> int:
    if os.environ.get(SEARCH_THREADS_ENV):
        value = os.environ[SEARCH_THREADS_ENV]
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"${SEARCH_THREADS_ENV} must be a whole number >= 1, got {value!r}")
        return int(value)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


CORES = _cores()
_threads: Optional[ThreadPoolExecutor] = None
_threads_lock = threading.Lock()


def _forget_threads() -> None:
    """In a forked child: the parent's threads do not exist there; make new ones on use."""
    global _threads, _threads_lock
    _threads, _threads_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads)


def search_threads() -> ThreadPoolExecutor:
    """The process' search threads (made on first use), one fewer than CORES (a split call's
    first part runs on the calling thread), Faiss on one thread in each (an OpenMP setting of
    the thread that makes it)."""
    global _threads
    with _threads_lock:
        if _threads is None:
            import faiss

            _threads = ThreadPoolExecutor(
                max(1, CORES - 1), "store-search", initializer=lambda: faiss.omp_set_num_threads(1)
            )
        return _threads


@contextlib.contextmanager
def faiss_on_one_thread():
    """Faiss on one thread in the calling thread (an OpenMP setting of each thread) while the
    block runs, as on the search threads; its own setting after."""
    import faiss

    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def joined(parts: Sequence[Hits]) -> Hits:
    """One Hits of the users of ``parts``, in order."""
    return Hits(*([row for part in parts for row in getattr(part, f.name)] for f in fields(Hits)))


@dataclass(frozen=True)
class Hits:
    """Per user: the best posts, best first (rows may hold fewer than k)."""

    post_ids: list[np.ndarray]  # B arrays of int64 [<= k]
    author_ids: list[np.ndarray]
    created_at: list[np.ndarray]
    scores: list[np.ndarray]  # float32


def read_tombstones(root: Path, name: Optional[str]) -> np.ndarray:
    """The deleted post ids (sorted int64) the manifest names, or none."""
    if name is None:
        return np.zeros(0, np.int64)
    path = Path(root) / TOMBSTONES_DIR / name
    try:
        ids = load_npy(path)
    except FileNotFoundError:
        raise StoreError(f"{path}: not found (the manifest names it as the tombstones)") from None
    except (OSError, ValueError) as error:
        raise StoreError(f"{path}: not a readable .npy file ({error})") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise StoreError(f"{path}: {ids.dtype} {ids.shape}, expected int64 (t,)")
    return np.unique(ids.astype(np.int64))


class Snapshot:
    """One generation of a store, its segments open (reused from ``previous`` when unchanged,
    so following a store reopens only new segments). Not ``searchable``: for look-ups only,
    no ANN index is loaded. ``warm``: the segments it opens are warmed (``Segment.warm``)."""

    def __init__(
        self,
        root: Path,
        manifest: Manifest,
        previous: Optional[Snapshot] = None,
        searchable: bool = True,
        warm: bool = False,
    ):
        self.root = Path(root)
        self.manifest = manifest
        self.searchable = searchable
        reuse = {} if previous is None else {s.entry: s for s in previous.segments}
        self.segments: list[Segment] = [
            reuse[entry] if entry in reuse else self._opened(entry, warm)
            for entry in manifest.segments
        ]
        self.tombstones = read_tombstones(self.root, manifest.tombstones)  # int64 [t]
        self._deleted_rows = [segment.rows_of(self.tombstones) for segment in self.segments]

    def _opened(self, entry, warm: bool) -> Segment:
        """The segment of ``entry`` opened, warmed first if asked (before any request sees it)."""
        manifest = self.manifest
        segment = Segment(
            self.root, entry, manifest.emb_size, self.searchable, manifest.semantic_ids
        )
        if warm:
            segment.warm()
        return segment

    @property
    def generation(self) -> int:
        return self.manifest.generation

    def __len__(self) -> int:
        return self.manifest.rows

    def cutoff(self, now: float) -> Optional[int]:
        """Posts created before this are outside the window (None: no window)."""
        window = self.manifest.window_seconds
        return None if window is None else int(np.ceil(now - window))

    def live_rows(self, index: int, cutoff: Optional[int]) -> tuple[int, np.ndarray]:
        """(first row inside the window, deleted rows) of segment ``index``: rows are sorted by
        creation time, so the expired ones are a prefix."""
        segment = self.segments[index]
        first = 0 if cutoff is None else int(np.searchsorted(segment.created_at, cutoff))
        return first, self._deleted_rows[index]

    def lookup(self, post_ids: np.ndarray):
        """(author ids, creation times, found) of ``post_ids`` (any shape) among the posts
        not deleted, the window aside."""
        post_ids = np.asarray(post_ids, np.int64)
        authors = np.zeros(post_ids.shape, np.int64)
        created = np.zeros(post_ids.shape, np.int64)
        found = np.zeros(post_ids.shape, bool)
        dead = np.isin(post_ids, self.tombstones)
        for segment in self.segments:
            pos, held = find_ids(segment.sorted_ids, post_ids)
            hit = held & ~found & ~dead  # the first segment holding a post answers for it
            rows = segment.id_order[pos[hit]]
            authors[hit], created[hit] = segment.author_ids[rows], segment.created_at[rows]
            found |= hit
        return authors, created, found

    def semantic_ids(self, post_ids: np.ndarray) -> np.ndarray:
        """int32 [..., L]: the semantic IDs of ``post_ids`` (any shape) among the posts not
        deleted, the window aside; zeros for a post the store does not hold or holds without
        one. A post stored twice (ingested again) answers from the segment listed last: the
        newest write until a compaction re-sorts the segments."""
        post_ids = np.asarray(post_ids, np.int64)
        out = np.zeros(post_ids.shape + (self.manifest.semantic_ids.levels,), np.int32)
        found = np.zeros(post_ids.shape, bool)
        dead = np.isin(post_ids, self.tombstones)
        for segment in reversed(self.segments):
            pos, held = find_ids(segment.sorted_ids, post_ids)
            hit = held & ~found & ~dead  # the last segment holding a post answers for it
            if segment.semantic_ids is not None and hit.any():
                out[hit] = segment.semantic_ids[segment.id_order[pos[hit]]]
            found |= hit
        return out

    def search(
        self,
        users: np.ndarray,
        k: int,
        excluded: Optional[Sequence[np.ndarray]] = None,
        now: Optional[float] = None,
    ) -> Hits:
        """The ``k`` best live posts for each user [B, D], minus ``excluded`` (post ids per
        user), merged across segments and sorted by score; the window ends at ``now`` (unix
        seconds, default: the clock).

        A call of at least 2 x ``USERS_PER_THREAD`` users is split over the machine's cores:
        the calling thread searches the first part, ``search_threads`` the others."""
        if not self.searchable:
            raise StoreError(f"{self.root}: opened for look-ups only (searchable=False)")
        now = time.time() if now is None else now
        users = np.ascontiguousarray(users, np.float32)
        batch = users.shape[0]
        excluded = [np.zeros(0, np.int64)] * batch if excluded is None else list(excluded)
        live = self._live_segments(now)
        # per live segment, per user: the rows excluded there
        rows = [[self.segments[i].rows_of(ids) for ids in excluded]
                for i, _, _ in live]  # fmt: skip
        # An index is asked for k plus the most rows a user of the call excludes there: the
        # whole call's in every part, so that the parts answer as the whole call would.
        extras = [max((len(r) for r in per_user), default=0) for per_user in rows]
        parts = min(CORES, batch // USERS_PER_THREAD)
        if parts < 2:
            return self._search(users, k, live, rows, extras)
        first, *others = np.array_split(np.arange(batch), parts)

        def search_part(part: np.ndarray) -> Hits:
            return self._search(users[part], k, live, [[r[b] for b in part] for r in rows], extras)

        found = [search_threads().submit(search_part, part) for part in others]
        with faiss_on_one_thread():  # the calling thread searches a part too, not only waits
            hits = search_part(first)
        return joined([hits, *(part.result() for part in found)])

    def _live_segments(self, now: float) -> list[tuple[int, int, np.ndarray]]:
        """(index, first live row, deleted rows) of each segment holding a live row at
        ``now``."""
        cutoff = self.cutoff(now)
        live = []
        for index, segment in enumerate(self.segments):
            if cutoff is not None and segment.entry.max_created_at < cutoff:
                continue  # wholly expired: compaction drops it
            first, deleted = self.live_rows(index, cutoff)
            if first < len(segment):
                live.append((index, first, deleted))
        return live

    def _search(self, users: np.ndarray, k: int, live: list, excluded_rows: list, extras: list):
        """The ``k`` best for ``users`` in the ``live`` segments (``_live_segments``), each
        user's ``excluded_rows`` (per live segment, per user) left out, an index asked for k
        plus that segment's ``extras``."""
        found = []  # per segment searched: (segment, rows [B, k'], scores [B, k'])
        for (index, first, deleted), user_rows, extra in zip(live, excluded_rows, extras):
            segment = self.segments[index]
            if segment.index is None:
                scores, rows = exact_top_k(segment, users, k, first, deleted, user_rows)
            else:
                scores, rows = ann_top_k(segment, users, k, first, deleted, user_rows, extra)
            found.append((index, rows, scores))
        return self._merge(found, users.shape[0], k)

    def _merge(self, found: list[tuple], batch: int, k: int) -> Hits:
        """Every user's ``k`` best across the segments' parts, as array operations over the
        whole batch (not a loop over the users)."""
        if not found:
            none = lambda dtype: [np.zeros(0, dtype) for _ in range(batch)]  # noqa: E731
            return Hits(none(np.int64), none(np.int64), none(np.int64), none(np.float32))
        segment_of, rows, scores = best_first(found)  # [B, m] each
        live = scores > NO_SCORE
        searched = [index for index, _, _ in found]
        post_ids = self._gather("post_ids", searched, segment_of, rows)  # [B, m]
        if len(found) > 1:  # a post ingested again lives in two segments until compaction
            live &= first_of_each(np.where(live, post_ids, 0))
        keep = live & (np.cumsum(live, axis=1) <= k)  # [B, m]
        counts = keep.sum(axis=1)  # [B]
        ends = np.cumsum(counts).tolist()  # [B], where each user's hits end
        segment_of, rows = segment_of[keep], rows[keep]  # flat, user after user

        def per_user(flat: np.ndarray) -> list[np.ndarray]:
            if batch and (counts == counts[0]).all():  # usually: k hits for every user
                return list(flat.reshape(batch, -1))
            return [flat[start:end] for start, end in zip([0, *ends[:-1]], ends)]

        return Hits(
            per_user(post_ids[keep]),
            per_user(self._gather("author_ids", searched, segment_of, rows)),
            per_user(self._gather("created_at", searched, segment_of, rows)),
            per_user(scores[keep]),
        )

    def _gather(
        self, column: str, searched: list[int], segment_of: np.ndarray, rows: np.ndarray
    ) -> np.ndarray:
        """``column`` (int64) of each (segment, row) pair (arrays of any one shape), the
        segments among ``searched``."""
        if len(searched) == 1:  # the usual case: one sealed segment holds every hit
            return np.asarray(getattr(self.segments[searched[0]], column)[rows], np.int64)
        out = np.zeros(rows.shape, np.int64)
        for index in searched:
            here = segment_of == index
            out[here] = getattr(self.segments[index], column)[rows[here]]
        return out


def best_first(found: list[tuple]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment_of, rows, scores) [B, m] of the segments' parts ``found`` ((segment, rows
    [B, m'], scores [B, m']) each), every user's best first, ties in segment then row order
    (among the rows each segment kept: at its own cut, which of equal scores it keeps is the
    partition's choice); the parts' dead rows (score -inf) last, in no promised order."""
    if len(found) == 1:  # the usual case, one sealed segment: one sort of packed keys
        index, rows, scores = found[0]
        keys = score_keys.pack(-np.asarray(scores, np.float32), rows)  # ascending: best first
        negated, rows = score_keys.unpack(np.sort(keys, axis=1))
        return np.full(rows.shape, index), rows, -negated
    segment_of = np.concatenate([np.full(r.shape, i) for i, r, _ in found], axis=1)  # [B, m]
    rows = np.concatenate([r for _, r, _ in found], axis=1).astype(np.int64)  # [B, m]
    scores = np.concatenate([s for _, _, s in found], axis=1).astype(np.float32)  # [B, m]
    order = np.lexsort((rows, segment_of, -scores), axis=1)
    segment_of, rows, scores = (np.take_along_axis(c, order, 1) for c in (segment_of, rows, scores))
    return segment_of, rows, scores


def first_of_each(post_ids: np.ndarray) -> np.ndarray:
    """[B, m] bool: True at each row's first occurrence of every post id > 0 (the best, as the
    row is sorted best first), False at later copies; ids <= 0 are left True."""
    order = np.argsort(post_ids, axis=1, kind="stable")  # copies side by side, first one first
    ids = np.take_along_axis(post_ids, order, 1)
    copy = np.zeros(ids.shape, bool)
    copy[:, 1:] = (ids[:, 1:] == ids[:, :-1]) & (ids[:, 1:] > 0)
    first = np.ones(ids.shape, bool)
    np.put_along_axis(first, order, ~copy, 1)
    return first


def exact_top_k(segment: Segment, users, k, first, deleted, user_rows):
    """Every live row scored: (scores [B, k'], rows [B, k']), -inf where fewer qualify."""
    emb = segment.embeddings[first:]  # [n', D], the rows inside the window
    scores = users @ emb.T  # [B, n']
    if len(deleted):
        scores[:, deleted[deleted >= first] - first] = NO_SCORE
    for b, rows in enumerate(user_rows):
        scores[b, rows[rows >= first] - first] = NO_SCORE
    top = top_k_columns(scores, min(k, scores.shape[1]))  # [B, k'] unordered
    return np.take_along_axis(scores, top, axis=1), top + first


def top_k_columns(scores: np.ndarray, k: int, bin_size: int = 128) -> np.ndarray:
    """Columns of the k largest scores per row [B, n] (unordered), in two passes: the k bins
    of ``bin_size`` columns with the highest maxima hold every one of the k largest, so only
    they are partitioned (one argpartition over n columns per row cost 5x more at 100 k)."""
    batch, n = scores.shape
    bins = n // bin_size
    if bins <= k:
        return np.argpartition(scores, n - k, axis=1)[:, n - k :]
    whole = scores[:, : bins * bin_size].reshape(batch, bins, bin_size)  # [B, b, bin]
    best_bins = np.argpartition(whole.max(axis=2), bins - k, axis=1)[:, bins - k :]  # [B, k]
    columns = best_bins[:, :, None] * bin_size + np.arange(bin_size)  # [B, k, bin]
    columns = columns.reshape(batch, -1)
    if bins * bin_size < n:  # the rows past the last whole bin are always candidates
        tail = np.broadcast_to(np.arange(bins * bin_size, n), (batch, n - bins * bin_size))
        columns = np.concatenate([columns, tail], axis=1)
    picked = np.take_along_axis(scores, columns, axis=1)  # [B, c]
    keep = np.argpartition(picked, picked.shape[1] - k, axis=1)[:, picked.shape[1] - k :]
    return np.take_along_axis(columns, keep, axis=1)


def ann_top_k(segment: Segment, users, k, first, deleted, user_rows, extra: int):
    """The segment's IVF index, asked for k plus ``extra`` (the most rows any user of the call
    excludes there), times the spec's ``rerank``, those re-scored exactly in float32, with
    deleted and expired rows filtered inside the scan (a Faiss ID selector)."""
    import faiss

    spec = segment.entry.index
    want = min(len(segment), k + extra)
    alive: list[faiss.IDSelector] = []  # every selector stays referenced while Faiss reads it
    if first > 0:  # rows before ``first`` are older than the window
        alive.append(faiss.IDSelectorRange(first, len(segment)))
    if len(deleted):
        batch = faiss.IDSelectorBatch(np.ascontiguousarray(deleted, np.int64))
        alive += [batch, faiss.IDSelectorNot(batch)]
    if first > 0 and len(deleted):
        alive.append(faiss.IDSelectorAnd(alive[0], alive[-1]))
    asked = min(len(segment), want * max(1, spec.rerank))
    selector = alive[-1] if alive else None
    columns = segment.centroid_columns
    scores, rows = search_index(segment.index, spec, users, asked, selector, columns)
    if spec.rerank:
        scores, rows = rescore_exactly(segment, users, rows, want, spec.spilled)
    scores = np.where(rows >= 0, scores, NO_SCORE)
    for b, excluded in enumerate(user_rows):
        if len(excluded):
            scores[b, is_in_sorted(np.sort(excluded), rows[b])] = NO_SCORE
    return scores, rows


def rescore_exactly(segment: Segment, users, rows, want: int, repeats: bool = False):
    """The ``want`` best (in no order) of the index's candidate ``rows`` [B, c] (-1: none) by
    exact float32 score: the codes order near-ties wrongly, the float vectors are at hand
    (mapped). ``repeats``: a row may come twice (a spilled index, two lists a post), kept once.

    Chosen as packed (score, row) keys (``score_keys``): 8 users' 1,000 candidates a call,
    the choice took 30 µs a user against 56 by index partitions and a de-duplicating sort."""
    scores = scores_of_rows(segment.embeddings, users, rows)  # [B, c]
    keys = score_keys.pack(scores, rows)  # [B, c]
    if repeats:  # both copies of a row score alike: equal keys
        return score_keys.unpack(score_keys.best_distinct_keys(keys, want))
    return score_keys.unpack(score_keys.best_keys(keys, want))
