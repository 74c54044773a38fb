"""Candidate tower, user tower normalisation and top-k of the retrieval model."""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine import RetrievalEngine, example_inputs
from phoenix.grok import TrainingState
from phoenix.recsys_retrieval_model import CandidateTower
from phoenix.runners import (
    RecsysRetrievalInferenceRunner,
    RetrievalModelRunner,
    create_example_corpus,
)
from tests.small_models import randomized, small_retriever, small_transformer


def tower(enable_linear_proj):
    f = hk.without_apply_rng(hk.transform(lambda x: CandidateTower(32, enable_linear_proj)(x)))
    x = jax.random.normal(jax.random.PRNGKey(1), (3, 5, 4, 32))
    return f, f.init(jax.random.PRNGKey(0), x), x


@pytest.mark.parametrize("linear", [True, False])
def test_candidate_tower_unit_norm(linear):
    f, params, x = tower(linear)
    out = f.apply(params, x)
    assert out.shape == (3, 5, 32)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(out), axis=-1), 1.0, atol=1e-5)


def test_mean_pooling_tower_has_no_parameters_and_is_the_mean_direction():
    f, params, x = tower(False)
    assert sum(p.size for p in jax.tree_util.tree_leaves(params)) == 0
    mean = np.asarray(x).mean(axis=2)
    expected = mean / np.linalg.norm(mean, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(f.apply(params, x)), expected, atol=1e-5)


def test_linear_tower_parameter_shapes():
    _, params, _ = tower(True)
    leaves = params["candidate_tower"]
    assert leaves["candidate_tower_projection_1"].shape == (128, 64)
    assert leaves["candidate_tower_projection_2"].shape == (64, 32)


def config(**kw):
    return small_retriever(small_transformer(32, 16, 2, 2, 1, 0.125), 8, 4, **kw)


class RandomWeightsRunner(RetrievalModelRunner):
    """The original's retrieval runner with random weights of its init's shapes, read with
    ``jax.eval_shape``: the eager init drew every weight op by op (8 s of a 2-core CPU) only
    for the test to replace them."""

    def init(self, rng, data, embeddings, corpus_embeddings, top_k):
        init = functools.partial(super().init, top_k=top_k)
        state = jax.eval_shape(init, rng, data, embeddings, corpus_embeddings)
        return TrainingState(params=randomized(state.params, 0, 0.3))


def random_runner(cfg):
    runner = RecsysRetrievalInferenceRunner(
        RandomWeightsRunner(model=cfg, bs_per_device=0.125), "t"
    )
    runner.initialize()
    return runner


def test_runner_retrieves_sorted_valid_top_k_and_unit_users():
    runner = random_runner(config())
    corpus, ids = create_example_corpus(100, 32)
    runner.set_corpus(corpus, ids)
    b, e = example_inputs(runner.runner.model, 3, 4)
    out = runner.retrieve(b, e, top_k=10)
    idx, scores = np.asarray(out.top_k_indices), np.asarray(out.top_k_scores)
    assert idx.shape == (3, 10) and ((idx >= 0) & (idx < 100)).all()
    assert (np.diff(scores, axis=1) <= 0).all()
    np.testing.assert_allclose(
        np.linalg.norm(np.asarray(out.user_representation), axis=1), 1, atol=1e-5
    )
    brute = np.asarray(out.user_representation) @ np.asarray(corpus).T
    np.testing.assert_allclose(scores, -np.sort(-brute, axis=1)[:, :10], atol=1e-5)


def test_corpus_mask_excludes_entries():
    cfg = config()
    runner = random_runner(cfg)
    corpus, _ = create_example_corpus(20, 32)
    mask = jnp.arange(20) % 2 == 0
    b, e = example_inputs(cfg, 2, 4)
    f = hk.without_apply_rng(
        hk.transform(lambda b_, e_, c, m: cfg.make()(b_, e_, c, 5, corpus_mask=m))
    )
    out = jax.jit(f.apply)(runner.params, b, e, corpus, mask)
    assert (np.asarray(out.top_k_indices) % 2 == 0).all()


def test_engine_matches_plain_retrieval_model():
    cfg = config()
    runner = random_runner(cfg)
    b, e = example_inputs(cfg, 3, 4)
    engine = RetrievalEngine(cfg, runner.params, batch_buckets=(2,))
    users = engine.encode_users(b, e)
    np.testing.assert_allclose(users, np.asarray(runner.encode_user(b, e)), atol=1e-5)
    cands = engine.encode_candidates(
        np.asarray(e.candidate_post_embeddings).reshape(-1, 2, 32),
        np.asarray(e.candidate_author_embeddings).reshape(-1, 2, 32),
    )
    np.testing.assert_allclose(
        cands, np.asarray(runner.encode_candidates(b, e)).reshape(-1, 32), atol=1e-5
    )
    corpus, _ = create_example_corpus(300, 32)
    engine.set_corpus(np.asarray(corpus))
    idx, scores = engine.top_k(users, 7)
    ref = runner.retrieve(b, e, top_k=7, corpus_embeddings=corpus)
    np.testing.assert_array_equal(idx, np.asarray(ref.top_k_indices))
    np.testing.assert_allclose(scores, np.asarray(ref.top_k_scores), atol=1e-5)
    exclude = np.zeros((3, 300), bool)
    exclude[:, idx[:, 0]] = True
    idx2, _ = engine.top_k(users, 7, exclude=exclude)
    assert not np.isin(idx2, idx[:, 0]).any()
    assert engine.top_k(users, 1000)[0].shape == (3, 300)  # k larger than the corpus
