"""References from the plain Haiku models (not the engine the servers use), computed from the
features the services build, for the tests that compare a real server against them."""

from __future__ import annotations

import haiku as hk
import numpy as np

from phoenix.serving import services
from phoenix.serving.client import ranker_inputs, user_inputs


def plain_ranking(resources, score_weights, seq):
    """Ranked ids, blended scores and probabilities from the plain PhoenixModel."""
    svc = unvalidated(services.RankerService, resources)
    rows = svc.parse(ranker_inputs(seq))
    batch, emb = svc.features(rows)
    config = resources.config.ranker_config()
    model = hk.without_apply_rng(hk.transform(lambda b, e: config.make()(b, e)))
    logits = np.asarray(model.apply(resources.artifacts.ranker_params, batch, emb).logits)[0]
    probs = 1 / (1 + np.exp(-logits))
    weights = services.parse_score_weights(score_weights, resources.config.action_names)
    blended = probs @ weights
    order = np.argsort(-blended, kind="stable")
    return np.asarray(seq["candidate_post_ids"], np.int64)[order], blended[order], probs[order]


def unvalidated(service_class, resources):
    """A service object for its parsing/feature code only (no engine, no compilation)."""
    svc = service_class.__new__(service_class)
    svc.resources, svc.config = resources, resources.config
    return svc


def plain_user_embedding(resources, seq):
    """The user tower's L2-normalised vector [D] from the plain retrieval model."""
    svc = unvalidated(services.UserEncoderService, resources)
    batch, emb = svc.features(svc.parse(user_inputs(seq)))
    config = resources.config.retrieval_config()
    apply = hk.without_apply_rng(
        hk.transform(lambda b, e: config.make().build_user_representation(b, e)[0])
    ).apply
    return np.asarray(apply(resources.artifacts.retrieval_params, batch, emb))[0]


def brute_force_top_k(corpus, user, k, exclude_ids=()):
    """Exact top-k corpus ids and scores for ``user`` [D], ``exclude_ids`` left out."""
    scores = corpus.embeddings @ user
    scores[np.isin(corpus.post_ids, np.asarray(exclude_ids, np.int64))] = -np.inf
    order = np.argsort(-scores, kind="stable")[: min(k, int(np.isfinite(scores).sum()))]
    return corpus.post_ids[order], scores[order]
