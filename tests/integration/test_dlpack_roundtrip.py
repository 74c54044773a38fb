"""Known values round-trip through a real server under numpy 2, for every dtype served.

The Triton 2.51 stub corrupts numpy-2 tensors on its pybind11 path (`as_numpy()` repeats
element 0, `Tensor(name, ndarray)` sends an empty tensor), so a return to that path fails
here: ids near 2**63 must come back bit-exact, pass-through floats unchanged, and every
model output must equal what the same service computes in-process.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from phoenix.client.client import connect, infer
from phoenix.client.inprocess import InProcessModels
from phoenix.stub.services.catalog import SERVED_BY_SERVICES
from phoenix.stub.services.resources import PhoenixResources
from tests.rankings import assert_same_feed

pytestmark = pytest.mark.integration

TOL = 1e-5
# int64 ids at the top of the range, where a float or int32 detour would show at once
HUGE_IDS = np.array([2**63 - 1, 2**63 - 2, 2**63 - 3, 2**62 + 12345, 2**53 + 1], np.int64)


@pytest.fixture(scope="module")
def resources(tiny_artifacts):
    return PhoenixResources(tiny_artifacts)


@pytest.fixture(scope="module")
def local(triton, tiny_artifacts):
    """The served models' services in this process, built as the server built them."""
    models = SERVED_BY_SERVICES
    return InProcessModels.like_server(connect(triton.http_url), "http", tiny_artifacts, models)


@pytest.fixture(scope="module")
def ranker(local):
    return local.service("ranker")


def history(config, rng, length: int) -> dict[str, np.ndarray]:
    """One user's history tensors ([1, L] each, [1, L, A] actions); L may be 0."""
    return {
        "user_id": np.array([[2**63 - 7]], np.int64),
        "history_post_ids": rng.integers(2**62, 2**63 - 1, (1, length), dtype=np.int64),
        "history_author_ids": rng.integers(2**62, 2**63 - 1, (1, length), dtype=np.int64),
        "history_actions": (rng.random((1, length, config.num_actions)) > 0.7).astype(np.float32),
        "history_product_surface": rng.integers(
            0, config.product_surface_vocab_size, (1, length), dtype=np.int32
        ),
    }


def ranker_request(config, rng, history_len: int, num_candidates: int) -> dict:
    """A ranker request whose candidates start with HUGE_IDS and carry known retrieval scores."""
    posts = rng.integers(1, 2**63 - 1, num_candidates, dtype=np.int64)
    posts[: min(len(HUGE_IDS), num_candidates)] = HUGE_IDS[:num_candidates]
    return {
        **history(config, rng, history_len),
        "candidate_post_ids": posts[None],
        "candidate_author_ids": rng.integers(1, 2**63 - 1, (1, num_candidates), dtype=np.int64),
        "candidate_product_surface": rng.integers(
            0, config.product_surface_vocab_size, (1, num_candidates), dtype=np.int32
        ),
        # exact binary fractions: any conversion on the way would change them
        "candidate_retrieval_scores": (np.arange(num_candidates, dtype=np.float32) / 1024)[None],
    }


def assert_same_ranking(served: dict, local: dict, request: dict, same_shape=True) -> None:
    """Served outputs equal the in-process ones; ids and pass-through floats bit-exact.

    ``same_shape``: served in the batch shape ``local`` was computed in, so even the order
    of near-tied candidates must agree; otherwise it may differ there (tests/rankings.py).
    """
    assert served["ranked_post_ids"].dtype == np.int64
    sent = request["candidate_post_ids"][0]
    assert sorted(served["ranked_post_ids"][0].tolist()) == sorted(sent.tolist())
    if same_shape:
        np.testing.assert_array_equal(served["ranked_post_ids"], local["ranked_post_ids"])
    else:
        assert_same_feed(served, local, TOL)
    order = {int(p): i for i, p in enumerate(sent)}
    expected_retrieval = request["candidate_retrieval_scores"][0][
        [order[int(p)] for p in served["ranked_post_ids"][0]]
    ]
    np.testing.assert_array_equal(served["ranked_retrieval_scores"][0], expected_retrieval)
    local_row = {int(p): i for i, p in enumerate(local["ranked_post_ids"][0])}
    same_ids = [local_row[int(p)] for p in served["ranked_post_ids"][0]]  # identity if same order
    np.testing.assert_allclose(
        served["scores"][0], local["scores"][0][same_ids], rtol=TOL, atol=TOL
    )
    np.testing.assert_allclose(
        served["action_probs"][0], local["action_probs"][0][same_ids], rtol=TOL, atol=TOL
    )


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ranker_round_trips_huge_ids_and_known_floats(triton, resources, ranker, protocol):
    config = resources.config
    request = ranker_request(config, np.random.default_rng(1), 12, 40)
    url = triton.http_url if protocol == "http" else triton.grpc_url
    served = infer(connect(url, protocol), protocol, "ranker", request)
    (local,) = ranker.handle([request])
    assert_same_ranking(served, local, request)


def test_ranker_1024_candidates_and_empty_history(triton, resources, ranker):
    config = resources.config
    request = ranker_request(config, np.random.default_rng(2), 0, 1024)
    assert request["history_post_ids"].shape == (1, 0)  # empty tensors on the wire
    served = infer(connect(triton.http_url), "http", "ranker", request)
    (local,) = ranker.handle([request])
    assert served["ranked_post_ids"].shape == (1, 1024)
    assert served["action_probs"].shape == (1, 1024, config.num_actions)
    assert_same_ranking(served, local, request)


def test_ranker_zero_candidates_gives_empty_outputs(triton, resources, ranker):
    request = ranker_request(resources.config, np.random.default_rng(3), 5, 0)
    served = infer(connect(triton.http_url), "http", "ranker", request)
    (local,) = ranker.handle([request])
    assert served["ranked_post_ids"].shape == local["ranked_post_ids"].shape == (1, 0)
    assert served["ranked_post_ids"].dtype == np.int64
    assert served["scores"].shape == (1, 0)
    assert served["action_probs"].shape == local["action_probs"].shape


def test_mixed_requests_batched_together_each_match_in_process(triton, resources, ranker):
    """Different history and candidate lengths sent at once: the batcher groups them and
    each response still equals that request's own in-process result. The batcher picks
    the padded shape, so near-ties may order differently from the request ranked alone."""
    config = resources.config
    rng = np.random.default_rng(4)
    shapes = [(0, 1), (3, 17), (30, 64), (1, 300), (8, 5), (20, 128), (2, 2), (9, 1000)]
    requests = [ranker_request(config, rng, h, c) for h, c in shapes]
    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        served = list(
            pool.map(lambda r: infer(connect(triton.http_url), "http", "ranker", r), requests)
        )
    for request, result in zip(requests, served):
        (local,) = ranker.handle([request])
        assert_same_ranking(result, local, request, same_shape=False)


def test_candidate_tower_huge_ids_multi_row(triton, resources, local):
    posts = HUGE_IDS[:, None]  # [5, 1]
    authors = HUGE_IDS[::-1, None].copy()
    request = {"post_id": posts, "author_id": authors}
    served = infer(connect(triton.grpc_url, "grpc"), "grpc", "candidate_tower", request)
    (mine,) = local.service("candidate_tower").handle([request])
    assert served["candidate_embedding"].dtype == np.float32
    assert served["candidate_embedding"].shape == (5, resources.config.emb_size)
    np.testing.assert_allclose(served["candidate_embedding"], mine["candidate_embedding"], atol=TOL)
    assert len({tuple(np.round(v, 4)) for v in served["candidate_embedding"]}) == 5


def test_user_encoder_and_retriever_round_trip(triton, resources, local):
    config = resources.config
    request = history(config, np.random.default_rng(5), 6)
    served_user = infer(connect(triton.http_url), "http", "user_encoder", request)
    (local_user,) = local.service("user_encoder").handle([request])
    np.testing.assert_allclose(
        served_user["user_embedding"], local_user["user_embedding"], atol=TOL
    )

    retriever = local.service("retriever")
    corpus_ids = retriever.corpus.post_ids
    query = {
        "user_embedding": local_user["user_embedding"].astype(np.float32),
        "top_k": np.array([[7]], np.int32),
        "history_post_ids": corpus_ids[None, :3].astype(np.int64),  # excluded from results
    }
    served = infer(connect(triton.grpc_url, "grpc"), "grpc", "retriever", query)
    (mine,) = retriever.handle([query])
    np.testing.assert_array_equal(served["post_ids"], mine["post_ids"])
    np.testing.assert_array_equal(served["author_ids"], mine["author_ids"])
    np.testing.assert_allclose(served["retrieval_scores"], mine["retrieval_scores"], atol=TOL)
    assert not set(served["post_ids"][0].tolist()) & set(corpus_ids[:3].tolist())

    query["history_post_ids"] = np.zeros((1, 0), np.int64)  # an empty optional input
    served = infer(connect(triton.http_url), "http", "retriever", query)
    assert served["post_ids"].shape == (1, 7)
    assert served["post_ids"].dtype == np.int64
