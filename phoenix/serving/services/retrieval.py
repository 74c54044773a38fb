"""The retrieval side's services: the user tower, the candidate tower and top-k retrieval.

Shape glossary (per request: leading dimension R = rows)
  L  history items sent   D  emb_size   M  corpus size   K  top_k
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phoenix.checkpoint import Corpus, load_corpus, resolve_inside
from phoenix.engine import RetrievalEngine
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.serving import contracts
from phoenix.serving import requests as checks
from phoenix.serving.services.common import (
    USER_INPUTS,
    Inputs,
    Outputs,
    PhoenixResources,
    Result,
    _empty_candidates,
    handle_rows,
    parse_user_rows,
    stack_rows,
    stack_user_rows,
)

# ----------------------------------------------------------------------------------------
# user_encoder
# ----------------------------------------------------------------------------------------


class UserEncoderService:
    """Retrieval user tower: one unit vector per user."""

    def __init__(
        self,
        resources: PhoenixResources,
        compute_dtype=None,
        batch_buckets: Sequence[int] = contracts.USER_ENCODER.batch_buckets,
    ):
        self.resources = resources
        self.config = resources.config
        self.engine = RetrievalEngine(
            self.config.retrieval_config(),
            resources.artifacts.retrieval_params,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
        )

    def warm_up(self) -> int:
        return self.engine.warm_up()

    def parse(self, inputs: Inputs) -> list[dict]:
        checks.check_unknown_inputs(inputs, USER_INPUTS)
        c = self.config
        return parse_user_rows(inputs, c.num_actions, c.product_surface_vocab_size)

    def features(self, rows: Sequence[dict]) -> tuple[RecsysBatch, RecsysEmbeddings]:
        """Hashed user + history batch (no candidates: the user tower reads none)."""
        c = self.config
        users = stack_user_rows(rows, c.history_seq_len, c.num_actions)
        hashes, embeddings = self.resources.user_features(users)
        hashes.pop("history_continuous_actions")  # the user tower takes no dwell time
        _, (post_emb, author_emb) = self.resources.candidate_features(
            np.zeros((len(rows), 0), np.int64), np.zeros((len(rows), 0), np.int64)
        )
        batch = RecsysBatch(**hashes, **_empty_candidates(len(rows), c))
        emb = RecsysEmbeddings(
            **embeddings, candidate_post_embeddings=post_emb, candidate_author_embeddings=author_emb
        )
        return batch, emb

    def encode(self, rows: Sequence[dict]) -> np.ndarray:
        return self.engine.encode_users(*self.features(rows))

    def handle(self, requests: Sequence[Inputs]) -> list[Result]:
        return handle_rows(requests, self.parse, self.encode, lambda v: {"user_embedding": v})


# ----------------------------------------------------------------------------------------
# candidate_tower
# ----------------------------------------------------------------------------------------


class CandidateTowerService:
    """Candidate tower: one unit vector per (post_id, author_id) row."""

    def __init__(self, resources: PhoenixResources, compute_dtype=None, rows_per_call=256):
        self.resources = resources
        self.engine = RetrievalEngine(
            resources.config.retrieval_config(),
            resources.artifacts.retrieval_params,
            compute_dtype=compute_dtype,
            candidate_chunk=rows_per_call,  # one compiled program of this many rows
        )

    def warm_up(self) -> int:
        self.embed(np.ones(1, np.int64), np.ones(1, np.int64))
        return 1

    def parse(self, inputs: Inputs) -> np.ndarray:
        checks.check_unknown_inputs(inputs, set(contracts.CANDIDATE_TOWER.input_names))
        posts = checks.get_input(inputs, "post_id", "int", 2)
        authors = checks.get_input(inputs, "author_id", "int", 2)
        checks.check_same_rows({"post_id": posts, "author_id": authors})
        for name, ids in (("post_id", posts), ("author_id", authors)):
            if ids.shape[1] != 1:
                raise checks.InputError(f"input '{name}': expected one id per row, got {ids.shape}")
        checks.check_ids("post_id", posts, minimum=1)
        checks.check_ids("author_id", authors)
        return np.concatenate([posts, authors], axis=1).astype(np.int64)  # [n, 2] rows

    def embed(self, post_ids: np.ndarray, author_ids: np.ndarray) -> np.ndarray:
        _, (post_emb, author_emb) = self.resources.candidate_features(post_ids, author_ids)
        return self.engine.encode_candidates(post_emb, author_emb)  # [n, D]

    def embed_rows(self, rows: Sequence[np.ndarray]) -> np.ndarray:
        ids = np.stack(rows)  # [n, 2]: post id, author id
        return self.embed(ids[:, 0], ids[:, 1])

    def handle(self, requests: Sequence[Inputs]) -> list[Result]:
        pack = lambda v: {"candidate_embedding": v}  # noqa: E731
        return handle_rows(requests, self.parse, self.embed_rows, pack)


# ----------------------------------------------------------------------------------------
# retriever
# ----------------------------------------------------------------------------------------


class RetrieverService:
    """Exact top-k of a user vector over the corpus, excluding the user's history."""

    def __init__(
        self,
        resources: PhoenixResources,
        corpus_file: str = "corpus.npz",
        compute_dtype=None,
        batch_buckets: Sequence[int] = contracts.RETRIEVER.batch_buckets,
    ):
        self.config = resources.config
        self.corpus: Corpus = load_corpus(resolve_inside(resources.root, corpus_file), self.config)
        self.engine = RetrievalEngine(
            self.config.retrieval_config(),
            resources.artifacts.retrieval_params,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
        )
        self.engine.set_corpus(self.corpus.embeddings)
        order = np.argsort(self.corpus.post_ids)
        self._sorted_ids = self.corpus.post_ids[order]
        self._sorted_index = order

    def warm_up(self) -> int:
        return self.engine.warm_up()

    def parse(self, inputs: Inputs) -> list[tuple[np.ndarray, int, np.ndarray]]:
        checks.check_unknown_inputs(inputs, set(contracts.RETRIEVER.input_names))
        users = checks.get_input(inputs, "user_embedding", "float", 2)
        top_k = checks.get_input(inputs, "top_k", "int", 2)
        seen = checks.get_input(inputs, "history_post_ids", "int", 2, required=False)
        checks.check_same_rows({"user_embedding": users, "top_k": top_k, "history_post_ids": seen})
        D = self.config.emb_size
        if users.shape[1] != D:
            raise checks.InputError(
                f"input 'user_embedding': expected {D} values per row, got shape {users.shape}"
            )
        if top_k.shape[1] != 1:
            raise checks.InputError(f"input 'top_k': expected one value per row, got {top_k.shape}")
        checks.check_range("top_k", top_k, 1, checks.LIMITS.max_top_k, "top_k")
        if seen is not None:
            checks.check_ids("history_post_ids", seen)
            checks.check_limit(
                "history_post_ids", seen.shape[1], checks.LIMITS.max_history_items, "ids"
            )
        empty = np.zeros(0, np.int64)
        return [
            (users[r].astype(np.float32), int(top_k[r, 0]), empty if seen is None else seen[r])
            for r in range(users.shape[0])
        ]

    def corpus_indices(self, post_ids: np.ndarray) -> np.ndarray:
        """Corpus positions of the ids that are in the corpus."""
        pos = np.searchsorted(self._sorted_ids, post_ids)
        pos = np.clip(pos, 0, len(self._sorted_ids) - 1)
        found = self._sorted_ids[pos] == post_ids
        return self._sorted_index[pos[found]]

    def retrieve(self, rows: Sequence[tuple]) -> list[Outputs]:
        size = len(self.corpus.post_ids)
        seen = [np.unique(self.corpus_indices(np.asarray(row[2], np.int64))) for row in rows]
        users = np.stack([row[0] for row in rows])
        largest_k = max(row[1] for row in rows)
        indices, scores = self.engine.top_k(users, largest_k, exclude_indices=seen)
        outputs = []
        for r, (_, k, _) in enumerate(rows):
            keep = min(k, size - len(seen[r]))  # never return excluded entries
            idx = indices[r, :keep]
            outputs.append(
                {
                    "post_ids": self.corpus.post_ids[idx],
                    "author_ids": self.corpus.author_ids[idx],
                    "retrieval_scores": scores[r, :keep].astype(np.float32),
                }
            )
        return outputs

    def handle(self, requests: Sequence[Inputs]) -> list[Result]:
        return handle_rows(requests, self.parse, self.retrieve, stack_rows)
