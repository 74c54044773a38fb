"""The published reference outputs, reproduced from the reference parameters."""

import numpy as np
import pytest

from phoenix.engine import DeviceRanker, RetrievalEngine
from tests.golden import TOL, configs, inputs, load_golden, params
from tests.plain_models import jitted_apply


@pytest.fixture(scope="module")
def golden():
    return load_golden()


def test_ranker_model_and_engine_reproduce_logits(golden):
    ranker, _ = configs(golden)
    p = params(golden, "ranker_params/")
    batch, emb = inputs(golden)
    out = jitted_apply("ranker", ranker, lambda m, b, e: m(b, e))(p, batch, emb)
    np.testing.assert_allclose(np.asarray(out.logits), golden["expected/ranker_logits"], atol=TOL)
    for joint_rows in (0, 10**6):  # the cached-context passes, then context + candidates as one
        engine = DeviceRanker(
            ranker, p, batch_buckets=(4,), candidate_buckets=(2, 4), joint_rows=joint_rows
        )
        assert engine.runs_joint(4, 4) == bool(joint_rows)
        scores = engine.score(batch, emb)
        np.testing.assert_allclose(scores.logits, golden["expected/ranker_logits"], atol=TOL)
        np.testing.assert_allclose(
            scores.continuous_preds, golden["expected/ranker_continuous_preds"], atol=TOL
        )


def test_retrieval_engine_reproduces_golden(golden):
    _, retrieval = configs(golden)
    engine = RetrievalEngine(retrieval, params(golden, "retrieval_params/"))
    batch, emb = inputs(golden)
    users = engine.encode_users(batch, emb)
    np.testing.assert_allclose(users, golden["expected/user_representation"], atol=TOL)
    engine.set_corpus(golden["corpus_embeddings"])
    idx, scores = engine.top_k(users, 10)
    np.testing.assert_array_equal(idx, golden["expected/top_k_indices"])
    np.testing.assert_allclose(scores, golden["expected/top_k_scores"], atol=TOL)
