"""The retrieval side's services: the user tower, the candidate tower and top-k retrieval.

Shape glossary (R rows of one request, B rows of a batch)
  S  history_seq_len   D  emb_size   M  corpus size   K  top_k
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from phoenix.checkpoint import Corpus, load_corpus, resolve_inside
from phoenix.corpus_store import StoreFollower, is_store
from phoenix.corpus_store.segment import find_ids
from phoenix.engine import CandidateTower, RetrievalEngine
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.serving.batches import pad_batch
from phoenix.serving.requests import CandidateRequest, RetrieveRequest, UserRequest
from phoenix.serving.services.common import (
    Outputs,
    PhoenixResources,
    Service,
    ServiceSettings,
    split_rows,
)


def user_tower_inputs(resources: PhoenixResources, users):
    """The hashed and looked-up batch the user tower reads (it takes no candidates) of a
    padded user batch (``batches.pad_batch`` of user requests)."""
    hashes, embeddings = resources.user_features(users)
    hashes.pop("history_continuous_actions")  # the user tower reads no dwell time
    rows = len(users.user_id)
    no_posts = np.zeros((rows, 0), np.int64)
    (post_h, author_h), (post_e, author_e) = resources.candidate_features(no_posts, no_posts)
    batch = RecsysBatch(
        **hashes,
        candidate_post_hashes=post_h,  # [B, 0, nI]
        candidate_author_hashes=author_h,  # [B, 0, nA]
        candidate_product_surface=np.zeros((rows, 0), np.int32),
    )
    emb = RecsysEmbeddings(
        **embeddings, candidate_post_embeddings=post_e, candidate_author_embeddings=author_e
    )
    return batch, emb


def retrieval_engine(resources: PhoenixResources, **options) -> RetrievalEngine:
    """The retrieval towers of ``resources``, their programs in its store."""
    return RetrievalEngine(
        resources.config.retrieval_config(),
        resources.artifacts.retrieval_params,
        store=resources.programs,
        **options,
    )


class UserEncoderService(Service):
    """Retrieval user tower: one unit vector per user."""

    request_type = UserRequest

    def __init__(
        self, resources: PhoenixResources, *, batch_buckets: Sequence[int], compute_dtype=None
    ):
        self.resources = resources
        self.config = resources.config
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.max_rows = self.batch_buckets[-1]
        self.engine = retrieval_engine(
            resources, compute_dtype=compute_dtype, batch_buckets=self.batch_buckets
        )

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> UserEncoderService:
        resources = PhoenixResources(settings.artifact_dir, ("retrieval", "tables"))
        return cls(resources, batch_buckets=settings.batch_buckets)

    def warm_up(self) -> int:
        return self.engine.warm_up_users()

    def run(self, requests: Sequence[UserRequest]) -> list[Outputs]:
        rows = sum(r.rows for r in requests)
        users = pad_batch(requests, rows, {"L": self.config.history_seq_len})
        vectors = self.engine.encode_users(*user_tower_inputs(self.resources, users))  # [B, D]
        return split_rows(requests, {"user_embedding": vectors})


class CandidateTowerService(Service):
    """Candidate tower: one unit vector per (post_id, author_id) row."""

    request_type = CandidateRequest

    def __init__(self, resources: PhoenixResources, *, max_rows: int, rows_per_call: int):
        self.resources = resources
        self.config = resources.config
        self.max_rows = max_rows  # one program of rows_per_call rows serves them all
        self.engine = retrieval_engine(resources, candidate_chunk=rows_per_call)
        self.tower = CandidateTower(resources.embedder, self.engine)

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> CandidateTowerService:
        rows_per_call = settings.parameters["rows_per_call"]
        return cls(
            PhoenixResources(settings.artifact_dir, ("retrieval", "tables")),
            max_rows=settings.max_batch_size,
            rows_per_call=rows_per_call,
        )

    def warm_up(self) -> int:
        self.embed(np.ones(1, np.int64), np.ones(1, np.int64))
        return 1

    def embed(self, post_ids: np.ndarray, author_ids: np.ndarray) -> np.ndarray:
        """Unit vectors [n, D] of posts [n] by authors [n]."""
        return self.tower(post_ids, author_ids)

    def run(self, requests: Sequence[CandidateRequest]) -> list[Outputs]:
        posts = np.concatenate([r.post_id[:, 0] for r in requests])  # [B]
        authors = np.concatenate([r.author_id[:, 0] for r in requests])  # [B]
        return split_rows(requests, {"candidate_embedding": self.embed(posts, authors)})


class RowHits(NamedTuple):
    """One user row's retrieved posts, best first."""

    post_ids: np.ndarray  # int64 [K']
    author_ids: np.ndarray  # int64 [K']
    scores: np.ndarray  # float32 [K']


class CorpusFileSearch:
    """A corpus file (``corpus.npz``) on the device, searched exactly by the engine."""

    def __init__(self, engine: RetrievalEngine, corpus: Corpus):
        self.engine = engine
        self.corpus = corpus
        self.engine.set_corpus(corpus.embeddings)
        order = np.argsort(corpus.post_ids)
        self._sorted_ids = corpus.post_ids[order]
        self._sorted_index = order

    def warm_up(self) -> int:
        return self.engine.warm_up_top_k()

    def corpus_indices(self, post_ids: np.ndarray) -> np.ndarray:
        """Corpus positions of the ids that are in the corpus."""
        pos, found = find_ids(self._sorted_ids, post_ids)
        return self._sorted_index[pos[found]]

    def search(self, users: np.ndarray, k: int, excluded: list[np.ndarray]) -> list[RowHits]:
        seen = [np.unique(self.corpus_indices(ids)) for ids in excluded]
        indices, scores = self.engine.top_k(users, k, exclude_indices=seen)  # [B, k]
        size = len(self.corpus)
        hits = []
        for row, positions in enumerate(seen):
            idx = indices[row, : min(k, size - len(positions))]  # never an excluded post
            hits.append(
                RowHits(
                    self.corpus.post_ids[idx], self.corpus.author_ids[idx], scores[row, : len(idx)]
                )
            )
        return hits


class StoreSearch:
    """A corpus store, followed while serving: each call searches its newest generation."""

    def __init__(self, follower: StoreFollower, clock: Callable[[], float] = time.time):
        self.follower = follower
        self.clock = clock

    def warm_up(self) -> int:
        return 0  # Faiss and numpy: nothing to compile

    def search(self, users: np.ndarray, k: int, excluded: list[np.ndarray]) -> list[RowHits]:
        hits = self.follower.current().search(users, k, excluded, now=self.clock())
        return [RowHits(*row) for row in zip(hits.post_ids, hits.author_ids, hits.scores)]


# From this many posts a corpus file is scored as int8 codes and re-ranked exactly in float32
# on CPUs: 1.9x the queries/s at 1 M posts, recall@100 1.0; slower below about 200 k
# (bench/results/engine.json, "retrieval_corpus_encodings"; docs/retrieval.md).
INT8_MIN_ROWS = 300_000


def corpus_encoding(rows: int) -> str:
    """How the exact engine holds a corpus file of ``rows`` posts."""
    return "int8" if rows >= INT8_MIN_ROWS and jax.default_backend() == "cpu" else "float"


def corpus_search(resources: PhoenixResources, corpus_file: str, engine_options: dict):
    """What the retriever searches: a corpus file, or a store directory it follows."""
    path = resolve_inside(resources.root, corpus_file)
    if is_store(path):
        return StoreSearch(StoreFollower(path, resources.config.emb_size).start())
    corpus = load_corpus(path, resources.config)
    encoding = corpus_encoding(len(corpus))
    engine = retrieval_engine(resources, corpus_encoding=encoding, **engine_options)
    return CorpusFileSearch(engine, corpus)


class RetrieverService(Service):
    """Top-k of a user vector over the corpus (a file, searched exactly, or a store followed
    while serving), excluding the user's history."""

    request_type = RetrieveRequest

    def __init__(
        self,
        resources: PhoenixResources,
        corpus_file: str,
        *,
        batch_buckets: Sequence[int],
        compute_dtype=None,
    ):
        self.config = resources.config
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.max_rows = self.batch_buckets[-1]
        options = {"compute_dtype": compute_dtype, "batch_buckets": self.batch_buckets}
        self.searcher = corpus_search(resources, corpus_file, options)

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> RetrieverService:
        return cls(
            PhoenixResources(settings.artifact_dir, ("retrieval",)),  # no tables: it gets vectors
            settings.parameters["corpus_file"],
            batch_buckets=settings.batch_buckets,
        )

    def warm_up(self) -> int:
        return self.searcher.warm_up()

    def run(self, requests: Sequence[RetrieveRequest]) -> list[Outputs]:
        users = np.concatenate([r.user_embedding for r in requests])  # [B, D]
        wanted = np.concatenate([r.top_k[:, 0] for r in requests])  # [B]
        no_history = lambda r: np.zeros((r.rows, 0), np.int64)  # noqa: E731
        excluded = [  # per row: the posts it must not get
            row
            for r in requests
            for row in (no_history(r) if r.history_post_ids is None else r.history_post_ids)
        ]
        hits = self.searcher.search(users, int(wanted.max()), excluded)
        # A row gets at most its top_k; a request's rows are cut to its shortest row's count,
        # so each output is one rectangular array.
        outputs, start = [], 0
        for request in requests:
            rows = hits[start : start + request.rows]
            keep = min(min(int(k), len(h.post_ids)) for k, h in zip(wanted[start:], rows))
            outputs.append(
                {
                    "post_ids": np.stack([h.post_ids[:keep] for h in rows]),  # [R, K]
                    "author_ids": np.stack([h.author_ids[:keep] for h in rows]),
                    "retrieval_scores": np.stack([h.scores[:keep] for h in rows]).astype(
                        np.float32
                    ),
                }
            )
            start += request.rows
        return outputs
