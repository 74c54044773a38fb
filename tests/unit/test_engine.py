"""The engine's helpers: bucket choice, precomputed RoPE rotation, table lookups.

That the engine equals the plain model, whatever the chunking or batching, is slower-tier
(whole models compiled for several buckets): tests/slow/test_engine_equivalence.py.
"""

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine import bucket_for


def test_bucket_for():
    assert bucket_for(1, (4, 16)) == 4
    assert bucket_for(5, (4, 16)) == 16
    assert bucket_for(99, (4, 16)) == 16


def test_rotation_from_precomputed_cos_sin_equals_grok_rope():
    from phoenix.engine.kernels import rope_rotation, rotate
    from phoenix.grok import apply_rope, rope_phase

    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 3, 8)), jnp.float32)
    positions = jnp.asarray([[0, 1, 2, 3, 9], [4, 4, 4, 0, 0]], jnp.float32)
    expected = apply_rope(x, rope_phase(positions, 8))
    np.testing.assert_array_equal(rotate(x, rope_rotation(positions, 8)), expected)


def test_lookup_rows_gives_zeros_outside_the_table_like_a_one_hot_matmul():
    from phoenix.engine.kernels import lookup_rows

    table = jnp.asarray(np.random.default_rng(1).normal(size=(4, 3)), jnp.float32)
    index = jnp.asarray([[0, 3, -1, 4, 2]])
    one_hot = jnp.dot(jax.nn.one_hot(index, 4), table)
    np.testing.assert_array_equal(lookup_rows(table, index), one_hot)
    assert not np.asarray(lookup_rows(table, index))[0, 2:4].any()
