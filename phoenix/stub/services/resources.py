"""The artifacts a device service loads once per model instance (config, weights, the hash
embedder) and the programs compiled beside them. Imports JAX (through the model code), which
is why it is apart from ``common``: the host-only services never load it.

Shape glossary (B rows of a batch)
  S  history_seq_len   nU / nI / nA  user / item / author hashes   N  continuous actions (8)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Union

import numpy as np

from phoenix.checkpoint import Artifacts, load_artifacts
from phoenix.engine.programs import ProgramStore
from phoenix.hashing import HashEmbedder
from phoenix.recsys_model import DWELL_TIME_INDEX, NUM_CONTINUOUS

PARTS = ("ranker", "retrieval", "tables")  # of an artifact directory, loaded on demand


class PhoenixResources:
    """Artifacts loaded once per model instance: config, weights and the hash embedder."""

    def __init__(self, artifact_dir: Union[str, Path], parts: Sequence[str] = PARTS):
        unknown = set(parts) - set(PARTS)
        if unknown:
            raise ValueError(f"unknown artifact parts {sorted(unknown)}; known: {PARTS}")
        self.parts = tuple(parts)
        self.root = Path(artifact_dir)

        def remember(name, compute):  # once the config is read and checked
            return ProgramStore.beside(self.root).remembered(name, compute)

        self.artifacts: Artifacts = load_artifacts(
            artifact_dir, **{part: part in parts for part in PARTS}, remember=remember
        )
        self.config = self.artifacts.config
        self.embedder = self.artifacts.embedder() if "tables" in parts else None
        # Compiled programs beside the artifacts (phoenix-compile fills it; docs/serving.md),
        # and the weights' expected shapes, found by tracing the model once
        self.programs = ProgramStore.beside(self.root)

    def hash_embedder(self) -> HashEmbedder:
        """The hash embedder, which only resources loaded with "tables" have."""
        if self.embedder is None:
            raise ValueError(f"{self.root}: loaded without its hash tables ({self.parts})")
        return self.embedder

    def user_features(self, users):
        """Hashes and embeddings of the user + history part of a padded batch (``batches``;
        the RecsysBatch and RecsysEmbeddings fields; candidates left out). A batch without
        dwell times (the user tower's contract has none) gets zeros."""
        e = self.hash_embedder()
        user_hashes, user_rows = e.hash_users(users.user_id)  # [B, nU]
        post_hashes, post_rows = e.hash_items(users.history_post_ids)  # [B, S, nI]
        author_hashes, author_rows = e.hash_authors(users.history_author_ids)  # [B, S, nA]
        dwell = getattr(users, "history_dwell_seconds", None)  # [B, S]
        if dwell is None:
            dwell = np.zeros(users.history_post_ids.shape, np.float32)
        continuous = np.zeros(dwell.shape + (NUM_CONTINUOUS,), np.float32)  # [B, S, N]
        continuous[:, :, DWELL_TIME_INDEX] = dwell
        hashes = dict(
            user_hashes=user_hashes,
            history_post_hashes=post_hashes,
            history_author_hashes=author_hashes,
            history_actions=users.history_actions,
            history_product_surface=users.history_product_surface,
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
        e = self.hash_embedder()
        post_hashes, post_rows = e.hash_items(post_ids)
        author_hashes, author_rows = e.hash_authors(author_ids)
        return (post_hashes, author_hashes), (e.lookup(post_rows), e.lookup(author_rows))


# This process's resources by artifact directory: recommend's chain runs the user tower, the
# retriever and the ranker in one process, over one copy of the weights and tables.
_SHARED: dict[Path, PhoenixResources] = {}


def load_shared(artifact_dir: Union[str, Path], parts: Sequence[str] = PARTS) -> PhoenixResources:
    """Every part of ``artifact_dir`` loaded once for this process (``resources_for`` then
    hands it to each service of the directory)."""
    key = Path(artifact_dir).resolve()
    loaded = _SHARED.get(key)
    if loaded is None or not set(parts) <= set(loaded.parts):
        _SHARED[key] = PhoenixResources(key, PARTS)
    return _SHARED[key]


def resources_for(artifact_dir: Union[str, Path], parts: Sequence[str]) -> PhoenixResources:
    """The resources of ``artifact_dir`` holding at least ``parts``: this process's shared
    copy when ``load_shared`` made one, else loaded for the caller alone (a model's stub loads
    only what its service reads)."""
    shared = _SHARED.get(Path(artifact_dir).resolve())
    if shared is not None and set(parts) <= set(shared.parts):
        return shared
    return PhoenixResources(artifact_dir, parts)
