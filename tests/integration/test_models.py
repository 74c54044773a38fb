"""Every served model through a real tritonserver, over HTTP and gRPC, against the plain model.

References are computed in-process with the plain Haiku models (not the engine the server
uses), from the same hashed features, so these tests also pin the serving path end to end.
"""

from __future__ import annotations

import concurrent.futures
import re

import haiku as hk
import numpy as np
import pytest

from harness.polling import wait_until
from phoenix.checkpoint import load_corpus, load_example_sequence
from phoenix.client.client import connect, infer, ranker_inputs, recommend_inputs, user_inputs
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.stub.services.resources import PhoenixResources
from tests.plain_models import brute_force_top_k, plain_ranking, plain_user_embedding
from tests.rankings import assert_same_ranking_up_to_ties

pytestmark = pytest.mark.integration
PROTOCOLS = ["http", "grpc"]
TOL = 1e-4


@pytest.fixture(scope="module")
def resources(tiny_artifacts):
    return PhoenixResources(tiny_artifacts)


@pytest.fixture(scope="module")
def example(tiny_artifacts):
    return load_example_sequence(tiny_artifacts).to_dict()


@pytest.fixture(scope="module")
def score_weights(triton):
    """The ranker's blend weights, as the running server reports its config."""
    config = connect(triton.http_url, "http").get_model_config("ranker")
    return config["parameters"]["score_weights"]["string_value"]


def random_user(config, rng, history: int, candidates: int = 0) -> dict:
    """A request dict in example_sequence.json form with random ids."""
    ids = lambda n: rng.integers(1, 2**62, n).tolist()  # noqa: E731
    return {
        "user_id": int(rng.integers(1, 2**62)),
        "history_post_ids": ids(history),
        "history_author_ids": ids(history),
        "history_actions": (rng.random((history, config.num_actions)) > 0.7).astype(int).tolist(),
        "history_product_surface": rng.integers(
            0, config.product_surface_vocab_size, history
        ).tolist(),
        "history_dwell_seconds": rng.exponential(10, history).tolist(),
        "candidate_post_ids": ids(candidates),
        "candidate_author_ids": ids(candidates),
        "candidate_product_surface": rng.integers(
            0, config.product_surface_vocab_size, candidates
        ).tolist(),
    }


# -- every model vs the plain model -----------------------------------------------------


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ranker_matches_plain_model(triton, resources, example, score_weights, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    out = infer(client, protocol, "ranker", ranker_inputs(example))
    ids, blended, probs = plain_ranking(resources, score_weights, example)
    np.testing.assert_array_equal(out["ranked_post_ids"][0], ids)
    np.testing.assert_allclose(out["scores"][0], blended, atol=TOL)
    np.testing.assert_allclose(out["action_probs"][0], probs, atol=TOL)
    assert (np.diff(out["scores"][0]) <= 0).all()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_user_encoder_matches_plain_model(triton, resources, example, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    out = infer(client, protocol, "user_encoder", user_inputs(example))["user_embedding"][0]
    np.testing.assert_allclose(out, plain_user_embedding(resources, example), atol=TOL)
    assert abs(np.linalg.norm(out) - 1) < 1e-5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_candidate_tower_matches_plain_model(triton, resources, tiny_artifacts, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    corpus = load_corpus(tiny_artifacts, resources.config)
    posts, authors = corpus.post_ids[:40, None], corpus.author_ids[:40, None]
    out = infer(client, protocol, "candidate_tower", {"post_id": posts, "author_id": authors})
    # the corpus was built with the plain candidate tower by the artifact generator
    np.testing.assert_allclose(out["candidate_embedding"], corpus.embeddings[:40], atol=TOL)
    config = resources.config.retrieval_config()
    forward = hk.without_apply_rng(
        hk.transform(lambda b, e: config.make().build_candidate_representation(b, e)[0])
    )
    (post_h, _), (post_e, author_e) = resources.candidate_features(posts.T, authors.T)
    batch = RecsysBatch(
        *([None] * 5),
        candidate_post_hashes=post_h,
        candidate_author_hashes=None,
        candidate_product_surface=None,
    )
    emb = RecsysEmbeddings(None, None, post_e, None, author_e)
    plain = np.asarray(forward.apply(resources.artifacts.retrieval_params, batch, emb))[0]
    np.testing.assert_allclose(out["candidate_embedding"], plain, atol=TOL)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_retriever_exact_top_k_excluding_history(triton, resources, tiny_artifacts, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    corpus = load_corpus(tiny_artifacts, resources.config)
    user = corpus.embeddings[7] * 0.5 + corpus.embeddings[9] * 0.5
    user = (user / np.linalg.norm(user)).astype(np.float32)
    seen = corpus.post_ids[[7, 100]]
    arrays = {
        "user_embedding": user[None],
        "top_k": np.array([[25]], np.int32),
        "history_post_ids": seen[None],
    }
    out = infer(client, protocol, "retriever", arrays)
    ids, scores = brute_force_top_k(corpus, user, 25, seen)
    np.testing.assert_array_equal(out["post_ids"][0], ids)
    np.testing.assert_allclose(out["retrieval_scores"][0], scores, atol=TOL)
    authors = dict(zip(corpus.post_ids.tolist(), corpus.author_ids.tolist()))
    assert out["author_ids"][0].tolist() == [authors[i] for i in ids.tolist()]
    whole = infer(client, protocol, "retriever", {**arrays, "top_k": np.array([[1000]], np.int32)})
    assert whole["post_ids"].shape == (1, len(corpus.post_ids) - 2)  # whole corpus, no -1 padding
    assert (whole["post_ids"] > 0).all()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_ensemble_equals_the_four_models_by_hand(triton, example, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    top_k = 30
    out = infer(client, protocol, "recommend", recommend_inputs(example, top_k))
    history = {k: v for k, v in ranker_inputs(example).items() if not k.startswith("candidate")}
    user = infer(client, protocol, "user_encoder", user_inputs(example))["user_embedding"]
    retrieved = infer(
        client,
        protocol,
        "retriever",
        {
            "user_embedding": user,
            "top_k": np.array([[top_k]], np.int32),
            "history_post_ids": user_inputs(example)["history_post_ids"],
        },
    )
    ranked = infer(
        client,
        protocol,
        "ranker",
        {
            **history,  # dwell seconds included, as recommend passes the history on
            "candidate_post_ids": retrieved["post_ids"],
            "candidate_author_ids": retrieved["author_ids"],
            "candidate_retrieval_scores": retrieved["retrieval_scores"],
        },
    )
    feed = infer(
        client,
        protocol,
        "feed_policy",
        {
            "user_id": user_inputs(example)["user_id"],
            "candidate_post_ids": ranked["ranked_post_ids"],
            "candidate_author_ids": ranked["ranked_author_ids"],
            "candidate_action_probs": ranked["action_probs"],
            "candidate_retrieval_scores": ranked["ranked_retrieval_scores"],
        },
    )
    np.testing.assert_array_equal(out["ranked_post_ids"], feed["ranked_post_ids"])
    np.testing.assert_array_equal(out["ranked_author_ids"], feed["ranked_author_ids"])
    np.testing.assert_allclose(out["scores"], feed["scores"], atol=TOL)
    np.testing.assert_allclose(out["action_probs"], feed["action_probs"], atol=TOL)
    np.testing.assert_allclose(out["retrieval_scores"], feed["ranked_retrieval_scores"], atol=TOL)
    # the policy keeps the ranker's posts here (no filters sent), in its own order
    assert sorted(out["ranked_post_ids"][0]) == sorted(ranked["ranked_post_ids"][0])
    # each post keeps its own retrieval score after ranking
    by_id = dict(zip(retrieved["post_ids"][0].tolist(), retrieved["retrieval_scores"][0].tolist()))
    for post, score in zip(out["ranked_post_ids"][0].tolist(), out["retrieval_scores"][0].tolist()):
        assert score == pytest.approx(by_id[post], abs=TOL)
    assert not set(out["ranked_post_ids"][0].tolist()) & set(example["history_post_ids"])


def test_empty_history_and_zero_candidates_are_answered(triton, resources):
    rng = np.random.default_rng(3)
    client = connect(triton.http_url, "http")
    A = resources.config.num_actions
    seq = random_user(resources.config, rng, history=0, candidates=5)
    out = infer(client, "http", "ranker", ranker_inputs(seq, num_actions=A))
    assert out["ranked_post_ids"].shape == (1, 5)
    seq = random_user(resources.config, rng, history=4, candidates=0)
    out = infer(client, "http", "ranker", ranker_inputs(seq))
    assert out["ranked_post_ids"].shape == (1, 0) and out["action_probs"].shape[:2] == (1, 0)
    empty = random_user(resources.config, rng, 0)
    emb = infer(client, "http", "user_encoder", user_inputs(empty, num_actions=A))
    assert abs(np.linalg.norm(emb["user_embedding"][0]) - 1) < 1e-5


def test_long_history_keeps_the_newest_items(triton, resources, score_weights):
    rng = np.random.default_rng(4)
    S = resources.config.history_seq_len
    seq = random_user(resources.config, rng, history=S + 7, candidates=6)
    client = connect(triton.http_url, "http")
    long_out = infer(client, "http", "ranker", ranker_inputs(seq))
    newest = {k: (v[-S:] if k.startswith("history") else v) for k, v in seq.items()}
    short_out = infer(client, "http", "ranker", ranker_inputs(newest))
    np.testing.assert_allclose(long_out["scores"], short_out["scores"], atol=TOL)


# -- dynamic batching -------------------------------------------------------------------


def execution_stats(client, model):
    stats = client.get_inference_statistics(model)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def settled_stats(client, model, before, inferences, seconds=10.0):
    """The counts once `inferences` more have been recorded since `before`.

    Triton records a batch's statistics after the backend has sent its responses, so a client
    can hold every answer a moment before the counts show them: wait for them (bounded)."""
    wait_until(lambda: execution_stats(client, model)[0] - before[0] >= inferences, seconds)
    return execution_stats(client, model)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_concurrent_requests_are_batched(triton, resources, score_weights, protocol):
    rng = np.random.default_rng(11)
    requests = [
        random_user(resources.config, rng, int(rng.integers(0, 30)), int(rng.integers(1, 40)))
        for _ in range(32)
    ]
    url = triton.http_url if protocol == "http" else triton.grpc_url
    stats_client = connect(triton.http_url, "http")
    before = execution_stats(stats_client, "ranker")

    def call(seq):
        return infer(connect(url, protocol), protocol, "ranker", ranker_inputs(seq))

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(call, requests))
    after = settled_stats(stats_client, "ranker", before, len(requests))
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == 32
    assert executions < inferences, f"{executions} executions for {inferences} requests"
    for seq, out in zip(requests[:6], results[:6]):  # batching must not change answers
        ids, blended, _ = plain_ranking(resources, score_weights, seq)
        # the batcher picks the padded shape: near-ties may swap (tests/rankings.py)
        assert_same_ranking_up_to_ties(
            out["ranked_post_ids"][0], out["scores"][0], ids, blended, TOL
        )


# -- bad input, per request --------------------------------------------------------------


def bad_ranker_requests(config, rng):
    """(description, inputs, expected message fragment) for every kind of bad input."""
    good = ranker_inputs(random_user(config, rng, 6, 4))
    cases = []

    def case(name, fragment, **changes):
        arrays = {k: v for k, v in good.items()}
        for key, value in changes.items():
            if value is None:
                arrays.pop(key)
            else:
                arrays[key] = value
        cases.append((name, arrays, fragment))

    case(
        "history lengths differ",
        "same length",
        history_author_ids=good["history_author_ids"][:, :3],
    )
    case("negative id", "history_post_ids", history_post_ids=-good["history_post_ids"])
    case(
        "surface out of vocab",
        "history_product_surface",
        history_product_surface=np.full_like(good["history_product_surface"], 999),
    )
    case("NaN action", "NaN", history_actions=np.full_like(good["history_actions"], np.nan))
    case(
        "infinite dwell",
        "NaN or infinite",
        history_dwell_seconds=np.full(good["history_post_ids"].shape, np.inf, np.float32),
    )
    case(
        "too many candidates",
        "at most 1024",
        candidate_post_ids=np.arange(1, 1100, dtype=np.int64)[None],
        candidate_author_ids=np.arange(1, 1100, dtype=np.int64)[None],
        candidate_product_surface=None,
    )
    case(
        "wrong action width",
        "actions per item",
        history_actions=np.zeros((1, 6, config.num_actions + 2), np.float32),
    )
    case(
        "zero candidate id",
        "candidate_post_ids",
        candidate_post_ids=np.zeros_like(good["candidate_post_ids"]),
    )
    return good, cases


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_inputs_fail_alone_and_good_ones_are_answered(
    triton, resources, score_weights, protocol
):
    rng = np.random.default_rng(5)
    good, cases = bad_ranker_requests(resources.config, rng)
    url = triton.http_url if protocol == "http" else triton.grpc_url
    module_error = Exception

    def call(arrays):
        try:
            return infer(connect(url, protocol), protocol, "ranker", arrays)
        except module_error as error:  # tritonclient raises InferenceServerException
            return error

    # interleave good and bad requests so they share dynamic batches
    jobs = []
    for _, arrays, _ in cases:
        jobs += [good, arrays]
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(call, jobs))
    reference = call(good)
    for i, (name, _, fragment) in enumerate(cases):
        ok, bad = results[2 * i], results[2 * i + 1]
        assert not isinstance(ok, Exception), f"good request failed beside '{name}': {ok}"
        np.testing.assert_allclose(ok["scores"], reference["scores"], atol=TOL)
        assert isinstance(bad, Exception), f"'{name}' was accepted"
        message = str(bad)
        assert fragment in message, f"'{name}': unexpected error {message}"
        status = getattr(bad, "status", lambda: None)()
        assert status in ("400", "StatusCode.INVALID_ARGUMENT", 400), f"'{name}': status {status}"
    assert connect(triton.http_url, "http").is_server_ready()


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bad_retriever_and_user_inputs(triton, resources, protocol):
    client = connect(triton.http_url if protocol == "http" else triton.grpc_url, protocol)
    D = resources.config.emb_size
    unit = np.eye(1, D, dtype=np.float32)
    bad = [
        (
            "retriever",
            {"user_embedding": np.ones((1, D + 3), np.float32), "top_k": np.array([[5]], np.int32)},
            f"expected {D} values",
        ),
        ("retriever", {"user_embedding": unit, "top_k": np.array([[0]], np.int32)}, "top_k"),
        (
            "retriever",
            {
                "user_embedding": np.full((1, D), np.nan, np.float32),
                "top_k": np.array([[5]], np.int32),
            },
            "NaN",
        ),
        ("candidate_tower", {"post_id": np.array([[-4]]), "author_id": np.array([[1]])}, "post_id"),
    ]
    for model, arrays, fragment in bad:
        with pytest.raises(Exception, match=re.escape(fragment)):
            infer(client, protocol, model, arrays)
    assert infer(
        client, protocol, "retriever", {"user_embedding": unit, "top_k": np.array([[3]], np.int32)}
    )["post_ids"].shape == (1, 3)
    assert client.is_server_ready()
