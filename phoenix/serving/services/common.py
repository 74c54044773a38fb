"""What every service shares: request types, user-history parsing and stacking, the
artifacts an instance loads, and the parse-run-split loop over a batch of requests.

A service receives the inputs of every request of one Triton ``execute`` call, checks each
request on its own (a bad one gets an ``InputError``, the others are unaffected), stacks the
good ones into one padded batch, makes one engine call and splits the results per request.

Shape glossary (per request: leading dimension R = rows, usually one user)
  L  history items sent     S  history_seq_len (the newest S items are used)
  C  candidates sent        D  emb_size     A  num_actions    M  corpus size
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np

from phoenix.checkpoint import Artifacts, load_artifacts

# The history_continuous_actions width is the device ranker's: the host reference path
# builds the same features.
from phoenix.engine.device_ranking import NUM_CONTINUOUS
from phoenix.recsys_model import DWELL_TIME_INDEX
from phoenix.serving import contracts
from phoenix.serving.requests import (
    LIMITS,
    InputError,
    check_ids,
    check_limit,
    check_range,
    check_same_length,
    check_same_rows,
    get_input,
)

logger = logging.getLogger(__name__)

Inputs = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
Result = Union[Outputs, InputError]


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

    def user_features(self, users: UserRows):
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


def stack_rows(outputs: Sequence[Outputs]) -> Outputs:
    """Stack per-row outputs of one request; ragged rows are cut to the shortest."""
    shortest = min(len(next(iter(o.values()))) for o in outputs)
    return {name: np.stack([o[name][:shortest] for o in outputs]) for name in outputs[0]}
