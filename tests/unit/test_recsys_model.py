"""Post-age buckets, normalisation and ranking-model invariants."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine import example_inputs
from phoenix.recsys_model import (
    NormConfig,
    PhoenixModelConfig,
    compute_post_age_bucket,
    normalize_continuous_value,
)
from tests.plain_models import jitted_apply
from tests.small_models import random_params, small_ranker, small_transformer

T0 = 1_000_000


@pytest.mark.parametrize(
    "age_minutes, bucket",
    [(30, 1), (59, 1), (60, 2), (120, 3), (4799, 80), (4800, 81), (5000, 81), (10**6, 81)],
)
def test_post_age_bucket(age_minutes, bucket):
    got = compute_post_age_bucket(jnp.array([[T0]]), jnp.array([[T0 - age_minutes * 60]]), 60)
    assert int(got[0, 0]) == bucket


def test_post_age_bucket_unknown_or_negative_is_zero():
    impr = jnp.array([[0, T0, T0]])
    post = jnp.array([[T0, 0, T0 + 3600]])
    np.testing.assert_array_equal(np.asarray(compute_post_age_bucket(impr, post, 60)), [[0, 0, 0]])


def test_post_age_bucket_other_granularity():
    got = compute_post_age_bucket(
        jnp.array([T0, T0]), jnp.array([T0 - 45 * 60, T0 - 10_000 * 60]), 30
    )
    np.testing.assert_array_equal(np.asarray(got), [2, 4800 // 30 + 1])
    assert got.dtype == jnp.int32


def test_post_age_vocab_size():
    config = PhoenixModelConfig(model=None, emb_size=8, num_actions=19)
    assert config.post_age_vocab_size == 82


def test_linear_normalisation_clips():
    out = normalize_continuous_value(jnp.array([-5.0, 0.0, 15.0, 30.0, 60.0]), NormConfig(30.0))
    np.testing.assert_allclose(np.asarray(out), [0, 0, 0.5, 1, 1], atol=1e-6)


def test_log_normalisation():
    out = normalize_continuous_value(jnp.array([0.0, 10.0, 30.0, 99.0]), NormConfig(30.0, True))
    np.testing.assert_allclose(np.asarray(out), [0, np.log1p(10) / np.log1p(30), 1, 1], atol=1e-6)


def small_config(**overrides):
    return small_ranker(small_transformer(16, 8, 2, 1, 2, 0.25), 6, 5, **overrides)


def model_and_inputs(config):
    f = hk.without_apply_rng(hk.transform(lambda b, e: config.make()(b, e)))
    f = f._replace(apply=jitted_apply("ranker", config, lambda m, b_, e_: m(b_, e_)))
    b, e = example_inputs(
        config, 2, config.candidate_seq_len, with_continuous=True, with_timestamps=True
    )
    return f, b, e


def random_model(config, seed=0):
    f, b, e = model_and_inputs(config)
    return f, random_params(f, seed, 0.4, b, e), b, e


def test_ranker_parameter_names_match_published_layout():
    f, b, e = model_and_inputs(small_config())
    params = jax.eval_shape(f.init, jax.random.PRNGKey(0), b, e)  # names and shapes alone
    names = {f"{m}/{p}" for m in params for p in params[m]}
    for expected in [
        "phoenix_model/proj_mat_1",
        "phoenix_model/proj_mat_2",
        "phoenix_model/proj_mat_3",
        "phoenix_model/history_dwell_time_proj1",
        "phoenix_model/history_dwell_time_proj2",
        "phoenix_model/post_age_embedding_table",
        "phoenix_model/unembeddings",
        "phoenix_model/continuous_unembeddings",
        "phoenix_model/rms_norm/scale",
        "transformer/decoder_layer_1/rms_norm_3/scale",
    ]:
        assert expected in names
    assert params["phoenix_model"]["proj_mat_3"].shape == (7 * 16, 16)
    assert params["phoenix_model"]["proj_mat_2"].shape == (6 * 16, 16)


@pytest.mark.parametrize("anchored", [False, True])
def test_candidate_isolation_changing_other_candidates(anchored):
    f, params, b, e = random_model(small_config(right_anchored_rope=anchored))
    out = np.asarray(f.apply(params, b, e).logits)
    emb2 = np.array(e.candidate_post_embeddings)
    emb2[:, 1] += 5.0  # change candidate 1's content
    hashes2 = np.array(b.candidate_post_hashes)
    hashes2[:, 3] = 0  # remove candidate 3 (padding keeps the others in place)
    e2 = type(e)(**{**e.__dict__, "candidate_post_embeddings": emb2})
    out2 = np.asarray(f.apply(params, b._replace(candidate_post_hashes=hashes2), e2).logits)
    keep = [0, 2, 4]
    np.testing.assert_allclose(out[:, keep], out2[:, keep], atol=1e-5)
    assert not np.allclose(out[:, 1], out2[:, 1])


def test_dwell_and_timestamps_change_scores():
    f, params, b, e = random_model(small_config())
    with_features = np.asarray(f.apply(params, b, e).logits)
    without = np.asarray(
        f.apply(
            params,
            b._replace(
                history_continuous_actions=None,
                candidate_impr_ts=None,
                candidate_post_creation_ts=None,
            ),
            e,
        ).logits
    )
    assert not np.allclose(with_features, without)
