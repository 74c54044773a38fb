"""Phoenix two-tower retrieval model.

User tower: the Phoenix transformer over [user, history] with a causal mask, mean-pooled
over real tokens and L2-normalised. Candidate tower: post + author hash embeddings through a
small SiLU MLP (or a parameter-free mean) and L2-normalised. Retrieval is a dot product
against a normalised corpus followed by an exact top-k.

API-compatible with the original ``recsys_retrieval_model`` module, parameter names included
(``phoenix_retrieval_model/...``, ``.../~build_candidate_representation/candidate_tower/...``).

Shape glossary
  B  batch (users)      S  history length      C  candidates per row
  D  emb_size           N  corpus size         K  top_k
  h  hashes per candidate (item hashes + author hashes)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple

import haiku as hk
import jax
import jax.numpy as jnp

from phoenix.grok import Transformer, TransformerConfig
from phoenix.recsys_model import (
    HashConfig,
    RecsysBatch,
    RecsysEmbeddings,
    _PhoenixFeatures,
    block_history_reduce,
    block_user_reduce,
)

logger = logging.getLogger(__name__)

EPS = 1e-12  # squared-norm floor of every L2 normalisation
INF = 1e12  # score given to masked-out corpus entries (negated)


class RetrievalOutput(NamedTuple):
    user_representation: jax.Array  # [B, D]
    top_k_indices: jax.Array  # [B, K]
    top_k_scores: jax.Array  # [B, K]


def l2_normalize(x: jax.Array) -> jax.Array:
    """x / max(||x||, sqrt(EPS)) over the last axis."""
    squared = jnp.sum(x**2, axis=-1, keepdims=True)
    return x / jnp.sqrt(jnp.maximum(squared, EPS))


def masked_mean(tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of tokens [B, T, D] over the positions where mask [B, T] is set (>= 1 divisor)."""
    weights = mask.astype(jnp.float32)[:, :, None]  # [B, T, 1]
    total = jnp.sum(tokens * weights, axis=1)  # [B, D]
    return total / jnp.maximum(jnp.sum(weights, axis=1), 1.0)  # [B, D]


def candidate_tower_mlp(features: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """Normalised SiLU MLP over flattened hash embeddings [..., h*D] -> [..., D] (float32)."""
    hidden = jax.nn.silu(jnp.dot(features.astype(w1.dtype), w1))  # [..., 2D]
    return l2_normalize(jnp.dot(hidden.astype(w2.dtype), w2))  # [..., D]


@dataclass
class CandidateTower(hk.Module):
    """Maps stacked post + author hash embeddings [..., h, D] to unit vectors [..., D]."""

    emb_size: int
    enable_linear_proj: bool = True
    name: Optional[str] = None

    def __call__(self, post_author_embedding: jax.Array) -> jax.Array:
        dtype = post_author_embedding.dtype
        if not self.enable_linear_proj:
            return l2_normalize(jnp.mean(post_author_embedding, axis=-2)).astype(dtype)
        features = post_author_embedding.reshape(
            *post_author_embedding.shape[:-2], -1
        )  # [..., h*D]
        w1 = hk.get_parameter(
            "candidate_tower_projection_1",
            [features.shape[-1], 2 * self.emb_size],
            jnp.float32,
            init=hk.initializers.VarianceScaling(1.0, mode="fan_out"),
        )
        w2 = hk.get_parameter(
            "candidate_tower_projection_2",
            [2 * self.emb_size, self.emb_size],
            jnp.float32,
            init=hk.initializers.VarianceScaling(1.0, mode="fan_out"),
        )
        return candidate_tower_mlp(features, w1, w2).astype(dtype)

    def initialize(self):
        return self

    def make(self):
        return self


@dataclass
class PhoenixRetrievalModelConfig:
    """Configuration of the retrieval model."""

    model: TransformerConfig
    emb_size: int
    history_seq_len: int = 128
    candidate_seq_len: int = 32
    name: Optional[str] = None
    fprop_dtype: Any = jnp.bfloat16
    hash_config: Optional[HashConfig] = None
    product_surface_vocab_size: int = 16
    enable_linear_proj: bool = True

    _initialized: bool = False

    def __post_init__(self):
        if self.hash_config is None:
            self.hash_config = HashConfig()

    def initialize(self):
        self._initialized = True
        return self

    def make(self) -> PhoenixRetrievalModel:
        if not self._initialized:
            self.initialize()
        return PhoenixRetrievalModel(
            model=self.model.make(), config=self, fprop_dtype=self.fprop_dtype
        )


def user_history_tokens(
    module: _PhoenixFeatures, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
) -> Tuple[jax.Array, jax.Array]:
    """Retrieval user-tower input: [user, history] tokens [B, 1+S, D] and mask [B, 1+S]."""
    config = module.config
    hashes = config.hash_config
    D = config.emb_size
    surface = module._single_hot_to_embeddings(
        batch.history_product_surface,
        config.product_surface_vocab_size,
        D,
        "product_surface_embedding_table",
    )  # [B, S, D]
    actions = module._get_action_embeddings(jnp.asarray(batch.history_actions))  # [B, S, D]
    user, user_mask = block_user_reduce(
        jnp.asarray(batch.user_hashes),
        jnp.asarray(recsys_embeddings.user_embeddings),
        hashes.num_user_hashes,
        D,
        1.0,
    )
    history, history_mask = block_history_reduce(
        jnp.asarray(batch.history_post_hashes),
        jnp.asarray(recsys_embeddings.history_post_embeddings),
        jnp.asarray(recsys_embeddings.history_author_embeddings),
        surface,
        actions,
        hashes.num_item_hashes,
        hashes.num_author_hashes,
        1.0,
    )
    tokens = jnp.concatenate([user, history], axis=1)  # [B, 1+S, D]
    mask = jnp.concatenate([user_mask, history_mask], axis=1)  # [B, 1+S]
    return tokens, mask


@dataclass
class PhoenixRetrievalModel(_PhoenixFeatures, hk.Module):
    """Two-tower retrieval: user tower, candidate tower and exact top-k over a corpus."""

    model: Transformer
    config: PhoenixRetrievalModelConfig
    fprop_dtype: Any = jnp.bfloat16
    name: Optional[str] = None

    def build_user_representation(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> Tuple[jax.Array, jax.Array]:
        """Unit user vectors [B, D] and their norm before normalisation [B, 1]."""
        tokens, mask = user_history_tokens(self, batch, recsys_embeddings)
        hidden = self.model(tokens.astype(self.fprop_dtype), mask, candidate_start_offset=None)
        pooled = masked_mean(hidden.embeddings, mask)  # [B, D]
        norm = jnp.sqrt(jnp.maximum(jnp.sum(pooled**2, axis=-1, keepdims=True), EPS))  # [B, 1]
        return pooled / norm, norm

    def build_candidate_representation(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> Tuple[jax.Array, jax.Array]:
        """Unit candidate vectors [B, C, D] and the candidate mask [B, C]."""
        stacked = jnp.concatenate(
            [
                jnp.asarray(recsys_embeddings.candidate_post_embeddings),
                jnp.asarray(recsys_embeddings.candidate_author_embeddings),
            ],
            axis=2,
        )  # [B, C, h, D]
        tower = CandidateTower(
            emb_size=self.config.emb_size, enable_linear_proj=self.config.enable_linear_proj
        )
        mask = jnp.asarray(batch.candidate_post_hashes)[:, :, 0] != 0  # [B, C]
        return tower(stacked), mask

    def __call__(
        self,
        batch: RecsysBatch,
        recsys_embeddings: RecsysEmbeddings,
        corpus_embeddings: jax.Array,
        top_k: int,
        corpus_mask: Optional[jax.Array] = None,
    ) -> RetrievalOutput:
        user, _ = self.build_user_representation(batch, recsys_embeddings)
        indices, scores = top_k_by_dot(user, corpus_embeddings, top_k, corpus_mask)
        return RetrievalOutput(user_representation=user, top_k_indices=indices, top_k_scores=scores)


def top_k_by_dot(
    queries: jax.Array,
    corpus: jax.Array,
    top_k: int,
    corpus_mask: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """Exact top-k of queries [B, D] against corpus [N, D]: indices and scores [B, K]."""
    scores = jnp.matmul(queries, corpus.T)  # [B, N]
    if corpus_mask is not None:
        scores = jnp.where(corpus_mask[None, :], scores, -INF)
    best_scores, best_indices = jax.lax.top_k(scores, top_k)
    return best_indices, best_scores


__all__ = [
    "CandidateTower",
    "PhoenixRetrievalModel",
    "PhoenixRetrievalModelConfig",
    "RetrievalOutput",
    "l2_normalize",
    "top_k_by_dot",
]
