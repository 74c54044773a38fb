"""The retrieval side's services: the user tower, the candidate tower and top-k retrieval
joined by the in-network posts.

Shape glossary (R rows of one request, B rows of a batch)
  S  history_seq_len   D  emb_size   K  top_k   M  in-network posts
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from phoenix.checkpoint.production import is_production
from phoenix.corpus_store.segment import is_in_unsorted
from phoenix.engine import CandidateTower, RetrievalEngine
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.schema.batches import pad_batch
from phoenix.schema.contracts import LIMITS, UNKNOWN_AGE
from phoenix.schema.request_types import CandidateTowerRequest, RetrieverRequest, UserEncoderRequest
from phoenix.schema.requests import InputError
from phoenix.stub.corpus import RowHits, open_corpus, semantic_id_lookup
from phoenix.stub.services.common import (
    Outputs,
    Service,
    ServiceSettings,
    split_rows,
)
from phoenix.stub.services.resources import PhoenixResources, resources_for


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
        num_actions=resources.config.num_actions,
        **options,
    )


class UserEncoderService(Service):
    """Retrieval user tower: one unit vector per user."""

    request_type = UserEncoderRequest

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
        resources = resources_for(settings.artifact_dir, ("retrieval", "tables"))
        return cls(resources, batch_buckets=settings.batch_buckets)

    def warm_up(self) -> int:
        return self.engine.warm_up_users()

    def run(self, requests: Sequence[UserEncoderRequest]) -> list[Outputs]:
        rows = sum(r.rows for r in requests)
        users = pad_batch(requests, rows, {"L": self.config.history_seq_len})
        vectors = self.engine.encode_users(*user_tower_inputs(self.resources, users))  # [B, D]
        return split_rows(requests, {"user_embedding": vectors})


class CandidateTowerService(Service):
    """Candidate tower: one unit vector per (post_id, author_id) row."""

    request_type = CandidateTowerRequest

    def __init__(self, resources: PhoenixResources, *, max_rows: int, rows_per_call: int):
        self.resources = resources
        self.config = resources.config
        self.max_rows = max_rows  # one program of rows_per_call rows serves them all
        self.engine = retrieval_engine(resources, candidate_chunk=rows_per_call)
        self.tower = CandidateTower(resources.hash_embedder(), self.engine)

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> CandidateTowerService:
        rows_per_call = settings.parameters["rows_per_call"]
        return cls(
            resources_for(settings.artifact_dir, ("retrieval", "tables")),
            max_rows=settings.max_batch_size,
            rows_per_call=rows_per_call,
        )

    def warm_up(self) -> int:
        self.embed(np.ones(1, np.int64), np.ones(1, np.int64))
        return 1

    def embed(self, post_ids: np.ndarray, author_ids: np.ndarray) -> np.ndarray:
        """Unit vectors [n, D] of posts [n] by authors [n]."""
        return self.tower(post_ids, author_ids)

    def run(self, requests: Sequence[CandidateTowerRequest]) -> list[Outputs]:
        posts = np.concatenate([r.post_id[:, 0] for r in requests])  # [B]
        authors = np.concatenate([r.author_id[:, 0] for r in requests])  # [B]
        return split_rows(requests, {"candidate_embedding": self.embed(posts, authors)})


# From this many posts a corpus file is scored as int8 codes and re-ranked exactly in float32
# on CPUs: 1.9x the queries/s at 1 M posts, recall@100 1.0; slower below about 200 k
# (bench/results/engine.json, "retrieval_corpus_encodings"; docs/retrieval.md).
INT8_MIN_ROWS = 300_000


def corpus_encoding(rows: int) -> str:
    """How the exact engine holds a corpus file of ``rows`` posts."""
    return "int8" if rows >= INT8_MIN_ROWS and jax.default_backend() == "cpu" else "float"


def exact_engine_for(resources: PhoenixResources, engine_options: dict):
    """``engine_for(rows)``: the exact engine a corpus file of ``rows`` posts is searched by."""

    def engine_for(rows: int) -> RetrievalEngine:
        return retrieval_engine(resources, corpus_encoding=corpus_encoding(rows), **engine_options)

    return engine_for


def excluded_rows(request: RetrieverRequest) -> list[np.ndarray]:
    """Per row: the posts it must not get (its history and the posts excluded besides)."""
    sent = [ids for ids in (request.history_post_ids, request.excluded_post_ids) if ids is not None]
    if not sent:
        return [np.zeros(0, np.int64)] * request.rows
    return list(np.concatenate(sent, axis=1))


# The retrieval score of an in-network post the retriever did not also retrieve: it was not
# scored against the user's vector (its vector may not even be in the corpus yet: a post made a
# minute ago), and 0 is what a post orthogonal to the user scores. The scores are passed
# through for inspection only; nothing ranks by them, and the in_network flag tells the posts
# apart. An in-network post also retrieved keeps its retrieval score.
UNRETRIEVED_SCORE = 0.0


def in_network_rows(request: RetrieverRequest) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row: (post ids, author ids) of its in-network posts, padding (post id 0) left out."""
    if request.in_network_post_ids is None:
        empty = np.zeros(0, np.int64)
        return [(empty, empty)] * request.rows
    assert request.in_network_author_ids is not None  # with the post ids (admit)
    rows = []
    for posts, authors in zip(request.in_network_post_ids, request.in_network_author_ids):
        real = posts != 0
        rows.append((posts[real], authors[real]))
    return rows


def with_in_network(
    retrieved: RowHits,
    in_network: tuple[np.ndarray, np.ndarray],
    excluded: np.ndarray,
    limit: int = LIMITS.max_candidates,
) -> RowHits:
    """One row's candidates: its in-network posts first (in their order: newest first) that are
    not ``excluded``, then the ``retrieved`` posts (best first) that are not in-network, each
    post once, at most ``limit`` (the ranker's candidate limit) with the retrieved cut first."""
    posts, authors = in_network
    if len(posts) == 0:  # no follows, or a request that carried its history
        return RowHits(
            retrieved.post_ids[:limit],
            retrieved.author_ids[:limit],
            retrieved.scores[:limit].astype(np.float32),
        )
    _, first = np.unique(posts, return_index=True)
    keep = np.zeros(len(posts), bool)
    keep[first] = True
    keep &= ~is_in_unsorted(posts, excluded)  # posts: up to 64; excluded: history + served
    posts, authors = posts[keep][:limit], authors[keep][:limit]
    also = np.isin(retrieved.post_ids, posts)
    score_of = dict(zip(retrieved.post_ids[also].tolist(), retrieved.scores[also].tolist()))
    scores = np.array([score_of.get(p, UNRETRIEVED_SCORE) for p in posts.tolist()], np.float32)
    room = limit - len(posts)
    return RowHits(
        np.concatenate([posts, retrieved.post_ids[~also][:room]]),
        np.concatenate([authors, retrieved.author_ids[~also][:room]]),
        np.concatenate([scores, retrieved.scores[~also][:room].astype(np.float32)]),
    )


class RetrieverService(Service):
    """Top-k of a user vector over the corpus (a file, searched exactly, or a store followed
    while serving), excluding the user's history and the posts excluded besides (served),
    joined by the user's in-network posts when the request carries them.

    ``top_k`` counts the retrieved (out-of-network) posts only, as X's home-mixer asks its
    retrieval and its in-network source for their own counts: a row gets its in-network posts
    (newest first) and then its top_k retrieved posts (best first), an in-network post also
    retrieved once, as in-network; at most ``LIMITS.max_candidates`` in all."""

    request_type = RetrieverRequest

    def __init__(
        self,
        resources: PhoenixResources,
        corpus_file: str,
        *,
        batch_buckets: Sequence[int],
        compute_dtype=None,
        clock: Callable[[], float] = time.time,
        production: bool = False,
    ):
        self.config = resources.config
        self.clock = clock
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.max_rows = self.batch_buckets[-1]
        options = {"compute_dtype": compute_dtype, "batch_buckets": self.batch_buckets}
        engine_for = exact_engine_for(resources, options)
        self.corpus = open_corpus(resources.root, corpus_file, self.config, engine_for)
        self.production = production  # answers the candidates' semantic IDs

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> RetrieverService:
        resources = resources_for(settings.artifact_dir, ("retrieval",))  # no tables
        return cls(
            resources,
            settings.parameters["corpus_file"],
            batch_buckets=settings.batch_buckets,
            production=is_production(resources.config),
        )

    def warm_up(self) -> int:
        return self.corpus.warm_up()

    def admit(self, request):
        """The in-network posts come as post ids and their author ids, both or neither (the
        contract checks their lengths agree when both are sent)."""
        request = super().admit(request)
        pair = ("in_network_post_ids", "in_network_author_ids")
        sent = [name for name in pair if getattr(request, name) is not None]
        if len(sent) == 1:
            raise InputError(
                f"retriever: '{pair[0]}' and '{pair[1]}' go together; only '{sent[0]}' was sent"
            )
        return request

    def run(self, requests: Sequence[RetrieverRequest]) -> list[Outputs]:
        now = self.clock()
        users = np.concatenate([r.user_embedding for r in requests])  # [B, D]
        wanted = np.concatenate([r.top_k[:, 0] for r in requests])  # [B]
        excluded = [row for r in requests for row in excluded_rows(r)]
        hits = self.corpus.search(users, int(wanted.max()), excluded)
        # A row gets its in-network posts and at most its top_k retrieved; a request's rows are
        # cut to its shortest row's count (the retrieved posts cut first), so each output is one
        # rectangular array.
        outputs, start = [], 0
        for request in requests:
            rows = [
                with_in_network(
                    RowHits(*(column[: int(k)] for column in hit)), in_network, excluded_ids
                )
                for hit, k, in_network, excluded_ids in zip(
                    hits[start:],
                    wanted[start : start + request.rows],
                    in_network_rows(request),
                    excluded[start:],
                )
            ]
            keep = min(len(h.post_ids) for h in rows)
            post_ids = np.stack([h.post_ids[:keep] for h in rows])  # [R, K]
            outputs.append(
                {
                    "post_ids": post_ids,
                    "author_ids": np.stack([h.author_ids[:keep] for h in rows]),
                    "retrieval_scores": np.stack([h.scores[:keep] for h in rows]),
                    "post_age_seconds": self.ages(post_ids, now),
                    **(self.candidate_context(request, post_ids) if self.production else {}),
                }
            )
            start += request.rows
        return outputs

    def candidate_context(self, request: RetrieverRequest, post_ids: np.ndarray) -> Outputs:
        """The production family's per post [R, K, ...]: its semantic IDs by the corpus and,
        when the request sends its context, the timezone and hour it is shown in."""
        outputs = {"semantic_ids": semantic_id_lookup(self.corpus)(post_ids)}
        for name, sent in (
            ("timezone", request.request_timezone),
            ("hour_of_day", request.request_hour_of_day),
        ):
            if sent is not None:
                outputs[name] = np.broadcast_to(sent, post_ids.shape).astype(np.int32)
        return outputs

    def ages(self, post_ids: np.ndarray, now: float) -> np.ndarray:
        """float32 seconds since each post was created, by the corpus; UNKNOWN_AGE where it
        does not date the post (a corpus file without creation times, an in-network post it
        does not hold yet)."""
        ages = self.corpus.ages(post_ids, now)
        if ages is None:
            return np.full(post_ids.shape, UNKNOWN_AGE, np.float32)
        return np.where(np.isnan(ages), UNKNOWN_AGE, np.maximum(ages, 0.0)).astype(np.float32)
