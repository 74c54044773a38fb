"""What each served model does, free of Triton: requests in, outputs (or errors) out.

A service receives the inputs of every request of one Triton ``execute`` call, checks each
request on its own (a bad one gets an ``InputError``, the others are unaffected), stacks the
good ones into one padded batch, makes one engine call and splits the results per request.

Shape glossary (per request: leading dimension R = rows, usually one user)
  L  history items sent     S  history_seq_len (the newest S items are used)
  C  candidates sent        D  emb_size     A  num_actions    M  corpus size
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from phoenix.checkpoint import Artifacts, Corpus, load_artifacts, load_corpus, resolve_inside
from phoenix.engine import RetrievalEngine
from phoenix.engine.device_ranking import DeviceRanker, RankedBatch, RankRequestBatch
from phoenix.hashing import entity_hashes
from phoenix.recsys_model import DWELL_TIME_INDEX, RecsysBatch, RecsysEmbeddings
from phoenix.serving import contracts
from phoenix.serving.requests import (
    LIMITS,
    InputError,
    check_ids,
    check_limit,
    check_range,
    check_same_length,
    check_same_rows,
    check_unknown_inputs,
    get_input,
)

logger = logging.getLogger(__name__)

Inputs = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
Result = Union[Outputs, InputError]

NUM_CONTINUOUS = 8  # width of history_continuous_actions (dwell time is column 1)
REFERENCE_TIME = 1_700_000_000  # impression time used to turn post ages into timestamps

# Input names each service accepts, from the served models' contracts.
USER_INPUTS = set(contracts.USER_ENCODER.input_names) | {"history_dwell_seconds"}


@dataclass
class UserRows:
    """Users of several requests, history truncated to the newest S and right-padded."""

    user_ids: np.ndarray  # [R] int64
    post_ids: np.ndarray  # [R, S] int64, 0 = padding
    author_ids: np.ndarray  # [R, S] int64
    actions: np.ndarray  # [R, S, A] float32
    surfaces: np.ndarray  # [R, S] int32
    dwell: Optional[np.ndarray]  # [R, S] float32 seconds, None when no request sent any


def parse_user_rows(inputs: Inputs, num_actions: int, surface_vocab: int) -> list[dict]:
    """Checked per-row history of one request (rows = leading dimension)."""
    user = get_input(inputs, "user_id", "int", 2)
    posts = get_input(inputs, "history_post_ids", "int", 2)
    authors = get_input(inputs, "history_author_ids", "int", 2)
    actions = get_input(inputs, "history_actions", "float", 3)
    surfaces = get_input(inputs, "history_product_surface", "int", 2)
    dwell = get_input(inputs, "history_dwell_seconds", "float", 2, required=False)
    if user.shape[1] != 1:
        raise InputError(f"input 'user_id': expected one id per row, got shape {user.shape}")
    history = {
        "history_post_ids": posts,
        "history_author_ids": authors,
        "history_actions": actions,
        "history_product_surface": surfaces,
        "history_dwell_seconds": dwell,
    }
    check_same_rows({"user_id": user, **history})
    length = check_same_length(history, "history")
    check_limit("history_post_ids", length, LIMITS.max_history_items, "history items")
    if actions.shape[2] != num_actions:
        raise InputError(
            f"input 'history_actions': expected {num_actions} actions per item, "
            f"got shape {actions.shape}"
        )
    check_ids("user_id", user)
    check_ids("history_post_ids", posts)
    check_ids("history_author_ids", authors)
    check_range("history_actions", actions, 0, 1, "action flags")
    check_range("history_product_surface", surfaces, 0, surface_vocab - 1, "product surfaces")
    if dwell is not None:
        check_range("history_dwell_seconds", dwell, 0, np.inf, "dwell seconds")
    return [
        {
            "user_id": int(user[r, 0]),
            "post_ids": posts[r].astype(np.int64),
            "author_ids": authors[r].astype(np.int64),
            "actions": actions[r].astype(np.float32),
            "surfaces": surfaces[r].astype(np.int32),
            "dwell": None if dwell is None else dwell[r].astype(np.float32),
        }
        for r in range(user.shape[0])
    ]


def stack_user_rows(rows: Sequence[dict], history_len: int, num_actions: int) -> UserRows:
    """Keep the newest ``history_len`` items of each row and right-pad with zeros."""
    n = len(rows)

    def newest(values: np.ndarray) -> np.ndarray:
        return values[max(0, len(values) - history_len) :]

    def padded(key: str, dtype, tail=()) -> np.ndarray:
        out = np.zeros((n, history_len) + tail, dtype)
        for i, row in enumerate(rows):
            kept = newest(row[key])
            out[i, : len(kept)] = kept
        return out

    any_dwell = any(row["dwell"] is not None for row in rows)
    dwell = None
    if any_dwell:
        dwell = np.zeros((n, history_len), np.float32)
        for i, row in enumerate(rows):
            if row["dwell"] is not None:
                kept = newest(row["dwell"])
                dwell[i, : len(kept)] = kept
    return UserRows(
        user_ids=np.array([row["user_id"] for row in rows], np.int64),
        post_ids=padded("post_ids", np.int64),
        author_ids=padded("author_ids", np.int64),
        actions=padded("actions", np.float32, (num_actions,)),
        surfaces=padded("surfaces", np.int32),
        dwell=dwell,
    )


class PhoenixResources:
    """Artifacts loaded once per model instance: config, weights and the hash embedder."""

    def __init__(self, artifact_dir: Union[str, Path]):
        self.artifacts: Artifacts = load_artifacts(artifact_dir)
        self.config = self.artifacts.config
        self.embedder = self.artifacts.embedder()
        self.root = Path(artifact_dir)

    def user_features(self, users: UserRows, num_candidates: int = 0):
        """Hash and look up the user + history part of a batch (candidates left empty)."""
        e = self.embedder
        user_hashes, user_rows = e.hash_users(users.user_ids)  # [R, nU]
        post_hashes, post_rows = e.hash_items(users.post_ids)  # [R, S, nI]
        author_hashes, author_rows = e.hash_authors(users.author_ids)  # [R, S, nA]
        continuous = None
        if users.dwell is not None:
            continuous = np.zeros(users.dwell.shape + (NUM_CONTINUOUS,), np.float32)
            continuous[:, :, DWELL_TIME_INDEX] = users.dwell
        hashes = dict(
            user_hashes=user_hashes,
            history_post_hashes=post_hashes,
            history_author_hashes=author_hashes,
            history_actions=users.actions,
            history_product_surface=users.surfaces,
            history_continuous_actions=continuous,
        )
        embeddings = dict(
            user_embeddings=e.lookup(user_rows),
            history_post_embeddings=e.lookup(post_rows),
            history_author_embeddings=e.lookup(author_rows),
        )
        return hashes, embeddings

    def candidate_features(self, post_ids: np.ndarray, author_ids: np.ndarray):
        """Hashes and embeddings of candidate posts [..] and their authors [..]."""
        post_hashes, post_rows = self.embedder.hash_items(post_ids)
        author_hashes, author_rows = self.embedder.hash_authors(author_ids)
        return (post_hashes, author_hashes), (
            self.embedder.lookup(post_rows),
            self.embedder.lookup(author_rows),
        )


def _empty_candidates(rows: int, config) -> dict:
    """Zero-width candidate fields for user-tower batches."""
    return dict(
        candidate_post_hashes=np.zeros((rows, 0, config.num_item_hashes), np.int64),
        candidate_author_hashes=np.zeros((rows, 0, config.num_author_hashes), np.int64),
        candidate_product_surface=np.zeros((rows, 0), np.int32),
    )


def run_per_request(requests: Sequence[Inputs], parse) -> tuple[list, list[Result]]:
    """Parse each request on its own; returns (parsed rows per good request, result slots)."""
    parsed, results = [], []
    for inputs in requests:
        try:
            parsed.append(parse(inputs))
            results.append(None)
        except InputError as error:
            parsed.append(None)
            results.append(error)
    return parsed, results


def handle_rows(requests: Sequence[Inputs], parse, run, pack) -> list[Result]:
    """Parse each request into rows (a bad request keeps its error), run every good row in
    one call, and ``pack`` each request's slice of the outputs into its result."""
    parsed, results = run_per_request(requests, parse)
    rows = [row for rows_ in parsed if rows_ is not None for row in rows_]
    outputs = run(rows) if rows else []
    cursor = 0
    for i, rows_ in enumerate(parsed):
        if rows_ is not None:
            results[i] = pack(outputs[cursor : cursor + len(rows_)])
            cursor += len(rows_)
    return results


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
        check_unknown_inputs(inputs, USER_INPUTS)
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

    def __init__(self, resources: PhoenixResources, compute_dtype=None):
        self.resources = resources
        self.engine = RetrievalEngine(
            resources.config.retrieval_config(),
            resources.artifacts.retrieval_params,
            compute_dtype=compute_dtype,
        )

    def warm_up(self) -> int:
        self.embed(np.ones(1, np.int64), np.ones(1, np.int64))
        return 1

    def parse(self, inputs: Inputs) -> np.ndarray:
        check_unknown_inputs(inputs, set(contracts.CANDIDATE_TOWER.input_names))
        posts = get_input(inputs, "post_id", "int", 2)
        authors = get_input(inputs, "author_id", "int", 2)
        check_same_rows({"post_id": posts, "author_id": authors})
        for name, ids in (("post_id", posts), ("author_id", authors)):
            if ids.shape[1] != 1:
                raise InputError(f"input '{name}': expected one id per row, got {ids.shape}")
        check_ids("post_id", posts, minimum=1)
        check_ids("author_id", authors)
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
        check_unknown_inputs(inputs, set(contracts.RETRIEVER.input_names))
        users = get_input(inputs, "user_embedding", "float", 2)
        top_k = get_input(inputs, "top_k", "int", 2)
        seen = get_input(inputs, "history_post_ids", "int", 2, required=False)
        check_same_rows({"user_embedding": users, "top_k": top_k, "history_post_ids": seen})
        D = self.config.emb_size
        if users.shape[1] != D:
            raise InputError(
                f"input 'user_embedding': expected {D} values per row, got shape {users.shape}"
            )
        if top_k.shape[1] != 1:
            raise InputError(f"input 'top_k': expected one value per row, got {top_k.shape}")
        check_range("top_k", top_k, 1, LIMITS.max_top_k, "top_k")
        if seen is not None:
            check_ids("history_post_ids", seen)
            check_limit("history_post_ids", seen.shape[1], LIMITS.max_history_items, "ids")
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


def _pad_rows(x: np.ndarray, rows: int) -> np.ndarray:
    """Zero rows appended up to ``rows``."""
    return np.concatenate([x, np.zeros((rows - len(x),) + x.shape[1:], x.dtype)])


def ranked_outputs(row: dict, ranked: RankedBatch, r: int) -> Outputs:
    """Row ``r`` of a ranked batch as one request's outputs (its own candidates only)."""
    n = len(row["candidate_post_ids"])
    order = ranked.order[r, :n]  # padding sorts last, so the first n are this row's
    retrieval = row["candidate_retrieval_scores"]
    return {
        "ranked_post_ids": row["candidate_post_ids"][order],
        "scores": ranked.scores[r, :n],
        "action_probs": ranked.action_probs[r, :n],
        "ranked_retrieval_scores": (
            np.zeros(n, np.float32) if retrieval is None else retrieval[order]
        ),
    }


def stack_rows(outputs: Sequence[Outputs]) -> Outputs:
    """Stack per-row outputs of one request; ragged rows are cut to the shortest."""
    shortest = min(len(next(iter(o.values()))) for o in outputs)
    return {name: np.stack([o[name][:shortest] for o in outputs]) for name in outputs[0]}


# ----------------------------------------------------------------------------------------
# ranker
# ----------------------------------------------------------------------------------------

RANKER_CANDIDATE_INPUTS = set(contracts.RANKER.input_names) - USER_INPUTS


def parse_score_weights(text: str, action_names: Sequence[str]) -> np.ndarray:
    """Blend weights from JSON {"action name": weight}; unknown names fail loudly."""
    try:
        weights = json.loads(text) if text else {}
    except json.JSONDecodeError as error:
        raise ValueError(f"score_weights is not valid JSON ({error}): {text!r}") from None
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"score_weights must be a non-empty JSON object, got {text!r}")
    unknown = sorted(set(weights) - set(action_names))
    if unknown:
        raise ValueError(
            f"score_weights names unknown actions {unknown}; the artifact's actions are "
            f"{list(action_names)}"
        )
    vector = np.zeros(len(action_names), np.float32)
    for name, weight in weights.items():
        vector[list(action_names).index(name)] = float(weight)
    return vector


class RankerService:
    """Ranks each user's candidates by a weighted blend of action probabilities."""

    def __init__(
        self,
        resources: PhoenixResources,
        score_weights: str,
        compute_dtype=None,
        candidate_buckets: Sequence[int] = contracts.RANKER_CANDIDATE_BUCKETS,
        batch_buckets: Sequence[int] = contracts.RANKER.batch_buckets,
    ):
        self.resources = resources
        self.config = resources.config
        self.weights = parse_score_weights(score_weights, self.config.action_names)
        self.ranker = DeviceRanker(
            self.config.ranker_config(),
            resources.artifacts.ranker_params,
            resources.embedder.table,
            entity_hashes(self.config),
            self.weights,
            compute_dtype=compute_dtype,
            batch_buckets=batch_buckets,
            candidate_buckets=candidate_buckets,
        )

    def warm_up(self) -> int:
        return self.ranker.warm_up()

    def parse(self, inputs: Inputs) -> list[dict]:
        check_unknown_inputs(inputs, USER_INPUTS | RANKER_CANDIDATE_INPUTS)
        c = self.config
        rows = parse_user_rows(inputs, c.num_actions, c.product_surface_vocab_size)
        posts = get_input(inputs, "candidate_post_ids", "int", 2)
        authors = get_input(inputs, "candidate_author_ids", "int", 2)
        surfaces = get_input(inputs, "candidate_product_surface", "int", 2, required=False)
        ages = get_input(inputs, "candidate_post_age_seconds", "float", 2, required=False)
        retrieval = get_input(inputs, "candidate_retrieval_scores", "float", 2, required=False)
        candidates = {
            "candidate_post_ids": posts,
            "candidate_author_ids": authors,
            "candidate_product_surface": surfaces,
            "candidate_post_age_seconds": ages,
            "candidate_retrieval_scores": retrieval,
        }
        check_same_rows({"user_id": inputs["user_id"], **candidates})
        count = check_same_length(candidates, "candidate")
        check_limit("candidate_post_ids", count, LIMITS.max_candidates, "candidates")
        check_ids("candidate_post_ids", posts, minimum=1)
        check_ids("candidate_author_ids", authors)
        if surfaces is not None:
            check_range(
                "candidate_product_surface",
                surfaces,
                0,
                c.product_surface_vocab_size - 1,
                "product surfaces",
            )
        for r, row in enumerate(rows):
            row["candidate_post_ids"] = posts[r].astype(np.int64)
            row["candidate_author_ids"] = authors[r].astype(np.int64)
            row["candidate_product_surface"] = (
                np.zeros(count, np.int32) if surfaces is None else surfaces[r].astype(np.int32)
            )
            row["candidate_post_age_seconds"] = None if ages is None else ages[r]
            row["candidate_retrieval_scores"] = None if retrieval is None else retrieval[r]
        return rows

    def features(self, rows: Sequence[dict]) -> tuple[RecsysBatch, RecsysEmbeddings]:
        """The plain model's batch for ``rows`` (hashed and looked up on the host): what
        references and tests feed ``PhoenixModel``; serving hashes on the device instead."""
        c = self.config
        users = stack_user_rows(rows, c.history_seq_len, c.num_actions)
        hashes, embeddings = self.resources.user_features(users)
        width = max(len(row["candidate_post_ids"]) for row in rows)

        def padded(key: str, dtype) -> np.ndarray:
            out = np.zeros((len(rows), width), dtype)
            for i, row in enumerate(rows):
                out[i, : len(row[key])] = row[key]
            return out

        (post_h, author_h), (post_e, author_e) = self.resources.candidate_features(
            padded("candidate_post_ids", np.int64), padded("candidate_author_ids", np.int64)
        )
        impr = created = None
        if any(row["candidate_post_age_seconds"] is not None for row in rows):
            impr = np.zeros((len(rows), width), np.int64)  # 0 = unknown age
            created = np.zeros((len(rows), width), np.int64)
            for i, row in enumerate(rows):
                age = row["candidate_post_age_seconds"]
                if age is not None:
                    impr[i, : len(age)] = REFERENCE_TIME
                    created[i, : len(age)] = REFERENCE_TIME - np.floor(age).astype(np.int64)
        batch = RecsysBatch(
            **hashes,
            candidate_post_hashes=post_h,
            candidate_author_hashes=author_h,
            candidate_product_surface=padded("candidate_product_surface", np.int32),
            candidate_impr_ts=impr,
            candidate_post_creation_ts=created,
        )
        emb = RecsysEmbeddings(
            **embeddings, candidate_post_embeddings=post_e, candidate_author_embeddings=author_e
        )
        return batch, emb

    def rank(self, rows: Sequence[dict]) -> list[Outputs]:
        """Rank every row's candidates on the device, in groups of the largest batch bucket."""
        outputs: list[Outputs] = []
        largest = self.ranker.batch_buckets[-1]
        for start in range(0, len(rows), largest):
            group = rows[start : start + largest]
            ranked = self.ranker.rank(self.request_batch(group))
            outputs += [ranked_outputs(row, ranked, r) for r, row in enumerate(group)]
        return outputs

    def request_batch(self, rows: Sequence[dict]) -> RankRequestBatch:
        """Raw inputs of ``rows`` stacked and zero-padded to the ranker's bucket shape."""
        c = self.config
        most = max(len(row["candidate_post_ids"]) for row in rows)
        users_to, width = self.ranker.padded_shape(len(rows), most)
        users = stack_user_rows(rows, c.history_seq_len, c.num_actions)
        pad_users = lambda x: _pad_rows(x, users_to)  # noqa: E731
        dwell = users.dwell if users.dwell is not None else np.zeros(users.surfaces.shape)

        def candidates(key: str, dtype) -> np.ndarray:
            out = np.zeros((users_to, width), dtype)
            for i, row in enumerate(rows):
                if row[key] is not None:
                    out[i, : len(row[key])] = row[key]
            return out

        has_age = np.zeros((users_to, width), bool)
        for i, row in enumerate(rows):
            if row["candidate_post_age_seconds"] is not None:
                has_age[i, : len(row["candidate_post_ids"])] = True
        return RankRequestBatch(
            user_ids=pad_users(users.user_ids),
            history_post_ids=pad_users(users.post_ids),
            history_author_ids=pad_users(users.author_ids),
            history_actions=pad_users(users.actions),
            history_surfaces=pad_users(users.surfaces),
            history_dwell=pad_users(dwell.astype(np.float32)),
            candidate_post_ids=candidates("candidate_post_ids", np.int64),
            candidate_author_ids=candidates("candidate_author_ids", np.int64),
            candidate_surfaces=candidates("candidate_product_surface", np.int32),
            candidate_age_seconds=candidates("candidate_post_age_seconds", np.float32),
            candidate_has_age=has_age,
        )

    def handle(self, requests: Sequence[Inputs]) -> list[Result]:
        return handle_rows(requests, self.parse, self.rank, stack_rows)
