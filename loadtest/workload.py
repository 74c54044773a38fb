"""What the load test sends: pools of prepared, varied requests drawn from an artifact
directory's corpus (rank, recommend, retrieve), and by-id recommend requests for a trained
world's users drawn by Zipf's law. No Locust here: the locustfile sends what this prepares."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from clients.workload import CorpusIds, random_sequence, with_action_width
from loadtest.checks import (
    Check,
    check_by_id,
    check_filtered,
    check_ranking,
    check_retrieved,
    check_user_embedding,
)
from phoenix.checkpoint import load_config
from phoenix.client.client import infer_inputs, model_inputs, recommend_inputs
from phoenix.schema.wiring import next_step_inputs, passed_on_history
from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.world.popularity import ZipfUsers, user_stream

DEFAULT_ARTIFACTS = "artifacts/demo"
DEFAULT_WORLD = "artifacts/trained-demo"  # shipped: the world its users come from
DEFAULT_BY_ID_USERS = 1000
BY_ID_TAG = "recommend_by_id"  # its task's tag and its requests' name in Locust's tables
BY_ID_WEIGHT = 2
BY_ID_FILTERED_SHARE = 0.25
TASK_WEIGHTS = {"rank": 3, "recommend": 2, "retrieve": 1}
MAX_CANDIDATES = 512
TOP_K_RANGE = (10, 200)
FILTERED_SHARE = 0.5  # recommend requests carrying the feed policy's filters
# Seconds a user waits after each answer before its next request, drawn uniformly from
# (low, high): close to a closed loop by default, lighter traffic with a longer pause.
THINK_TIME_S = (0.0, 0.1)


def think_time_text(seconds: tuple[float, float]) -> str:
    """(low, high) as ``--think-time`` takes it: "0.0,0.1"."""
    return ",".join(repr(float(s)) for s in seconds)


def think_time_arg(text: str) -> tuple[float, float]:
    """``--think-time LOW,HIGH`` (seconds) as (low, high); argparse's error otherwise."""
    import argparse

    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected LOW,HIGH in seconds (e.g. 0,0.1), got {text!r}"
        ) from None
    if not 0 <= low <= high < math.inf:
        raise argparse.ArgumentTypeError(f"expected 0 <= LOW <= HIGH, finite, got {text!r}")
    return low, high


@dataclass(frozen=True)
class Prepared:
    """One request: its model, input arrays and the check of its answer."""

    model: str
    arrays: dict[str, np.ndarray]
    check: Check
    chain: Optional[dict[str, np.ndarray]] = None  # retrieve only: the recommend request
    expected: int = 0  # retrieve only: how many posts the retriever must return
    name: str = ""  # the name in Locust's tables, when not the model's
    # the request encoded per protocol, built on first use (pooled requests are sent many times)
    encoded: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.name or self.model


def http_body(arrays: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """KServe v2 request body with binary tensors, and the length of its JSON header."""
    inputs = infer_inputs(httpclient, arrays)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)
    return body, len(body) if json_size is None else json_size


def rank_geometry(
    config, history: Optional[int] = None, candidates: Optional[int] = None
) -> tuple[Optional[int], Optional[int]]:
    """(history items, candidates) of the rank requests, None: random. A production-family
    ranker's default is its own geometry, a full history and its candidate_seq_len (X's nano:
    1,022 x 64), every production input filled (``feed_examples``)."""
    if config.ranker_family == "production":
        history = config.history_seq_len if history is None else history
        candidates = config.candidate_seq_len if candidates is None else candidates
    return history, candidates


class Workload:
    """Pools of random users per task, ids drawn from the artifact directory's corpus; rank
    requests of ``history`` x ``candidates`` (``rank_geometry``)."""

    def __init__(
        self,
        artifacts: Path,
        pool_size: int = 64,
        seed: int = 0,
        history: Optional[int] = None,
        candidates: Optional[int] = None,
    ):
        self.config = load_config(artifacts)
        self.corpus = CorpusIds.load(artifacts, self.config)
        self.rng = np.random.default_rng(seed)
        self.history, self.candidates = rank_geometry(self.config, history, candidates)
        self.pools = {name: [self.prepare(name) for _ in range(pool_size)] for name in TASK_WEIGHTS}

    def user(self, **kwargs) -> dict[str, Any]:
        seq = random_sequence(self.rng, self.config, self.corpus, **kwargs)
        return with_action_width(seq, self.config.num_actions)

    def prepare(self, task_name: str) -> Prepared:
        if task_name == "rank" and self.config.ranker_family == "production":
            return self.production_rank()
        seq = self.user(top_k=int(self.rng.integers(TOP_K_RANGE[0], TOP_K_RANGE[1] + 1)))
        request = recommend_inputs(seq)  # the user's tensors and top_k
        own = {"user_state": passed_on_history(request)}  # the step a with-history request skips
        users = next_step_inputs(request, own, "user_encoder")
        history = users["history_post_ids"][0]
        if task_name == "rank":
            count = self.candidates or int(self.rng.integers(1, MAX_CANDIDATES + 1))
            posts, authors = self.corpus.draw(self.rng, count)
            arrays = {
                **users,
                "candidate_post_ids": posts[None],
                "candidate_author_ids": authors[None],
            }
            return Prepared("ranker", arrays, check_ranking(posts, self.config.num_actions))
        expected = self.corpus.retrieved_count(seq["top_k"], history)
        if task_name == "recommend" and self.rng.random() < FILTERED_SHARE:
            # the feed policy's filters: a few corpus posts seen, a few authors excluded
            seen, _ = self.corpus.draw(self.rng, 20)
            _, excluded = self.corpus.draw(self.rng, 5)
            request["seen_post_ids"], request["excluded_author_ids"] = seen[None], excluded[None]
            return Prepared("recommend", request, check_filtered(expected, history, seen, excluded))
        if task_name == "recommend":
            extra = ("retrieval_scores", "ranked_author_ids")
            check = check_retrieved(
                "recommend", expected, history, "ranked_post_ids", "scores", extra
            )
            return Prepared("recommend", request, check)
        check = check_user_embedding(self.config.emb_size)
        return Prepared("user_encoder", users, check, request, expected)

    def production_rank(self) -> Prepared:
        """A ranker request with every input of X's production ranker (semantic IDs,
        impression context, profile), at the workload's geometry."""
        seq = self.user(history_len=self.history, num_candidates=self.candidates)
        posts = np.asarray(seq["candidate_post_ids"], np.int64)
        arrays = model_inputs("ranker", seq)
        return Prepared("ranker", arrays, check_ranking(posts, self.config.num_actions))

    def pick(self, task_name: str, rng: np.random.Generator) -> Prepared:
        pool = self.pools[task_name]
        return pool[int(rng.integers(len(pool)))]

    def retriever_step(self, prepared: Prepared, embedding: np.ndarray) -> Prepared:
        """The retriever request that follows a user_encoder answer, as the ensemble wires it."""
        assert prepared.chain is not None  # a "retrieve" request (pick("retrieve"))
        done = {
            "user_state": passed_on_history(prepared.chain),
            "user_encoder": {"user_embedding": embedding},
        }
        arrays = next_step_inputs(prepared.chain, done, "retriever")
        history = arrays["history_post_ids"][0]
        check = check_retrieved(
            "retriever", prepared.expected, history, "post_ids", "retrieval_scores", ("author_ids",)
        )
        return Prepared("retriever", arrays, check)

    def http_body(self, prepared: Prepared) -> tuple[bytes, int]:
        if "http" not in prepared.encoded:
            prepared.encoded["http"] = http_body(prepared.arrays)
        return prepared.encoded["http"]

    def grpc_inputs(self, prepared: Prepared) -> list:
        if "grpc" not in prepared.encoded:
            prepared.encoded["grpc"] = infer_inputs(grpcclient, prepared.arrays)
        return prepared.encoded["grpc"]


class ByIdTraffic:
    """recommend requests carrying only `user_id` and `top_k` (a quarter also the feed
    filters), for users drawn by Zipf's law; each Locust user draws from its own stream."""

    def __init__(self, users: ZipfUsers, corpus: CorpusIds, seed: int):
        self.users, self.corpus, self.seed = users, corpus, seed
        self.next_client = itertools.count()

    def stream(self) -> np.random.Generator:
        return user_stream(self.seed, next(self.next_client))

    def prepare(self, rng: np.random.Generator) -> Prepared:
        top_k = int(rng.integers(TOP_K_RANGE[0], TOP_K_RANGE[1] + 1))
        values = {"user_id": self.users.draw(rng), "top_k": top_k}
        seen, excluded = np.zeros(0, np.int64), np.zeros(0, np.int64)
        if rng.random() < BY_ID_FILTERED_SHARE:
            seen, _ = self.corpus.draw(rng, 20)
            _, excluded = self.corpus.draw(rng, 5)
            values["seen_post_ids"], values["excluded_author_ids"] = seen, excluded
        arrays = model_inputs("recommend", values)  # the contract's dtypes and shapes
        return Prepared("recommend", arrays, check_by_id(top_k, seen, excluded), name=BY_ID_TAG)


def by_id_population(world_dir: Path, count: int, s: float, store_url: str) -> ZipfUsers:
    """The first ``count`` users of the trained world of ``world_dir``, loaded into the store at
    ``store_url`` when one is given (their engagements, follows and the authors' posts)."""
    from phoenix.checkpoint import ArtifactError
    from phoenix.world.users import WorldUsers, load_users

    try:
        world = WorldUsers.from_artifacts(world_dir)
    except ArtifactError as error:
        raise SystemExit(f"--by-id-world: {error}") from None
    population = world.population(count)
    if store_url:
        loaded = load_users(UserStateStore(connect_store(store_url)), world, population)
        print(loaded.summary(store_url), flush=True)
    return ZipfUsers(world.user_ids[population], s)


def by_id_selected(options) -> bool:
    """Whether Locust's --tags / --exclude-tags leave the by-id task in."""
    tags, excluded = getattr(options, "tags", None), getattr(options, "exclude_tags", None)
    return (not tags or BY_ID_TAG in tags) and BY_ID_TAG not in (excluded or [])
