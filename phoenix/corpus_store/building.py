"""Building a corpus whole: posts read from a file, drawn at random or taken from the trained
synthetic world, embedded, and written as a corpus store of sealed segments or as one corpus
file (`phoenix-build-corpus`, docs/retrieval.md).

Posts file formats (one row per post; post ids must be unique and > 0):
  .csv  columns post_id,author_id[,topic]; a header line with those names is optional
  .npy  an integer array [N, 2] (post_id, author_id) or [N, 3] (..., topic)
  .npz  integer arrays post_ids [N], author_ids [N] and optionally topics [N] and
        semantic_ids [N, L] (codes in [0, 256]; a store keeps them, a corpus file does not)
"""

from __future__ import annotations

import csv
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from phoenix.checkpoint import Corpus, save_corpus
from phoenix.corpus_store.ann import choose_index, training_of
from phoenix.corpus_store.embedding import EmbedPosts
from phoenix.corpus_store.manifest import SEALED, EmbeddedBy, IndexSpec, StoreError
from phoenix.corpus_store.segment import Posts as StorePosts
from phoenix.corpus_store.semantic_ids import SemanticIdSpec
from phoenix.corpus_store.store import CorpusStore

CSV_COLUMNS = ("post_id", "author_id", "topic")
NPZ_KEYS = ("post_ids", "author_ids", "topics")
SEGMENT_ROWS = 10_000_000
Report = Callable[[str], None]


def say(line: str) -> None:
    print(line, flush=True)  # before a bar on stderr starts


@dataclass(frozen=True)
class PostRows:
    """Posts to embed: ids, authors and, where known, topics, creation times and semantic
    IDs."""

    post_ids: np.ndarray  # int64 [N]
    author_ids: np.ndarray  # int64 [N]
    topics: Optional[np.ndarray] = None  # int64 [N]
    created_at: Optional[np.ndarray] = None  # int64 [N], unix seconds (None: now)
    semantic_ids: Optional[np.ndarray] = None  # int32 [N, L] codes (None: none known)

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def take(self, rows) -> PostRows:
        optional = lambda c: None if c is None else c[rows]  # noqa: E731
        return PostRows(
            self.post_ids[rows],
            self.author_ids[rows],
            optional(self.topics),
            optional(self.created_at),
            optional(self.semantic_ids),
        )

    def semantic_id_spec(self) -> SemanticIdSpec:
        """The width a store of these posts records: their semantic IDs' (default: 6)."""
        if self.semantic_ids is None:
            return SemanticIdSpec()
        return SemanticIdSpec(levels=int(self.semantic_ids.shape[1]))


class InputFileError(ValueError):
    """The posts file cannot be read or breaks a rule of the format."""


class StoreExistsError(StoreError):
    """A store is built whole once: the path is taken."""


# ----------------------------------------------------------------------------------------
# Reading posts
# ----------------------------------------------------------------------------------------


def read_csv(path: Path) -> PostRows:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if rows and rows[0][0].strip().lower() in CSV_COLUMNS:
        header = [cell.strip().lower() for cell in rows.pop(0)]
        missing = [name for name in CSV_COLUMNS[:2] if name not in header]
        if missing:
            raise InputFileError(f"{path}: header lacks column(s) {missing}")
        order = [header.index(name) for name in CSV_COLUMNS if name in header]
        rows = [[row[i] for i in order] for row in rows]
    try:
        table = np.array([[int(cell) for cell in row] for row in rows], np.int64)
    except (ValueError, OverflowError) as error:
        raise InputFileError(f"{path}: every cell must be an int64 ({error})") from None
    return posts_from_table(table, path)


def posts_from_table(table: np.ndarray, path: Path) -> PostRows:
    """Rows of (post_id, author_id[, topic])."""
    if table.ndim != 2 or table.shape[1] not in (2, 3) or table.shape[0] == 0:
        raise InputFileError(f"{path}: expected N >= 1 rows of 2 or 3 columns, got {table.shape}")
    if not np.issubdtype(table.dtype, np.integer):
        raise InputFileError(f"{path}: expected integers, got {table.dtype}")
    table = table.astype(np.int64)
    topics = table[:, 2] if table.shape[1] == 3 else None
    return PostRows(table[:, 0], table[:, 1], topics)


def read_npz(path: Path) -> PostRows:
    with np.load(path, allow_pickle=False) as archive:
        missing = [key for key in NPZ_KEYS[:2] if key not in archive.files]
        if missing:
            raise InputFileError(f"{path}: missing array(s) {missing}; found {archive.files}")
        arrays = [archive[key] if key in archive.files else None for key in NPZ_KEYS]
        codes = archive["semantic_ids"] if "semantic_ids" in archive.files else None
    for key, array in zip(NPZ_KEYS, arrays, strict=True):
        if array is not None and (array.ndim != 1 or not np.issubdtype(array.dtype, np.integer)):
            raise InputFileError(f"{path}: '{key}' must be a 1-D integer array")
    if len({len(a) for a in arrays if a is not None}) != 1:
        raise InputFileError(f"{path}: post_ids, author_ids (and topics) differ in length")
    post_ids, author_ids, topics = (None if a is None else a.astype(np.int64) for a in arrays)
    assert post_ids is not None and author_ids is not None  # required: checked above
    posts = PostRows(post_ids, author_ids, topics)
    if codes is None:
        return posts
    levels = codes.shape[1] if codes.ndim == 2 and codes.shape[1] > 0 else SemanticIdSpec().levels
    try:
        checked = SemanticIdSpec(levels=levels).check(codes, len(posts), str(path))
    except ValueError as error:
        raise InputFileError(str(error)) from None
    return dataclasses.replace(posts, semantic_ids=checked)


def read_posts(path: Path) -> PostRows:
    """Posts from a .csv, .npy or .npz file, checked for unique positive ids."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            posts = read_csv(path)
        elif suffix == ".npy":
            posts = posts_from_table(np.load(path, allow_pickle=False), path)
        elif suffix == ".npz":
            posts = read_npz(path)
        else:
            raise InputFileError(f"{path}: unknown format '{suffix}' (use .csv, .npy or .npz)")
    except OSError as error:
        raise InputFileError(f"{path}: cannot read ({error})") from None
    check_posts(posts, str(path))
    return posts


def check_posts(posts: PostRows, source: str) -> None:
    if np.any(posts.post_ids <= 0):
        raise InputFileError(f"{source}: post ids must be > 0, found {posts.post_ids.min()}")
    if np.any(posts.author_ids < 0):
        raise InputFileError(f"{source}: author ids must be >= 0")
    unique, counts = np.unique(posts.post_ids, return_counts=True)
    if len(unique) != len(posts):
        raise InputFileError(f"{source}: duplicate post ids, e.g. {unique[counts > 1][:5]}")


def generated_posts(count: int, seed: int) -> PostRows:
    """``count`` random posts by a pool of count/10 authors (ids unique and positive)."""
    rng = np.random.default_rng(seed)
    post_ids = np.unique(rng.integers(1, 2**62, count + count // 10 + 16))[:count]
    rng.shuffle(post_ids)
    authors = rng.integers(1, 2**62, max(1, count // 10))
    return PostRows(post_ids, authors[rng.integers(0, len(authors), len(post_ids))])


# ----------------------------------------------------------------------------------------
# Writing: one corpus file, or a store of sealed segments
# ----------------------------------------------------------------------------------------


def posts_bar(total: int, desc: str = "candidate_tower") -> tqdm:
    return tqdm(total=total, unit="post", desc=desc, file=sys.stderr)


def build_corpus_file(path: Path, posts: PostRows, embed: EmbedPosts) -> np.ndarray:
    """``path`` as one .npz corpus (ArtifactError if it cannot be written); the embeddings."""
    with posts_bar(len(posts)) as bar:
        embeddings = embed(posts.post_ids, posts.author_ids, bar.update)
    save_corpus(path, Corpus(posts.post_ids, embeddings, posts.author_ids, posts.topics))
    return embeddings


def describe_index(spec: IndexSpec) -> str:
    if spec.kind == "exact":
        return "exact (every post scored)"
    probed = f"nprobe {spec.nprobe}"
    if spec.max_nprobe > spec.nprobe:  # query-adaptive probing (ann.lists_to_probe)
        probed = f"nprobe {spec.nprobe}-{spec.max_nprobe} per user"
    reranked = f", {spec.rerank}x re-scored in float32" if spec.rerank else ""
    return f"{spec.kind}, nlist {spec.nlist}, {probed}{reranked}"


def build_store(
    final: Path,
    posts: PostRows,
    embed: EmbedPosts,
    segment_rows: int = SEGMENT_ROWS,
    window: Optional[int] = None,
    report: Report = say,
    embedded_by: Optional[EmbeddedBy] = None,
) -> int:
    """A new corpus store at ``final``: posts oldest first in sealed segments of
    ``segment_rows``, each indexed as its size calls for; returns the number of segments.
    ``embedded_by``: the tower ``embed`` is, recorded in the store for its retrievers.
    Built in a hidden sibling directory and renamed when complete, so a retriever never
    opens half a store and a failed build leaves nothing behind. StoreExistsError if
    ``final`` exists; ArtifactError (StoreError is one) if the store cannot be written."""
    final = Path(final)
    if final.exists():
        raise StoreExistsError(
            f"{final}: exists already (a store is built whole once: pick another path or remove it)"
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    building = final.with_name(f".{final.name}.building-{os.getpid()}")
    created = posts.created_at
    if created is None:
        created = np.full(len(posts), int(time.time()), np.int64)
    order = np.argsort(created, kind="stable")
    parts = [order[i : i + segment_rows] for i in range(0, len(order), segment_rows)]
    try:
        store = None
        for number, rows in enumerate(parts, 1):
            label = f"segment {number}/{len(parts)}"
            part = posts.take(rows)
            with posts_bar(len(part), f"{label}: candidate_tower") as bar:
                vectors = embed(part.post_ids, part.author_ids, bar.update)
            if store is None:  # the width is known once the tower has answered
                width, sids = int(vectors.shape[1]), posts.semantic_id_spec()
                store = CorpusStore.create(building, width, window, embedded_by, sids)
            columns = StorePosts(
                part.post_ids, part.author_ids, created[rows], vectors, part.semantic_ids
            )
            add_sealed(store, columns, label, report)
        os.rename(building, final)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return len(parts)


def add_sealed(store: CorpusStore, posts: StorePosts, label: str, report: Report) -> None:
    """One sealed segment, its index chosen by size; a bar while a big index is built."""
    spec = choose_index(len(posts), posts.embeddings.shape[1])
    report(f"{label}: {len(posts):,} posts, index {describe_index(spec)}")
    if spec.kind == "exact":
        store.add(posts, state=SEALED, index=spec)
        return
    sample, iterations = training_of(spec, len(posts))
    report(
        f"{label}: training {spec.nlist:,} lists on {sample:,} posts ({iterations} k-means "
        "iterations) before the index bar moves: minutes for millions of posts"
    )
    with posts_bar(len(posts), f"{label}: index") as bar:
        store.add(posts, state=SEALED, index=spec, progress=bar.update)
