"""Users to send to the served models: generated from an artifact corpus, or read from JSON.

The command-line clients, the load test, the serving benchmark and the tests draw their
requests from here. A user is a dict in the ``example_sequence.json`` format (plain lists of
numbers), which ``phoenix.client.client`` turns into request tensors.

A tool beside the library, not part of it: nothing under ``phoenix/`` sends users, so it lives
with its first users, the clients (the others import it as ``clients.workload``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.checkpoint import ArtifactError, ExampleSequence, load_config, load_corpus
from phoenix.config import ArtifactConfig
from phoenix.feed_examples import production_features

MAX_RANDOM_CANDIDATES = 512  # generated users get 1..512 candidates unless told otherwise


@dataclass(frozen=True)
class CorpusIds:
    """Post ids and their authors, to draw realistic histories and candidates from."""

    post_ids: np.ndarray
    author_ids: np.ndarray

    @classmethod
    def load(cls, artifacts: Path, config: ArtifactConfig, corpus_file: str = "corpus.npz"):
        corpus = load_corpus(Path(artifacts) / corpus_file, config)
        return cls(corpus.post_ids, corpus.author_ids)

    def draw(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``count`` posts, distinct while the corpus has enough of them."""
        replace = count > len(self.post_ids)
        picks = rng.choice(len(self.post_ids), size=count, replace=replace)
        return self.post_ids[picks], self.author_ids[picks]

    def retrieved_count(self, top_k: int, history: np.ndarray) -> int:
        """What the retriever returns: top_k, unless the corpus minus the history is smaller."""
        seen = np.isin(self.post_ids, history).sum()
        return int(min(top_k, len(self.post_ids) - seen))


def random_sequence(
    rng: np.random.Generator,
    config: ArtifactConfig,
    corpus: CorpusIds,
    history_len: Optional[int] = None,
    num_candidates: Optional[int] = None,
    top_k: Optional[int] = None,
) -> dict[str, Any]:
    """One random user in the example_sequence.json format (plain lists of numbers); for a
    production-family ranker with its features (semantic IDs, impression context, profile)."""
    if history_len is None:
        history_len = int(rng.integers(0, config.history_seq_len + 1))
    if num_candidates is None:
        num_candidates = int(rng.integers(1, MAX_RANDOM_CANDIDATES + 1))
    posts, authors = corpus.draw(rng, history_len + num_candidates)
    actions = (rng.random((history_len, config.num_actions)) < 0.1).astype(np.int64)
    actions[np.arange(history_len), rng.integers(0, config.num_actions, history_len)] = 1
    surfaces = config.product_surface_vocab_size
    user = {
        "user_id": int(rng.integers(1, 2**62)),
        "history_post_ids": posts[:history_len].tolist(),
        "history_author_ids": authors[:history_len].tolist(),
        "history_actions": actions.tolist(),
        "history_product_surface": rng.integers(0, surfaces, history_len).tolist(),
        "history_dwell_seconds": np.round(rng.exponential(8.0, history_len), 2).tolist(),
        "candidate_post_ids": posts[history_len:].tolist(),
        "candidate_author_ids": authors[history_len:].tolist(),
        "candidate_product_surface": rng.integers(0, surfaces, num_candidates).tolist(),
        "top_k": int(top_k if top_k is not None else rng.integers(10, 201)),
    }
    if config.ranker_family == "production":
        user.update(production_features(rng, posts[:history_len], posts[history_len:]))
    return user


def read_sequence(path: Path, config: ArtifactConfig) -> dict[str, Any]:
    """A user from a JSON file in the example_sequence.json format, validated."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: not readable JSON ({error})") from None
    return ExampleSequence.from_dict(data, str(path), config).to_dict()


def with_action_width(user: Mapping[str, Any], num_actions: int) -> dict[str, Any]:
    """A copy whose history_actions is an [L, A] array, so an empty history keeps its width."""
    actions = np.asarray(user["history_actions"], np.float32)
    return {**user, "history_actions": actions.reshape(len(user["history_post_ids"]), num_actions)}


def random_users(
    artifacts: Path, count: int, seed: int, **sizes: Optional[int]
) -> list[dict[str, Any]]:
    """``count`` random users (``sizes``: history_len, num_candidates, top_k), actions [L, A]."""
    config = load_config(artifacts)
    corpus = CorpusIds.load(artifacts, config)
    rng = np.random.default_rng(seed)
    return [
        with_action_width(random_sequence(rng, config, corpus, **sizes), config.num_actions)
        for _ in range(count)
    ]
