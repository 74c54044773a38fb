"""The published reference outputs, reproduced from the reference parameters."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine import DeviceRanker, RetrievalEngine
from phoenix.grok import TransformerConfig
from phoenix.recsys_model import PhoenixModelConfig, RecsysBatch, RecsysEmbeddings
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig
from phoenix.runners import (
    ModelRunner,
    RecsysInferenceRunner,
    RecsysRetrievalInferenceRunner,
    RetrievalModelRunner,
)
from tests.conftest import reference_file

TOL = 1e-4


@pytest.fixture(scope="module")
def golden():
    with np.load(reference_file("golden_public.npz"), allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def params(golden, prefix):
    out = {}
    for key, value in golden.items():
        if key.startswith(prefix):
            module, name = key[len(prefix) :].rsplit("/", 1)
            out.setdefault(module, {})[name] = jnp.asarray(value)
    return out


def configs(golden):
    c = lambda k: golden[f"config/{k}"].item()  # noqa: E731
    tc = TransformerConfig(
        emb_size=c("emb_size"),
        key_size=c("key_size"),
        num_q_heads=c("num_q_heads"),
        num_kv_heads=c("num_kv_heads"),
        num_layers=c("num_layers"),
        widening_factor=c("widening_factor"),
        attn_output_multiplier=c("attn_output_multiplier"),
    )
    common = dict(
        model=tc,
        emb_size=c("emb_size"),
        history_seq_len=c("history_seq_len"),
        candidate_seq_len=c("candidate_seq_len"),
        fprop_dtype=jnp.float32,
    )
    ranker = PhoenixModelConfig(
        num_actions=c("num_actions"), right_anchored_rope=bool(c("right_anchored_rope")), **common
    )
    return ranker, PhoenixRetrievalModelConfig(**common)


def inputs(golden):
    batch = RecsysBatch(
        **{f: golden[f"batch/{f}"] for f in RecsysBatch._fields if f"batch/{f}" in golden}
    )
    emb = RecsysEmbeddings(
        **{
            f: golden[f"embeddings/{f}"]
            for f in RecsysEmbeddings.__dataclass_fields__
            if f"embeddings/{f}" in golden
        }
    )
    return batch, emb


def test_ranker_runner_reproduces_logits(golden):
    ranker, _ = configs(golden)
    runner = RecsysInferenceRunner(ModelRunner(model=ranker, bs_per_device=0.125), name="golden")
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


def test_ranker_model_and_engine_reproduce_logits(golden):
    ranker, _ = configs(golden)
    p = params(golden, "ranker_params/")
    f = hk.without_apply_rng(hk.transform(lambda b, e: ranker.make()(b, e)))
    batch, emb = inputs(golden)
    out = f.apply(p, batch, emb)
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


def test_retrieval_runner_reproduces_users_candidates_and_top_k(golden):
    _, retrieval = configs(golden)
    runner = RecsysRetrievalInferenceRunner(
        RetrievalModelRunner(model=retrieval, bs_per_device=0.125), "g"
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
