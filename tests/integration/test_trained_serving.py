"""Trained artifacts (tiny preset) served by a real tritonserver: scores equal in-process, and
the feed policy after the ranker (diversity, negative actions, filters, a reload)."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter

import numpy as np
import pytest

from clients.demo import PostInfo, topic_feed_table
from phoenix.checkpoint import Corpus, load_corpus, load_example_sequence, save_corpus
from phoenix.client.client import (
    connect,
    infer,
    ranker_inputs,
    recommend_inputs,
    served_models,
)
from phoenix.feed_policy import FeedFilters, apply_policy
from phoenix.schema.contracts import FEED_POLICY
from phoenix.schema.wiring import run_until
from phoenix.stub.services.common import config_parameters
from phoenix.stub.services.feed_policy import parse_settings
from phoenix.stub.services.resources import PhoenixResources
from tests.integration.conftest import MODEL_REPOSITORY
from tests.plain_models import brute_force_top_k, plain_ranking, plain_user_embedding
from tests.training_helpers import trained_tiny

pytestmark = pytest.mark.integration
TOL = 1e-4
TOP_K = 40
OLD_AGE_S = 30 * 24 * 3600  # every other corpus post is a month old, the others an hour


def date_the_corpus(artifacts) -> np.ndarray:
    """Give the corpus creation times (the age filter reads them); returns the old posts."""
    corpus = load_corpus(artifacts)
    now = int(time.time())
    old = np.arange(len(corpus)) % 2 == 1
    created = np.where(old, now - OLD_AGE_S, now - 3600).astype(np.int64)
    save_corpus(
        artifacts,
        Corpus(corpus.post_ids, corpus.embeddings, corpus.author_ids, corpus.topics, created),
    )
    return corpus.post_ids[old]


@pytest.fixture(scope="module")
def trained_server(tmp_path_factory):
    from tests.integration.conftest import launch_server

    shared, _, _ = trained_tiny()
    # a copy (its compiled programs included): the shared artifacts are read-only
    artifacts = tmp_path_factory.mktemp("trained") / "artifacts"
    shutil.copytree(shared, artifacts)
    old_posts = date_the_corpus(artifacts)
    log_path = tmp_path_factory.mktemp("trained-triton") / "tritonserver.log"
    # explicit model control: the policy's parameters are reloaded by test_policy_reload
    server = launch_server(
        MODEL_REPOSITORY, artifacts, log_path=log_path, exit_timeout_secs=5,
        model_control_mode="explicit", load_model="*",
    )  # fmt: skip
    yield server, artifacts, old_posts
    server.kill()  # not a stop under test: conftest, "killed"


def in_process_recommend(resources, seq, score_weights, top_k, policy):
    """user tower -> exact top-k over the corpus without the history -> ranker, in-process."""
    corpus = load_corpus(resources.root, resources.config)
    user = plain_user_embedding(resources, seq)
    top, _ = brute_force_top_k(corpus, user, top_k, seq["history_post_ids"])
    author_of = dict(zip(corpus.post_ids.tolist(), corpus.author_ids.tolist()))
    created_at = dict(zip(corpus.post_ids.tolist(), corpus.created_at.tolist()))
    # as recommend's chain sends it: the history with its dwell seconds, no surfaces, and each
    # candidate's age as the corpus dates it (an hour or a month: the same buckets a second
    # later, when the server dates them)
    candidates = {k: v for k, v in seq.items() if k.startswith("history") or k == "user_id"}
    candidates |= {
        "candidate_post_ids": top.tolist(),
        "candidate_author_ids": [author_of[p] for p in top.tolist()],
        "candidate_post_age_seconds": [time.time() - created_at[p] for p in top.tolist()],
    }
    ids, _, probs = plain_ranking(resources, score_weights, candidates)
    # then the feed policy, as the recommend ensemble's last step
    authors = np.array([author_of[p] for p in ids.tolist()])
    user = FeedFilters(user_id=int(seq["user_id"]) if policy.filter_own_posts else None)
    kept, scores = apply_policy(ids, authors, probs, policy, user)
    return ids[kept], scores, probs[kept], authors[kept]


def policy_settings(client, resources):
    parameters = config_parameters(client.get_model_config("feed_policy", as_json=True)["config"])
    return parse_settings(parameters, resources.config.action_names)


def test_trained_artifacts_serve_the_in_process_scores(trained_server):
    server, artifacts, _ = trained_server
    resources = PhoenixResources(artifacts)
    client = connect(server.grpc_url, "grpc")
    config = client.get_model_config("ranker", as_json=True)["config"]
    score_weights = config["parameters"]["score_weights"]["string_value"]
    seq = load_example_sequence(artifacts).to_dict()

    out = infer(client, "grpc", "recommend", recommend_inputs(seq, TOP_K))
    policy = policy_settings(client, resources)
    ids, scores, probs, authors = in_process_recommend(resources, seq, score_weights, TOP_K, policy)
    np.testing.assert_array_equal(out["ranked_post_ids"][0], ids)
    np.testing.assert_array_equal(out["ranked_author_ids"][0], authors)
    np.testing.assert_allclose(out["scores"][0], scores, atol=TOL)
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


def test_the_policy_diversifies_authors_with_the_defaults(trained_server):
    server, artifacts, _ = trained_server
    client = connect(server.http_url, "http")
    request = recommend_inputs(load_example_sequence(artifacts).to_dict(), TOP_K)
    feed = infer(client, "http", "recommend", request)
    top = Counter(feed["ranked_author_ids"][0][:10].tolist())
    assert max(top.values()) <= 2
    # the ranker alone, asked step by step, ranks the same posts (nothing filtered here)
    raw = run_until(served_models(client, "http"), request, "ranker")
    assert sorted(raw["ranked_post_ids"][0].tolist()) == sorted(feed["ranked_post_ids"][0].tolist())


def policy_request(probs: np.ndarray) -> dict[str, np.ndarray]:
    count = probs.shape[0]
    return {
        "user_id": np.array([[1]], np.int64),
        "candidate_post_ids": np.arange(1, count + 1, dtype=np.int64)[None],
        "candidate_author_ids": np.arange(101, 101 + count, dtype=np.int64)[None],
        "candidate_action_probs": probs[None].astype(np.float32),
    }


def test_a_higher_block_or_report_probability_ranks_lower(trained_server):
    server, artifacts, _ = trained_server
    names = list(PhoenixResources(artifacts).config.action_names)
    base = np.full(len(names), 0.2)
    base[[names.index(n) for n in ("not_interested", "block_author", "mute_author", "report")]] = 0
    probs = np.stack([base] * 3)
    probs[1, names.index("block_author")] = 0.1  # post 2
    probs[2, names.index("report")] = 0.1  # post 3
    client = connect(server.grpc_url, "grpc")
    # sent in the worst order first: the policy must reorder them
    out = infer(client, "grpc", "feed_policy", policy_request(probs[::-1].copy()))
    assert out["ranked_post_ids"][0].tolist() == [3, 2, 1]  # ids as sent: 1 is the clean one
    assert out["scores"][0][0] > out["scores"][0][1] > out["scores"][0][2] >= 0


def test_excluded_authors_seen_and_old_posts_never_appear(trained_server):
    server, artifacts, old_posts = trained_server
    client = connect(server.http_url, "http")
    seq = load_example_sequence(artifacts).to_dict()
    feed = infer(client, "http", "recommend", recommend_inputs(seq, TOP_K))
    authors = np.unique(feed["ranked_author_ids"][0][:5])
    seen = feed["ranked_post_ids"][0][5:12]
    request = {
        **recommend_inputs(seq, TOP_K),
        "excluded_author_ids": authors[None].astype(np.int64),
        "seen_post_ids": seen[None].astype(np.int64),
    }
    out = infer(client, "http", "recommend", request)
    assert not np.isin(out["ranked_author_ids"][0], authors).any()
    assert not np.isin(out["ranked_post_ids"][0], seen).any()
    assert np.isin(out["ranked_post_ids"][0], old_posts).any()  # no age limit asked
    request["max_age_seconds"] = np.array([[7 * 24 * 3600]], np.float32)
    out = infer(client, "http", "recommend", request)
    assert len(out["ranked_post_ids"][0]) > 0
    assert not np.isin(out["ranked_post_ids"][0], old_posts).any()
    assert not np.isin(out["ranked_author_ids"][0], authors).any()
    bad = {**request, "max_age_seconds": np.array([[-5]], np.float32)}
    with pytest.raises(Exception, match="max_age_seconds"):
        infer(client, "http", "recommend", bad)


def test_policy_reload_changes_a_running_servers_feed(trained_server):
    """clients.feed_policy reloads the model with new parameters; a bad one is refused and
    the loaded parameters keep serving."""
    from clients import feed_policy

    server, artifacts, _ = trained_server
    client = connect(server.http_url, "http")
    request = recommend_inputs(load_example_sequence(artifacts).to_dict(), TOP_K)
    before = infer(client, "http", "recommend", request)
    url = ["--url", server.http_url, "--artifacts", str(artifacts)]
    # decay = floor = 1: no diversity, so the feed is in weighted-score order
    flat = ["--set", "author_diversity_decay=1", "--set", "author_diversity_floor=1"]
    assert feed_policy.main([*url, *flat]) == 0
    try:
        after = infer(client, "http", "recommend", request)
        assert np.all(np.diff(after["scores"][0]) <= 0)
        assert sorted(after["ranked_post_ids"][0]) == sorted(before["ranked_post_ids"][0])
        # no multiplier below 1 any more: an author's later posts score higher than before
        assert after["scores"][0].sum() > before["scores"][0].sum() + 1e-3
        # refused here, before any load request
        assert feed_policy.main([*url, "--set", "author_diversity_floor=2"]) == 3
        # refused by the model itself: the load fails, the running parameters stay
        config = client.get_model_config("feed_policy")
        config["parameters"]["author_diversity_floor"] = {"string_value": "2"}
        with pytest.raises(Exception, match="author_diversity_floor"):
            client.load_model("feed_policy", config=json.dumps(config))
        again = infer(client, "http", "recommend", request)
        np.testing.assert_array_equal(again["ranked_post_ids"], after["ranked_post_ids"])
    finally:
        keys = ("author_diversity_decay", "author_diversity_floor")
        texts = FEED_POLICY.parameter_texts({})
        defaults = [f"--set={key}={texts[key]}" for key in keys]
        assert feed_policy.main([*url, *defaults]) == 0
    restored = infer(client, "http", "recommend", request)
    np.testing.assert_array_equal(restored["ranked_post_ids"], before["ranked_post_ids"])


def test_the_server_says_which_artifacts_it_serves_and_the_clients_use_them(
    trained_server, capsys, tmp_path
):
    """GET /v2/models/<m>/config names the trained artifacts, their version label and their
    config digest; a client
    without --artifacts uses them (its --check recomputes the answer with their weights); one
    given other artifacts is refused, naming both."""
    from clients import rank
    from phoenix.checkpoint.identity import artifact_version, config_digest
    from phoenix.client.inprocess import SERVICE_MODELS, server_parameters

    server, artifacts, _ = trained_server
    client = connect(server.http_url, "http")
    for model in SERVICE_MODELS:
        parameters = server_parameters(client, "http", model)
        assert parameters["artifact_dir"] == str(artifacts.resolve()), model
        assert parameters["config_digest"] == config_digest(artifacts), model
        assert parameters["artifact_version"] == artifact_version(artifacts), model
    other = tmp_path / "other"  # artifacts of another config (a wider embedding)
    other.mkdir()
    config = json.loads((artifacts / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "emb_size": 2 * config["emb_size"]}))
    url = ["--url", server.http_url]

    assert rank.main([*url, "--check"]) == 0
    assert "check passed" in capsys.readouterr().out
    assert rank.main([*url, "--artifacts", str(artifacts)]) == 0
    capsys.readouterr()
    assert rank.main([*url, "--artifacts", str(other)]) == 3
    refusal = capsys.readouterr().err
    assert str(other) in refusal and str(artifacts.resolve()) in refusal, refusal
    assert config_digest(other)[:12] in refusal and config_digest(artifacts)[:12] in refusal
