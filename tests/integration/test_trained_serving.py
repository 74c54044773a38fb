"""Trained artifacts (tiny preset) served by a real tritonserver: scores equal in-process."""

from __future__ import annotations

import haiku as hk
import numpy as np
import pytest

from phoenix.checkpoint import load_corpus, load_example_sequence
from phoenix.serving import services
from phoenix.serving.client import connect, infer, ranker_inputs, recommend_inputs, user_inputs
from phoenix.serving.demo import PostInfo, topic_feed_table
from tests.integration.conftest import MODEL_REPOSITORY
from tests.training_helpers import trained_tiny

pytestmark = pytest.mark.integration
TOL = 1e-4
TOP_K = 40


@pytest.fixture(scope="module")
def trained_server(tmp_path_factory):
    from tests.integration.conftest import launch_server

    artifacts, _, _ = trained_tiny()
    log_path = tmp_path_factory.mktemp("trained-triton") / "tritonserver.log"
    server = launch_server(MODEL_REPOSITORY, artifacts, log_path=log_path, exit_timeout_secs=5)
    yield server, artifacts
    server.stop()


def _unvalidated(service_class, resources):
    svc = service_class.__new__(service_class)
    svc.resources, svc.config = resources, resources.config
    return svc


def in_process_recommend(resources, seq, weights, top_k):
    """user tower -> exact top-k over the corpus without the history -> ranker, in-process."""
    config = resources.config
    encoder = _unvalidated(services.UserEncoderService, resources)
    batch, emb = encoder.features(encoder.parse(user_inputs(seq)))
    retrieval = config.retrieval_config()
    user = hk.without_apply_rng(
        hk.transform(lambda b, e: retrieval.make().build_user_representation(b, e)[0])
    ).apply(resources.artifacts.retrieval_params, batch, emb)
    corpus = load_corpus(resources.root, config)
    scores = corpus.embeddings @ np.asarray(user)[0]
    scores[np.isin(corpus.post_ids, seq["history_post_ids"])] = -np.inf
    top = np.argsort(-scores, kind="stable")[:top_k]
    # as the recommend ensemble sends it: no dwell seconds, surfaces or post ages
    candidates = {k: v for k, v in seq.items() if k.startswith("history") or k == "user_id"}
    candidates.pop("history_dwell_seconds")
    candidates |= {
        "candidate_post_ids": corpus.post_ids[top].tolist(),
        "candidate_author_ids": corpus.author_ids[top].tolist(),
    }
    ranker = _unvalidated(services.RankerService, resources)
    batch, emb = ranker.features(ranker.parse(ranker_inputs(candidates)))
    ranking = config.ranker_config()
    logits = hk.without_apply_rng(hk.transform(lambda b, e: ranking.make()(b, e))).apply(
        resources.artifacts.ranker_params, batch, emb
    )
    probs = 1 / (1 + np.exp(-np.asarray(logits.logits)[0]))
    blended = probs @ weights
    order = np.argsort(-blended, kind="stable")
    return corpus.post_ids[top][order], blended[order], probs[order]


def test_trained_artifacts_serve_the_in_process_scores(trained_server, capsys):
    server, artifacts = trained_server
    resources = services.PhoenixResources(artifacts)
    client = connect(server.grpc_url, "grpc")
    text = client.get_model_config("ranker", as_json=True)["config"]["parameters"]
    weights = services.parse_score_weights(
        text["score_weights"]["string_value"], resources.config.action_names
    )
    seq = load_example_sequence(artifacts).to_dict()

    out = infer(client, "grpc", "recommend", recommend_inputs(seq, TOP_K))
    ids, blended, probs = in_process_recommend(resources, seq, weights, TOP_K)
    np.testing.assert_array_equal(out["ranked_post_ids"][0], ids)
    np.testing.assert_allclose(out["scores"][0], blended, atol=TOL)
    np.testing.assert_allclose(out["action_probs"][0], probs, atol=TOL)

    # the ranker alone on the example's logged candidates (with dwell and surfaces)
    ranked = infer(client, "grpc", "ranker", ranker_inputs(seq))
    svc = _unvalidated(services.RankerService, resources)
    batch, emb = svc.features(svc.parse(ranker_inputs(seq)))
    model = resources.config.ranker_config()
    logits = hk.without_apply_rng(hk.transform(lambda b, e: model.make()(b, e))).apply(
        resources.artifacts.ranker_params, batch, emb
    )
    expected = (1 / (1 + np.exp(-np.asarray(logits.logits)[0]))) @ weights
    np.testing.assert_allclose(np.sort(ranked["scores"][0]), np.sort(expected), atol=TOL)

    # the demo's table names every recommended post's topic and author
    info = PostInfo.load(artifacts)
    table = topic_feed_table(out, info, resources.config.action_names)
    assert "?" not in table.split("\n")[1]
