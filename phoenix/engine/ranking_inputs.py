"""The parts of the ranker's programs that the cached-context engine (``device_ranking``) and
the prefix cache's engine (``prefix_ranking``) share: the batch fields they read, the id
hashes on the device, the model's context inputs from them, and the blend and sort.

Shape glossary
  B  users   S  history_seq_len   C  candidates   D  emb_size   A  num_actions
  N  continuous outputs (8)   nU / nI / nA  user / item / author hashes
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine.score_inputs import NOT_READ
from phoenix.hashing import EntityHash, hash_formula
from phoenix.recsys_model import DWELL_TIME_INDEX, NUM_CONTINUOUS, RecsysBatch, RecsysEmbeddings

# The request batch the ranker takes is the serving layer's padded batch of the ranker's
# contract (``phoenix.schema.batches``): one field per input, named as the contract names it,
# zeros as padding, and ``sent`` ({optional input: [B] bool}). The engine names here the
# fields it reads; an input it does not name (candidate_retrieval_scores) never reaches the
# device.
HASHED_IDS = (  # int64 ids, hashed by the first program
    "user_id",  # [B]
    "history_post_ids",  # [B, S], newest S items, right-padded with 0
    "history_author_ids",  # [B, S]
    "candidate_post_ids",  # [B, C], 0 = padding candidate
    "candidate_author_ids",  # [B, C]
)
FEATURES = (  # read by the ranking program as they are
    "history_actions",  # [B, S, A] float32
    "history_product_surface",  # [B, S] int32
    "history_dwell_seconds",  # [B, S] float32 (0 when not sent)
    "candidate_product_surface",  # [B, C] int32
    "candidate_post_age_seconds",  # [B, C] float32 (unknown unless sent)
)


class RankedBatch(NamedTuple):
    """Per user, candidates in ranked order (best first); padding candidates last."""

    order: np.ndarray  # [B, C] int32 positions into the request's candidates
    scores: np.ndarray  # [B, C] float32 blended scores, in ranked order
    action_probs: np.ndarray  # [B, C, A] float32, in ranked order


def hash_on_device(ids: jax.Array, entity: EntityHash):
    """(hashes, table rows) int32 [..., h] of int64 ``ids`` [...]; traced under x64.

    ``phoenix.hashing.hash_formula``, the host's formula, in jax.numpy; padding id 0 gets
    hash 0 and row 0.
    """
    hashes = hash_formula(
        jnp, ids, entity.scales, entity.biases, entity.modulus, entity.vocab_size
    )  # [..., h]
    rows = jnp.where(hashes == 0, 0, hashes + entity.table_offset)
    return hashes.astype(jnp.int32), rows.astype(jnp.int32)


def table_lookup(table: jax.Array) -> Callable[[jax.Array], jax.Array]:
    """rows [...] -> their embeddings [..., D] in the stacked table (inside a program)."""
    return lambda rows: jnp.take(table, rows, axis=0)


def context_inputs(hashed, inputs: dict, lookup) -> tuple[RecsysBatch, RecsysEmbeddings]:
    """The model's user and history fields (candidates None) of the hashing program's
    ``hashed`` user and history and the batch's ``inputs`` (FEATURES)."""
    user_hashes, user_rows = (x[:, 0] for x in hashed["user"])  # [B, nU]
    dwell = inputs["history_dwell_seconds"]  # [B, S]
    continuous = jnp.zeros(dwell.shape + (NUM_CONTINUOUS,), jnp.float32)
    continuous = continuous.at[:, :, DWELL_TIME_INDEX].set(dwell)  # [B, S, N]
    context = RecsysBatch(
        user_hashes=user_hashes,
        history_post_hashes=hashed["history_post"][0],
        history_author_hashes=hashed["history_author"][0],
        history_actions=inputs["history_actions"],
        history_product_surface=inputs["history_product_surface"],
        candidate_post_hashes=NOT_READ,
        candidate_author_hashes=NOT_READ,
        candidate_product_surface=NOT_READ,
        history_continuous_actions=continuous,
    )
    context_emb = RecsysEmbeddings(
        user_embeddings=lookup(user_rows),
        history_post_embeddings=lookup(hashed["history_post"][1]),
        history_author_embeddings=lookup(hashed["history_author"][1]),
        candidate_post_embeddings=NOT_READ,
        candidate_author_embeddings=NOT_READ,
    )
    return context, context_emb


def ranked_outputs(logits, valid, blend):
    """(order, blended scores, action probabilities) in ranked order of ``logits`` [B, C, A]:
    the sigmoid blend with ``blend`` [A], a stable descending sort, padding (not ``valid``)
    last."""
    probs = jax.nn.sigmoid(logits)  # [B, C, A]
    blended = jnp.where(valid, jnp.dot(probs, blend), -jnp.inf)  # [B, C]; padding sorts last
    order = jnp.argsort(-blended, axis=1, stable=True).astype(jnp.int32)  # [B, C]
    ranked_probs = jnp.take_along_axis(probs, order[..., None], axis=1)  # [B, C, A]
    return order, jnp.take_along_axis(blended, order, axis=1), ranked_probs


def id_inputs(batch) -> tuple[np.ndarray, ...]:
    """The int64 id arrays the hashing program takes, in its argument order."""
    return tuple(getattr(batch, name) for name in HASHED_IDS)


def feature_inputs(batch) -> dict[str, np.ndarray]:
    """What the ranking program reads besides the hashes: FEATURES, and whether each user's
    request sent post ages (a post of unknown age gets no timestamps)."""
    features = {name: getattr(batch, name) for name in FEATURES}
    features["age_sent"] = batch.sent["candidate_post_age_seconds"]  # [B] bool
    return features
