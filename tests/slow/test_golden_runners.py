"""The original's inference runners (``phoenix.runners``: build, initialize, rank or retrieve)
reproduce the published reference outputs from the reference parameters. Whole runner builds:
the engine and model paths against the same outputs are in tests/unit/test_golden.py."""

import jax
import numpy as np
import pytest

from phoenix import runners
from tests.golden import TOL, configs, inputs, load_golden, params


@pytest.fixture(scope="module")
def golden():
    return load_golden()


def test_ranker_runner_reproduces_logits(golden):
    ranker, _ = configs(golden)
    runner = runners.RecsysInferenceRunner(
        runners.ModelRunner(model=ranker, bs_per_device=0.125), name="golden"
    )
    runner.initialize()
    runner.params = params(golden, "ranker_params/")
    out = runner.rank(*inputs(golden))
    expected = golden["expected/ranker_logits"]
    np.testing.assert_allclose(np.asarray(out.scores), jax.nn.sigmoid(expected), atol=TOL)
    np.testing.assert_allclose(
        np.asarray(out.continuous_preds), golden["expected/ranker_continuous_preds"], atol=TOL
    )
    order = np.argsort(-np.asarray(jax.nn.sigmoid(expected[:, :, 0])), axis=-1, kind="stable")
    np.testing.assert_array_equal(np.asarray(out.ranked_indices), order)


def test_retrieval_runner_reproduces_users_candidates_and_top_k(golden):
    _, retrieval = configs(golden)
    runner = runners.RecsysRetrievalInferenceRunner(
        runners.RetrievalModelRunner(model=retrieval, bs_per_device=0.125), "g"
    )
    runner.initialize()
    loaded = params(golden, "retrieval_params/")
    assert set(loaded) == set(runner.params)  # same tree as the published checkpoints
    runner.params = loaded
    batch, emb = inputs(golden)
    np.testing.assert_allclose(
        np.asarray(runner.encode_user(batch, emb)), golden["expected/user_representation"], atol=TOL
    )
    np.testing.assert_allclose(
        np.asarray(runner.encode_candidates(batch, emb)),
        golden["expected/candidate_representation"],
        atol=TOL,
    )
    out = runner.retrieve(batch, emb, top_k=10, corpus_embeddings=golden["corpus_embeddings"])
    np.testing.assert_array_equal(np.asarray(out.top_k_indices), golden["expected/top_k_indices"])
    np.testing.assert_allclose(
        np.asarray(out.top_k_scores), golden["expected/top_k_scores"], atol=TOL
    )
