"""The corpus a serving model reads: a corpus file (``corpus.npz``) in the artifact directory,
or a corpus store directory followed while serving (``phoenix.corpus_store``).

Every model whose contract has the ``corpus_file`` parameter opens it with ``open_corpus``,
the one place that tells a file from a store. Both kinds answer the same lookups:

- ``search``: the top-k posts of each user vector, minus the posts each user must not get,
  with their authors and scores (the retriever);
- ``ages``: seconds since each post was created, by post id (the feed policy's age filter);
- ``semantic_ids``: each post's semantic IDs by post id (a store's; a file holds none: zeros),
  what X's production ranker reads of its history and candidates.

A store is read through its memory-mapped segments, newest generation first checked on each
call. A file is read once: whole for search, its post ids and creation times only for ages
(the vectors, most of the file, are never read by the feed policy).

Shape glossary: B users, D emb_size, k posts wanted per user.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Optional, Union

import numpy as np

from phoenix.checkpoint import load_corpus, load_post_dates, resolve_inside
from phoenix.config import ArtifactConfig
from phoenix.corpus_store import StoreFollower, is_store
from phoenix.corpus_store.segment import distinct_positions
from phoenix.corpus_store.towers import tower_of
from phoenix.feed_features import SID_CODEBOOK_SIZE, SID_NUM_LEVELS
from phoenix.stub.id_table import IdTable


class RowHits(NamedTuple):
    """One user row's retrieved posts, best first."""

    post_ids: np.ndarray  # int64 [K']
    author_ids: np.ndarray  # int64 [K']
    scores: np.ndarray  # float32 [K']


class CorpusFile:
    """A corpus file's columns. ``engine`` (a ``RetrievalEngine`` holding the file's vectors)
    is set only where the file is searched; the feed policy opens it without one."""

    def __init__(
        self,
        post_ids: np.ndarray,
        *,
        created_at: Optional[np.ndarray] = None,
        author_ids: Optional[np.ndarray] = None,
        engine=None,
    ):
        self.post_ids = post_ids  # int64 [N]
        self.created_at = created_at  # int64 [N] unix seconds, or None: the file dates nothing
        self.author_ids = author_ids  # int64 [N], with the engine
        self.engine = engine
        self.index = IdTable(post_ids)  # column positions by post id

    @classmethod
    def open(cls, path: Path, config: ArtifactConfig, engine_for=None) -> CorpusFile:
        """The file at ``path``: whole into ``engine_for(rows)`` (a RetrievalEngine for a
        corpus of that many rows) when given, else its post ids and creation times only."""
        if engine_for is None:
            post_ids, created_at = load_post_dates(path)
            return cls(post_ids, created_at=created_at)
        corpus = load_corpus(path, config)
        engine = engine_for(len(corpus))
        engine.set_corpus(corpus.embeddings)
        return cls(
            corpus.post_ids,
            created_at=corpus.created_at,
            author_ids=corpus.author_ids,
            engine=engine,
        )

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def warm_up(self) -> int:
        return 0 if self.engine is None else self.engine.warm_up_top_k()

    def ages(self, post_ids: np.ndarray, now: float) -> Optional[np.ndarray]:
        """Seconds since each post (any shape) was created, NaN for posts the file does not
        hold; None when the file dates no post."""
        if self.created_at is None:
            return None
        positions, found = self.index.find(post_ids)
        return np.where(found, now - self.created_at[positions].astype(np.float64), np.nan)

    def semantic_ids(self, post_ids: np.ndarray) -> np.ndarray:
        """int32 [..., L] zeros: a corpus file keeps no semantic IDs (a store does)."""
        return np.zeros(np.shape(post_ids) + (SID_NUM_LEVELS,), np.int32)

    def search(self, users: np.ndarray, k: int, excluded: Sequence[np.ndarray]) -> list[RowHits]:
        """The ``k`` best posts for each user [B, D] (exactly, by the engine), none of
        ``excluded[b]`` (post ids) among user b's."""
        if self.engine is None:
            raise RuntimeError("this corpus file was opened without its vectors: no search")
        assert self.author_ids is not None  # loaded with the vectors
        seen = []  # per user: the corpus positions of the excluded posts it holds
        for ids in excluded:
            positions, found = self.index.find(ids)
            seen.append(distinct_positions(positions[found], len(self)))
        indices, scores = self.engine.top_k(users, k, exclude_indices=seen)  # [B, k]
        hits = []
        for row, positions in enumerate(seen):
            idx = indices[row, : min(k, len(self) - len(positions))]  # never an excluded post
            hits.append(RowHits(self.post_ids[idx], self.author_ids[idx], scores[row, : len(idx)]))
        return hits


@dataclass(frozen=True)
class CorpusState:
    """Where a followed store stands (request_metrics' corpus gauges)."""

    generation: int  # the generation served
    lag_seconds: float  # how long a newer generation has waited (0: none has)
    skipped: int  # generations refused since the follower started


class FollowedStore:
    """A corpus store, followed while serving: each call reads its newest generation."""

    def __init__(self, follower: StoreFollower, clock: Callable[[], float] = time.time):
        self.follower = follower
        self.clock = clock  # the end of the store's window at search time

    def warm_up(self) -> int:
        return 0  # Faiss and numpy: nothing to compile

    def ages(self, post_ids: np.ndarray, now: float) -> np.ndarray:
        """Seconds since each post (any shape) was created, NaN for posts not in the store
        (or deleted); the store's window aside."""
        _, created, found = self.follower.current().lookup(post_ids)
        return np.where(found, now - created.astype(np.float64), np.nan)

    def semantic_ids(self, post_ids: np.ndarray) -> np.ndarray:
        """int32 [..., L]: each post's semantic IDs (any shape), zeros for posts the store
        does not hold (or deleted, or stored without); the window aside."""
        return self.follower.current().semantic_ids(post_ids)

    def search(self, users: np.ndarray, k: int, excluded: Sequence[np.ndarray]) -> list[RowHits]:
        """The ``k`` best live posts for each user [B, D], minus ``excluded[b]``."""
        hits = self.follower.current().search(users, k, excluded, now=self.clock())
        return [RowHits(*row) for row in zip(hits.post_ids, hits.author_ids, hits.scores)]

    def state(self) -> CorpusState:
        follower = self.follower
        return CorpusState(follower.current().generation, follower.lag_seconds(), follower.skipped)

    def close(self) -> None:
        self.follower.stop()


ServedCorpus = Union[CorpusFile, FollowedStore]


def semantic_id_lookup(corpus: ServedCorpus) -> Callable[[np.ndarray], np.ndarray]:
    """``corpus.semantic_ids``, its answers checked against what X's production ranker reads
    (``SID_NUM_LEVELS`` codes in [0, ``SID_CODEBOOK_SIZE``]): a corpus store of another width
    fails each look-up naming the difference, never hands the model codes it has no rows for."""

    def lookup(post_ids: np.ndarray) -> np.ndarray:
        codes = corpus.semantic_ids(post_ids)
        levels = codes.shape[-1]
        if levels != SID_NUM_LEVELS or (codes.size and codes.max() > SID_CODEBOOK_SIZE):
            largest = int(codes.max()) if codes.size else 0
            raise ValueError(
                f"the corpus store's semantic IDs are {levels} levels (codes up to {largest}); "
                f"the production ranker reads {SID_NUM_LEVELS} levels of codes in "
                f"[0, {SID_CODEBOOK_SIZE}]"
            )
        return codes

    return lookup


def open_corpus(
    artifact_dir: Path, name: str, config: ArtifactConfig, engine_for=None
) -> ServedCorpus:
    """The corpus ``name`` (the ``corpus_file`` parameter) inside ``artifact_dir``, for the
    model of artifact ``config``: a store directory, followed from now on, or a corpus file
    (see ``CorpusFile.open`` for ``engine_for``). Without ``engine_for`` the corpus is only
    looked up (the feed policy): neither a file's vectors nor a store's ANN indexes are loaded.
    A store searched must have been embedded by ``artifact_dir``'s candidate tower (its every
    generation; TowerMismatch naming both towers); one looked up only dates posts, which any
    tower's store does alike. Errors name the path and the problem."""
    path = resolve_inside(Path(artifact_dir), name)
    if is_store(path):
        searched = engine_for is not None
        tower = tower_of(artifact_dir) if searched else None
        follower = StoreFollower(path, config.emb_size, searchable=searched, tower=tower)
        return FollowedStore(follower.start())
    return CorpusFile.open(path, config, engine_for)
