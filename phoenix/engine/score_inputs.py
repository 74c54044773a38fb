"""The score path's inputs: the original model's hashed features (``RecsysBatch``,
``RecsysEmbeddings``) padded on the host to a batch bucket and a candidate width, split into the
context (user and history) and the candidates, as ``DeviceRanker.score``'s program takes them.

Imports numpy, the engine's kernels and batching helpers, and the model layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from phoenix.engine import kernels
from phoenix.engine.batching import pad_axis
from phoenix.recsys_model import PhoenixModelConfig, RecsysBatch, RecsysEmbeddings

# The candidate fields of a context-only batch: None, which the context pass never reads, where
# RecsysBatch and RecsysEmbeddings (the original's API) type every candidate field as an array.
NOT_READ: Any = None


def context_features(
    config: PhoenixModelConfig, batch: RecsysBatch, emb: RecsysEmbeddings, rows: int
) -> tuple[RecsysBatch, RecsysEmbeddings]:
    """User and history fields padded to ``rows`` users; candidate fields left out."""

    def pad(x, dtype):
        return pad_axis(np.asarray(x, dtype), 0, rows)

    continuous = batch.history_continuous_actions
    if continuous is None:  # zeros are what the model uses for None (dwell 0 s)
        users, seq = np.shape(batch.history_product_surface)
        continuous = np.zeros((users, seq, config.num_continuous_actions), np.float32)
    context = RecsysBatch(
        user_hashes=pad(batch.user_hashes, np.int32),
        history_post_hashes=pad(batch.history_post_hashes, np.int32),
        history_author_hashes=pad(batch.history_author_hashes, np.int32),
        history_actions=pad(batch.history_actions, np.float32),
        history_product_surface=pad(batch.history_product_surface, np.int32),
        candidate_post_hashes=NOT_READ,
        candidate_author_hashes=NOT_READ,
        candidate_product_surface=NOT_READ,
        history_continuous_actions=pad(continuous, np.float32),
        candidate_impr_ts=None,
        candidate_post_creation_ts=None,
        user_ip_hashes=None,
    )
    context_emb = RecsysEmbeddings(
        user_embeddings=pad(emb.user_embeddings, np.float32),
        history_post_embeddings=pad(emb.history_post_embeddings, np.float32),
        history_author_embeddings=pad(emb.history_author_embeddings, np.float32),
        candidate_post_embeddings=NOT_READ,
        candidate_author_embeddings=NOT_READ,
    )
    return context, context_emb


def candidate_features(
    batch: RecsysBatch, emb: RecsysEmbeddings, rows: int, width: int
) -> kernels.CandidateInputs:
    """Every candidate of every user, padded to ``rows`` x ``width``."""

    def pad(x, dtype):
        return pad_axis(pad_axis(np.asarray(x, dtype), 1, width), 0, rows)

    post_hashes = np.asarray(batch.candidate_post_hashes)  # [B, C, nI]
    impr, created = batch.candidate_impr_ts, batch.candidate_post_creation_ts
    if impr is None or created is None:  # timestamp 0 = unknown age, as the model's None
        impr = created = np.zeros(post_hashes.shape[:2], np.int32)
    return kernels.CandidateInputs(
        valid=pad(post_hashes[:, :, 0] != 0, bool),
        product_surface=pad(batch.candidate_product_surface, np.int32),
        impr_ts=pad(impr, np.int32),
        creation_ts=pad(created, np.int32),
        post_embeddings=pad(emb.candidate_post_embeddings, np.float32),
        author_embeddings=pad(emb.candidate_author_embeddings, np.float32),
    )
