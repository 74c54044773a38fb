"""References from the plain Haiku models (not the engine the servers use), for the tests that
compare a served or in-process answer against them. The host-side hashing and lookups that
build the plain models' ``RecsysBatch`` live here: serving hashes on the device instead.

The plain models run under ``jax.jit`` (the stand-in for the original the benchmarks use too):
op by op, each new request shape cost 4-5 s of compiling single operations on 2 cores, under
jit 1.2 s (six requests of the batching test: 27 s against 7)."""

from __future__ import annotations

import haiku as hk
import jax
import numpy as np

from phoenix.client.client import ranker_inputs, user_inputs
from phoenix.recsys_model import REFERENCE_TIME, RecsysBatch, RecsysEmbeddings
from phoenix.schema.batches import pad_batch
from phoenix.schema.contracts import RANKER
from phoenix.schema.request_types import RankerRequest, UserEncoderRequest
from phoenix.schema.requests import parse
from phoenix.stub.services.ranker import score_weight_vector
from phoenix.stub.services.retrieval import user_tower_inputs


def ranker_features(resources, request: RankerRequest) -> tuple[RecsysBatch, RecsysEmbeddings]:
    """The plain model's batch for one ranker request (hashed and looked up on the host)."""
    history = pad_batch([request], request.rows, {"L": resources.config.history_seq_len})
    hashes, embeddings = resources.user_features(history)
    (post_h, author_h), (post_e, author_e) = resources.candidate_features(
        request.candidate_post_ids, request.candidate_author_ids
    )
    surfaces = request.candidate_product_surface
    impr = created = None
    if request.candidate_post_age_seconds is not None:  # ages as timestamps, as served
        impr = np.full(request.candidate_post_ids.shape, REFERENCE_TIME, np.int64)
        created = impr - np.floor(request.candidate_post_age_seconds).astype(np.int64)
    batch = RecsysBatch(
        **hashes,
        candidate_post_hashes=post_h,
        candidate_author_hashes=author_h,
        candidate_product_surface=np.zeros(post_h.shape[:2], np.int32)
        if surfaces is None
        else surfaces,
        candidate_impr_ts=impr,
        candidate_post_creation_ts=created,
    )
    emb = RecsysEmbeddings(
        **embeddings, candidate_post_embeddings=post_e, candidate_author_embeddings=author_e
    )
    return batch, emb


_JITTED: dict[str, object] = {}


def jitted_apply(name: str, config, forward):
    """``jax.jit`` of the Haiku apply of ``forward(config model, batch, emb)``, one per model
    config (its repr: every field), so every test's calls share its compiled shapes."""
    key = f"{name} {config!r}"
    if key not in _JITTED:
        transformed = hk.without_apply_rng(hk.transform(lambda b, e: forward(config.make(), b, e)))
        _JITTED[key] = jax.jit(transformed.apply)
    return _JITTED[key]


def plain_ranking(resources, score_weights, seq):
    """Ranked ids, blended scores and probabilities from the plain PhoenixModel."""
    request = parse(RankerRequest, ranker_inputs(seq), resources.config)
    batch, emb = ranker_features(resources, request)
    model = jitted_apply("ranker", resources.config.ranker_config(), lambda m, b, e: m(b, e))
    logits = np.asarray(model(resources.artifacts.ranker_params, batch, emb).logits)[0]
    probs = 1 / (1 + np.exp(-logits))
    parsed = RANKER.parameter("score_weights").parse(score_weights)
    weights = score_weight_vector(parsed, resources.config.action_names)
    blended = probs @ weights
    order = np.argsort(-blended, kind="stable")
    return np.asarray(seq["candidate_post_ids"], np.int64)[order], blended[order], probs[order]


def plain_user_embedding(resources, seq):
    """The user tower's L2-normalised vector [D] from the plain retrieval model."""
    request = parse(UserEncoderRequest, user_inputs(seq), resources.config)
    history = pad_batch([request], 1, {"L": resources.config.history_seq_len})
    batch, emb = user_tower_inputs(resources, history)
    apply = jitted_apply(
        "user tower",
        resources.config.retrieval_config(),
        lambda m, b, e: m.build_user_representation(b, e)[0],
    )
    return np.asarray(apply(resources.artifacts.retrieval_params, batch, emb))[0]


def brute_force_top_k(corpus, user, k, exclude_ids=()):
    """Exact top-k corpus ids and scores for ``user`` [D], ``exclude_ids`` left out."""
    scores = corpus.embeddings @ user
    scores[np.isin(corpus.post_ids, np.asarray(exclude_ids, np.int64))] = -np.inf
    order = np.argsort(-scores, kind="stable")[: min(k, int(np.isfinite(scores).sum()))]
    return corpus.post_ids[order], scores[order]
