"""Trained artifacts (tiny preset) served by a real tritonserver: scores equal in-process."""

from __future__ import annotations

import numpy as np
import pytest

from clients.demo import PostInfo, topic_feed_table
from phoenix.checkpoint import load_corpus, load_example_sequence
from phoenix.serving import services
from phoenix.serving.client import connect, infer, ranker_inputs, recommend_inputs
from tests.integration.conftest import MODEL_REPOSITORY
from tests.plain_models import brute_force_top_k, plain_ranking, plain_user_embedding
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


def in_process_recommend(resources, seq, score_weights, top_k):
    """user tower -> exact top-k over the corpus without the history -> ranker, in-process."""
    corpus = load_corpus(resources.root, resources.config)
    user = plain_user_embedding(resources, seq)
    top, _ = brute_force_top_k(corpus, user, top_k, seq["history_post_ids"])
    author_of = dict(zip(corpus.post_ids.tolist(), corpus.author_ids.tolist()))
    # as the recommend ensemble sends it: no dwell seconds, surfaces or post ages
    candidates = {k: v for k, v in seq.items() if k.startswith("history") or k == "user_id"}
    candidates.pop("history_dwell_seconds")
    candidates |= {
        "candidate_post_ids": top.tolist(),
        "candidate_author_ids": [author_of[p] for p in top.tolist()],
    }
    return plain_ranking(resources, score_weights, candidates)


def test_trained_artifacts_serve_the_in_process_scores(trained_server):
    server, artifacts = trained_server
    resources = services.PhoenixResources(artifacts)
    client = connect(server.grpc_url, "grpc")
    config = client.get_model_config("ranker", as_json=True)["config"]
    score_weights = config["parameters"]["score_weights"]["string_value"]
    seq = load_example_sequence(artifacts).to_dict()

    out = infer(client, "grpc", "recommend", recommend_inputs(seq, TOP_K))
    ids, blended, probs = in_process_recommend(resources, seq, score_weights, TOP_K)
    np.testing.assert_array_equal(out["ranked_post_ids"][0], ids)
    np.testing.assert_allclose(out["scores"][0], blended, atol=TOL)
    np.testing.assert_allclose(out["action_probs"][0], probs, atol=TOL)

    # the ranker alone on the example's logged candidates (with dwell and surfaces)
    ranked = infer(client, "grpc", "ranker", ranker_inputs(seq))
    ids, blended, probs = plain_ranking(resources, score_weights, seq)
    np.testing.assert_array_equal(ranked["ranked_post_ids"][0], ids)
    np.testing.assert_allclose(ranked["scores"][0], blended, atol=TOL)
    np.testing.assert_allclose(ranked["action_probs"][0], probs, atol=TOL)

    # the demo's table names every recommended post's topic and author
    info = PostInfo.load(artifacts)
    table = topic_feed_table(out, info, resources.config.action_names)
    assert "?" not in table.split("\n")[1]
