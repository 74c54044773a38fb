"""Masks, RoPE positions and transformer invariants of phoenix.grok."""

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.grok import (
    TransformerConfig,
    ffn_size,
    make_recsys_attn_mask,
    right_anchored_rope_positions,
    rms_normalize,
    rotate_half,
)
from tests.small_models import random_params


def test_mask_of_user_two_history_three_candidates():
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 0, 1, 0],
            [1, 1, 1, 0, 0, 1],
        ],
        np.float32,
    )
    mask = make_recsys_attn_mask(6, 3)
    assert mask.shape == (1, 1, 6, 6)
    np.testing.assert_array_equal(np.asarray(mask[0, 0]), expected)


def test_mask_with_one_candidate_is_causal():
    np.testing.assert_array_equal(
        np.asarray(make_recsys_attn_mask(4, 3)[0, 0]), np.tril(np.ones((4, 4)))
    )


def test_mask_where_every_token_after_the_user_is_a_candidate():
    expected = np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], np.float32)
    np.testing.assert_array_equal(np.asarray(make_recsys_attn_mask(4, 1)[0, 0]), expected)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float16, jnp.bfloat16])
def test_mask_dtype(dtype):
    assert make_recsys_attn_mask(5, 3, dtype=dtype).dtype == dtype


def test_larger_mask_structure():
    seq, start = 12, 5
    m = np.asarray(make_recsys_attn_mask(seq, start)[0, 0])
    np.testing.assert_array_equal(m[:start, :start], np.tril(np.ones((start, start))))
    assert m[:start, start:].sum() == 0
    np.testing.assert_array_equal(m[start:, :start], 1)
    np.testing.assert_array_equal(m[start:, start:], np.eye(seq - start))


def test_right_anchored_positions_full_history():
    mask = jnp.ones((2, 8), bool)  # user + 4 history + 3 candidates
    pos = np.asarray(
        right_anchored_rope_positions(mask, history_seq_len=4, num_user_prefix_tokens=1)
    )
    np.testing.assert_array_equal(pos, [[0, 1, 2, 3, 4, 5, 5, 5]] * 2)


def test_right_anchored_positions_short_history_anchor_newest_item():
    # user, 2 valid history items of 4 (right-padded), 2 candidates of which 1 is padding
    mask = jnp.array([[True, True, True, False, False, True, False]])
    pos = np.asarray(
        right_anchored_rope_positions(mask, history_seq_len=4, num_user_prefix_tokens=1)
    )
    # newest valid item (index 2) sits at history_end - 1 = 4; padding at 0; candidate at 5
    np.testing.assert_array_equal(pos, [[0, 3, 4, 0, 0, 5, 0]])
    assert pos.dtype == np.float32


def test_right_anchored_positions_two_prefix_tokens():
    pos = right_anchored_rope_positions(jnp.ones((1, 10), bool), 6, 2)
    assert float(pos[0, 0]) == 0.0 and float(pos[0, 1]) == 1.0
    assert float(pos[0, 9]) == 8.0


def test_ffn_size_rounds_to_multiple_of_eight():
    assert ffn_size(128, 2.0) == 176
    assert ffn_size(256, 2.0) == 344
    assert ffn_size(32, 2.0) == 48
    assert all(ffn_size(d, w) % 8 == 0 for d in (8, 24, 100) for w in (1.0, 2.5, 4.0))


def test_rms_normalize_unit_rms_and_dtype():
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 7, 16)).astype(jnp.bfloat16) * 5
    y = rms_normalize(x, jnp.ones((16,)))
    assert y.dtype == jnp.bfloat16
    rms = np.sqrt(np.mean(np.asarray(y, np.float32) ** 2, axis=-1))
    np.testing.assert_allclose(rms, 1.0, atol=2e-2)


def test_rotate_half():
    np.testing.assert_array_equal(
        np.asarray(rotate_half(jnp.array([1.0, 2.0, 3.0, 4.0]))), [-3, -4, 1, 2]
    )


def _transformer(seq, config, candidate_start, positions=None, seed=0):
    def fn(x, mask):
        return config.make()(x, mask, candidate_start_offset=candidate_start, positions=positions)

    f = hk.without_apply_rng(hk.transform(fn))
    # apply jitted: run op by op, each new shape compiles every op alone (seconds a test)
    f = f._replace(apply=jax.jit(f.apply))
    x = jax.random.normal(jax.random.PRNGKey(seed), (2, seq, config.emb_size))
    mask = jnp.ones((2, seq), bool)
    return f, random_params(f, seed, 0.3, x, mask), x, mask


def test_gqa_parameter_shapes():
    config = TransformerConfig(emb_size=32, key_size=8, num_q_heads=4, num_kv_heads=2, num_layers=1)
    f, params, x, mask = _transformer(5, config, None)
    attn = params["transformer/decoder_layer_0/multi_head_attention/query"]["w"]
    assert attn.shape == (32, 32)
    assert params["transformer/decoder_layer_0/multi_head_attention/key"]["w"].shape == (32, 16)
    assert f.apply(params, x, mask).embeddings.shape == (2, 5, 32)


def test_causal_transformer_ignores_future_tokens():
    config = TransformerConfig(emb_size=16, key_size=8, num_q_heads=2, num_kv_heads=1, num_layers=2)
    f, params, x, mask = _transformer(6, config, None)
    out = f.apply(params, x, mask).embeddings
    changed = x.at[:, 4:].set(7.0)
    out2 = f.apply(params, changed, mask).embeddings
    np.testing.assert_allclose(np.asarray(out[:, :4]), np.asarray(out2[:, :4]), atol=1e-5)
    assert not np.allclose(np.asarray(out[:, 4:]), np.asarray(out2[:, 4:]))


def test_candidate_isolation_in_transformer():
    config = TransformerConfig(emb_size=16, key_size=8, num_q_heads=2, num_kv_heads=2, num_layers=2)
    f, params, x, mask = _transformer(8, config, 4)
    out = f.apply(params, x, mask).embeddings
    other = x.at[:, 6].set(-3.0)  # change candidate 2 (index 6) only
    out2 = f.apply(params, other, mask).embeddings
    np.testing.assert_allclose(
        np.asarray(out[:, [4, 5, 7]]), np.asarray(out2[:, [4, 5, 7]]), atol=1e-5
    )
    assert not np.allclose(np.asarray(out[:, 6]), np.asarray(out2[:, 6]))
