"""One immutable segment of a corpus store: its posts, memory-mapped (the instances of one
server share one copy through the page cache), and its ANN index when it has one (loaded).

Shape glossary
  n  rows of the segment   D  emb_size   L  semantic ID levels
"""

from __future__ import annotations

import mmap
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from phoenix.checkpoint.corpus import check_corpus
from phoenix.config import ArtifactError
from phoenix.corpus_store.ann import build_index, centroid_columns, read_index, write_index
from phoenix.corpus_store.manifest import (
    EXACT,
    FRESH,
    SEALED,
    IndexSpec,
    SegmentEntry,
    StoreError,
)
from phoenix.corpus_store.npy import load_npy
from phoenix.corpus_store.score_keys import MAX_ROWS
from phoenix.corpus_store.semantic_ids import FILE_DTYPE, SemanticIdSpec

SEGMENTS_DIR = "segments"
COLUMNS = ("post_ids", "author_ids", "created_at", "embeddings", "sorted_ids", "id_order")
SEMANTIC_IDS = "semantic_ids"  # a column of the segments that hold semantic IDs
# What a reader that only looks posts up (``Snapshot.lookup``, the tombstones' rows) reads
LOOKUP_COLUMNS = ("author_ids", "created_at", "sorted_ids", "id_order")


@dataclass(frozen=True)
class Posts:
    """Posts to store: ids, authors, creation times, their candidate-tower vectors and, where
    known, their semantic IDs."""

    post_ids: np.ndarray  # int64 [n], unique, > 0
    author_ids: np.ndarray  # int64 [n]
    created_at: np.ndarray  # int64 [n], unix seconds
    embeddings: np.ndarray  # float32 [n, D], unit rows
    semantic_ids: Optional[np.ndarray] = None  # int32 [n, L] codes, 0: none (None: none known)

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def take(self, rows) -> Posts:
        sids = None if self.semantic_ids is None else self.semantic_ids[rows]
        ids, authors, created, vectors = (column[rows] for column in self.columns())
        return Posts(ids, authors, created, vectors, sids)

    def columns(self) -> tuple[np.ndarray, ...]:
        """The columns every segment has, as ``COLUMNS`` names the first four."""
        return self.post_ids, self.author_ids, self.created_at, self.embeddings

    @staticmethod
    def concat(parts, sids: SemanticIdSpec = SemanticIdSpec()) -> Posts:
        """The posts of ``parts`` in order; semantic IDs where any part has them (the others'
        rows all zeros, of ``sids``' width)."""
        parts = list(parts)
        ids, authors, created, vectors = (
            np.concatenate(c) for c in zip(*(p.columns() for p in parts))
        )
        if all(p.semantic_ids is None for p in parts):
            return Posts(ids, authors, created, vectors)
        codes = [sids.zeros(len(p)) if p.semantic_ids is None else p.semantic_ids for p in parts]
        return Posts(ids, authors, created, vectors, np.concatenate(codes))


def check_posts(
    posts: Posts, emb_size: int, where: str, sids: SemanticIdSpec = SemanticIdSpec()
) -> Posts:
    """``posts`` as the store keeps them, checked as a corpus file's columns are (unique ids
    > 0, int64 columns, unit vectors of ``emb_size``) and their semantic IDs against ``sids``,
    or StoreError naming ``where``."""
    arrays = {
        "post_ids": np.asarray(posts.post_ids),
        "candidate_representations": np.asarray(posts.embeddings),
        "author_ids": np.asarray(posts.author_ids),
        "created_at": np.asarray(posts.created_at),
    }
    try:
        corpus = check_corpus(arrays, emb_size, where)
    except ArtifactError as error:
        raise StoreError(str(error)) from None
    embeddings = np.ascontiguousarray(corpus.embeddings, np.float32)
    assert corpus.created_at is not None  # in ``arrays``: check_corpus keeps it
    codes = None
    if posts.semantic_ids is not None:
        try:
            codes = sids.check(posts.semantic_ids, len(corpus.post_ids), where)
        except ValueError as error:
            raise StoreError(str(error)) from None
    return Posts(corpus.post_ids, corpus.author_ids, corpus.created_at, embeddings, codes)


def touch_pages(array: np.ndarray) -> int:
    """Read one byte of every page of ``array`` (a memory map), so that every page is in this
    process's page tables, read from disk first where the page cache no longer held it; the
    bytes of ``array``. A search gathers rows from all over a large segment: untouched, each
    of its pages costs a fault the first time (a disk read if dropped), and a server's first
    minute over a 10 M store was spent so (docs/design/corpus-store-following.md, "Why
    warm")."""
    data = np.asarray(array).reshape(-1).view(np.uint8)
    if data.size:
        data[:: mmap.PAGESIZE].max()
    return int(data.nbytes)


def find_ids(sorted_ids: np.ndarray, post_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``sorted_ids`` [...], found [...] bool) of ``post_ids`` (any shape)."""
    pos = np.clip(np.searchsorted(sorted_ids, post_ids), 0, max(len(sorted_ids) - 1, 0))
    return pos, sorted_ids[pos] == post_ids


def unique_sorted(ids: np.ndarray) -> np.ndarray:
    """The distinct values of ``ids`` [N], ascending. numpy 2.4's ``np.unique`` hashes and
    took 0.35 ms for a user's 4,096 served posts, this 0.09 ms (on this machine)."""
    ordered = np.sort(np.asarray(ids).ravel())
    if len(ordered) < 2:
        return ordered
    return ordered[np.concatenate(([True], ordered[1:] != ordered[:-1]))]


def distinct_positions(positions: np.ndarray, size: int) -> np.ndarray:
    """The distinct values of ``positions`` [N] (each in [0, size)), ascending. Where the
    range is small beside N (a hot user's 4,096 served posts in the trained demo's 4,733-post
    corpus), by marking each position: 0.008 ms there, against 0.09 ms sorting (on this
    machine); a mark costs a byte of the range, a sort ~20 ns an item, hence the bound."""
    positions = np.asarray(positions, np.int64).ravel()  # one dtype whichever way
    if size > 16 * len(positions):
        return unique_sorted(positions)
    marked = np.zeros(size, bool)
    marked[positions] = True
    return np.flatnonzero(marked)


def is_in_sorted(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[...] bool: which of ``ids`` (any shape) ``sorted_ids`` (ascending, repeats allowed)
    holds, a binary search per id: 20 ids against 4,096 unsorted ones took 0.08 ms sorting
    them first, ``np.isin`` 0.37 ms (on this machine)."""
    if len(sorted_ids) == 0:
        return np.zeros(np.shape(ids), bool)
    return find_ids(sorted_ids, ids)[1]


def is_in_unsorted(ids: np.ndarray, among: np.ndarray) -> np.ndarray:
    """[N] bool: which of the few ``ids`` [N] occur in the many, unsorted ``among`` [E]:
    each of ``among`` looked up in the sorted few, so nothing of E's size is sorted (a user's
    64 in-network posts against its 4,096 excluded: 0.042 ms, against 0.087 ms sorting them,
    on this machine)."""
    ids, among = np.asarray(ids).ravel(), np.asarray(among).ravel()
    if len(ids) == 0 or len(among) == 0:
        return np.zeros(len(ids), bool)
    few = np.sort(ids)
    pos = np.minimum(np.searchsorted(few, among), len(few) - 1)  # [E]
    return is_in_sorted(np.sort(among[few[pos] == among]), ids)


def new_segment_name(state: str) -> str:
    """A name no other writer picks: the state, then a random suffix."""
    return f"{state}-{uuid.uuid4().hex[:12]}"


def write_segment(
    root: Path,
    posts: Posts,
    state: str,
    index: IndexSpec,
    progress: Optional[Callable[[int], object]] = None,
) -> SegmentEntry:
    """Write ``posts`` (already checked) as a new segment directory; the manifest does not
    name it yet. Files go to a hidden directory first, renamed whole when complete. Semantic
    IDs are written when any post has one (none: the files of a store without them).
    ``progress``: see ``build_index``."""
    name = new_segment_name(state)
    final = Path(root) / SEGMENTS_DIR / name
    tmp = final.with_name(f".{name}.tmp")
    tmp.mkdir(parents=True)
    codes = posts.semantic_ids
    has_codes = codes is not None and bool(codes.any())
    try:
        order = np.argsort(posts.post_ids, kind="stable")
        lookup = (posts.post_ids[order], order)  # sorted ids and their rows: id look-ups
        for column, values in zip(COLUMNS, (*posts.columns(), *lookup)):
            np.save(tmp / f"{column}.npy", values)
        if has_codes:
            np.save(tmp / f"{SEMANTIC_IDS}.npy", np.asarray(codes).astype(FILE_DTYPE))
        if index.kind != EXACT:
            built = build_index(posts.embeddings, index, progress=progress)
            write_index(built, tmp / "index.faiss")
        for path in tmp.iterdir():  # durable before the manifest names it
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    created = posts.created_at
    return SegmentEntry(
        name, state, len(posts), int(created.min()), int(created.max()), index, has_codes
    )


class Segment:
    """A segment opened read-only: columns memory-mapped, the index loaded when it has one
    and the segment is ``searchable`` (a reader that only looks posts up never loads it)."""

    def __init__(
        self,
        root: Path,
        entry: SegmentEntry,
        emb_size: int,
        searchable: bool = True,
        sids: SemanticIdSpec = SemanticIdSpec(),
    ):
        self.entry = entry
        self.path = Path(root) / SEGMENTS_DIR / entry.name
        self.sids = sids
        columns = {c: self._column(c) for c in COLUMNS}
        self.post_ids: np.ndarray = columns["post_ids"]  # int64 [n]
        self.author_ids: np.ndarray = columns["author_ids"]  # int64 [n]
        self.created_at: np.ndarray = columns["created_at"]  # int64 [n]
        self.embeddings: np.ndarray = columns["embeddings"]  # float32 [n, D]
        self.sorted_ids: np.ndarray = columns["sorted_ids"]  # int64 [n], ascending
        self.id_order: np.ndarray = columns["id_order"]  # int64 [n], row of each sorted id
        # uint16 [n, L] codes, or None: the segment holds no semantic IDs
        self.semantic_ids = self._column(SEMANTIC_IDS) if entry.semantic_ids else None
        self._check_shapes(entry.rows, emb_size)
        self.searchable = searchable
        self.index = None
        self.centroid_columns = None  # float32 [D, nlist] of the index, when it has one
        if searchable and entry.index.kind != EXACT:
            self.index = read_index(self.path / "index.faiss", entry.index, entry.rows, emb_size)
            self.centroid_columns = centroid_columns(self.index)

    def _column(self, column: str) -> np.ndarray:
        path = self.path / f"{column}.npy"
        try:
            # a plain array over the map: indexing a np.memmap goes through its Python
            # __getitem__ (docs/retrieval.md, "the work around Faiss")
            return np.asarray(load_npy(path, mmap_mode="r"))
        except FileNotFoundError:
            raise StoreError(f"{path}: not found (segment {self.entry.name!r})") from None
        except (OSError, ValueError) as error:
            raise StoreError(f"{path}: not a readable .npy file ({error})") from None

    def _check_shapes(self, rows: int, emb_size: int) -> None:
        if rows >= MAX_ROWS:  # a search packs each row into 32 bits of a key
            raise StoreError(f"{self.path}: {rows} rows, at most {MAX_ROWS - 1} a segment")
        for column in COLUMNS:
            array = getattr(self, column)
            expected = (rows, emb_size) if column == "embeddings" else (rows,)
            kind = np.float32 if column == "embeddings" else np.integer  # float32: Faiss reads it
            if array.shape != expected or not np.issubdtype(array.dtype, kind):
                raise StoreError(
                    f"{self.path / column}.npy: {array.dtype} {array.shape}, expected "
                    f"{'float32' if kind is np.float32 else 'int64'} {expected} (the manifest "
                    f"gives {rows} rows of emb_size {emb_size})"
                )
        codes = self.semantic_ids
        if codes is not None and (
            codes.shape != (rows, self.sids.levels) or codes.dtype.kind != "u"
        ):
            raise StoreError(
                f"{self.path / SEMANTIC_IDS}.npy: {codes.dtype} {codes.shape}, expected uint16 "
                f"{(rows, self.sids.levels)} (the manifest's semantic ID levels)"
            )

    def __len__(self) -> int:
        return self.entry.rows

    def warm(self) -> int:
        """Every page of the columns this reader reads in this process's page tables
        (``touch_pages``): all of them when searchable, else the look-up ones; bytes touched."""
        columns = COLUMNS if self.searchable else LOOKUP_COLUMNS
        codes = 0 if self.semantic_ids is None else touch_pages(self.semantic_ids)
        return codes + sum(touch_pages(getattr(self, column)) for column in columns)

    def find(self, post_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(found [...] bool, rows of the found ids) of ``post_ids`` (any shape)."""
        pos, found = find_ids(self.sorted_ids, post_ids)
        return found, np.asarray(self.id_order[pos[found]])

    def rows_of(self, post_ids: np.ndarray) -> np.ndarray:
        """Rows of the ids of ``post_ids`` that this segment holds, in no promised order."""
        if len(post_ids) == 0:
            return np.zeros(0, np.int64)
        # Sorted, the binary searches walk the ids in order: 4,096 ids (a user's served
        # posts) in 1 M took 0.21 ms instead of 0.79 (10 M: 0.56 instead of 2.3).
        return self.find(np.sort(np.asarray(post_ids, np.int64)))[1]

    def posts(self) -> Posts:
        codes = None if self.semantic_ids is None else np.asarray(self.semantic_ids, np.int32)
        return Posts(
            np.asarray(self.post_ids),
            np.asarray(self.author_ids),
            np.asarray(self.created_at),
            np.asarray(self.embeddings),
            codes,
        )


__all__ = ["FRESH", "SEALED", "Posts", "Segment", "check_posts", "write_segment"]
