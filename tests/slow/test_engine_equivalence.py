"""The cached-context engine (``DeviceRanker.score``) equals the plain model, whatever the
chunking or batching.

In the slow tier because every test compiles the engine's programs for several buckets (3-15 s
each on a busy 2-core CPU). The random weights take their shapes from ``jax.eval_shape`` of the
init and each case is built once: an eager init ran every initializer op by op. The plain
model runs under ``jax.jit``, as the other references do (tests/plain_models.py). The unit
tier still checks the engine against the original's reference (tests/unit/test_golden.py) and
its helpers (tests/unit/test_engine.py).
"""

import functools

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine import DeviceRanker, example_inputs
from phoenix.engine.batching import take_users
from tests.plain_models import jitted_apply
from tests.small_models import small_ranker, small_transformer

CASES = {
    "mha": dict(num_q_heads=2, num_kv_heads=2, right_anchored_rope=False),
    "gqa_anchored": dict(num_q_heads=4, num_kv_heads=2, right_anchored_rope=True),
    "mqa": dict(num_q_heads=4, num_kv_heads=1, right_anchored_rope=False),
}


@functools.cache
def build(case, candidates=23, layers=3):
    c = dict(CASES[case])
    anchored = c.pop("right_anchored_rope")
    heads, kv_heads = c["num_q_heads"], c["num_kv_heads"]
    config = small_ranker(
        small_transformer(32, 8, heads, kv_heads, layers, 0.3),
        9,
        candidates,
        right_anchored_rope=anchored,
    )
    f = hk.without_apply_rng(hk.transform(lambda b, e: config.make()(b, e)))
    b, e = example_inputs(config, 3, candidates, with_continuous=True, with_timestamps=True, seed=4)
    hist = np.array(b.history_post_hashes)
    hist[0, 5:] = 0  # short history
    hist[2] = 0  # empty history
    cand = np.array(b.candidate_post_hashes)
    cand[1, -4:] = 0  # trailing padded candidates
    b = b._replace(history_post_hashes=hist, candidate_post_hashes=cand)
    rng = np.random.default_rng(7)
    params = jax.tree_util.tree_map(
        lambda p: jnp.asarray(
            rng.normal(size=p.shape) / np.sqrt(p.shape[0])
            if p.ndim == 2
            else 1 + 0.2 * rng.normal(size=p.shape),
            jnp.float32,
        ),
        jax.eval_shape(f.init, jax.random.PRNGKey(0), b, e),
    )
    return config, f, params, b, e


# Both of the engine's paths for every kind of attention (the cached path over several chunks,
# the joint pass over one whole width), and each path's other bucket set once: the cached path
# over one chunk, and joint_rows asked where the widths are chunked (the cached path serves).
POINTS = [
    *[(case, (4, 8), 0) for case in sorted(CASES)],
    *[(case, (64,), 10**6) for case in sorted(CASES)],
    ("mqa", (64,), 0),
    ("gqa_anchored", (4, 8), 10**6),
]


@pytest.mark.parametrize(("case", "buckets", "joint_rows"), POINTS)
def test_engine_equals_plain_model(case, buckets, joint_rows):
    config, f, params, b, e = build(case)
    ref = jitted_apply("equivalence", config, lambda model, b, e: model(b, e))(params, b, e)
    engine = DeviceRanker(
        config, params, batch_buckets=(1, 2), candidate_buckets=buckets, joint_rows=joint_rows
    )
    # the joint pass runs whole widths only: several chunks (buckets 4, 8) stay cached
    assert engine.runs_joint(2, 64) == (joint_rows > 0 and buckets == (64,))
    out = engine.score(b, e)
    valid = np.asarray(b.candidate_post_hashes)[:, :, 0] != 0
    np.testing.assert_allclose(out.logits[valid], np.asarray(ref.logits)[valid], atol=1e-4)
    np.testing.assert_allclose(out.continuous_preds, np.asarray(ref.continuous_preds), atol=1e-5)


def test_scores_do_not_depend_on_batch_mates():
    config, f, params, b, e = build("gqa_anchored")
    engine = DeviceRanker(config, params, batch_buckets=(1, 4), candidate_buckets=(8, 32))
    together = engine.score(b, e).logits
    for row in range(3):
        alone = engine.score(*take_users(b, e, slice(row, row + 1))).logits
        np.testing.assert_allclose(alone[0], together[row], atol=1e-5)


def test_zero_candidates():
    config, f, params, b, e = build("mha", candidates=1)
    engine = DeviceRanker(config, params, batch_buckets=(4,), candidate_buckets=(8,))
    b0 = b._replace(
        candidate_post_hashes=np.zeros((3, 0, 2), np.int32),
        candidate_author_hashes=np.zeros((3, 0, 2), np.int32),
        candidate_product_surface=np.zeros((3, 0), np.int32),
        candidate_impr_ts=None,
        candidate_post_creation_ts=None,
    )
    e0 = type(e)(
        **{
            **e.__dict__,
            "candidate_post_embeddings": np.zeros((3, 0, 2, 32), np.float32),
            "candidate_author_embeddings": np.zeros((3, 0, 2, 32), np.float32),
        }
    )
    out = engine.score(b0, e0)
    assert out.logits.shape == (3, 0, 19) and out.continuous_preds.shape == (3, 0, 8)


def test_warm_up_compiles_every_bucket_then_nothing_new():
    config, f, params, b, e = build("mha", layers=1)
    engine = DeviceRanker(config, params, batch_buckets=(1, 2), candidate_buckets=(4, 8, 32))
    assert engine.warm_up_score() == 6
    assert engine._score.compiled == 6
    engine.score(b, e)  # 3 users -> 2 calls (2 + 1), 23 candidates -> width 32, chunks of 32
    engine.score(*take_users(b, e, slice(0, 1)))  # 1 user
    cut = lambda x: x[:, :3]  # noqa: E731  3 candidates -> width 4
    engine.score(
        b._replace(
            candidate_post_hashes=cut(b.candidate_post_hashes),
            candidate_author_hashes=cut(b.candidate_author_hashes),
            candidate_product_surface=cut(b.candidate_product_surface),
            candidate_impr_ts=cut(b.candidate_impr_ts),
            candidate_post_creation_ts=cut(b.candidate_post_creation_ts),
        ),
        type(e)(
            **{
                **e.__dict__,
                "candidate_post_embeddings": cut(e.candidate_post_embeddings),
                "candidate_author_embeddings": cut(e.candidate_author_embeddings),
            }
        ),
    )
    # absent optional features reuse the same compiled programs
    engine.score(
        b._replace(
            history_continuous_actions=None, candidate_impr_ts=None, candidate_post_creation_ts=None
        ),
        e,
    )
    assert engine._score.compiled == 6


def test_row_limit_groups_users_inside_the_call_with_the_same_scores():
    config, f, params, b, e = build("mqa")
    kwargs = dict(batch_buckets=(1, 2, 4), candidate_buckets=(8, 32))
    wide = DeviceRanker(config, params, max_rows_per_call=10**6, **kwargs)
    narrow = DeviceRanker(config, params, max_rows_per_call=32, **kwargs)
    assert wide.users_per_pass(32) >= 4
    assert narrow.users_per_pass(32) == 1  # 23 candidates -> width 32: one user per pass
    assert narrow.users_per_pass(8) == 4  # width 8: 4 x 8 rows fit
    np.testing.assert_allclose(narrow.score(b, e).logits, wide.score(b, e).logits, atol=1e-5)
    # groups that do not divide the batch, every user real (b's users repeated): one group
    # of 3 and the fourth user after it; three groups of 2 in the device loop and the seventh
    # after them; two loop groups of 2 and a fifth user, 23 candidates in 3 chunks of 8 each
    cases = ((4, 96, (8, 32), 32, 3), (7, 64, (8, 32), 32, 2), (5, 16, (8,), 24, 2))
    for users, rows, candidate_buckets, width, group in cases:
        more_b, more_e = (
            jax.tree_util.tree_map(lambda x, n=users: np.concatenate([x, x, x])[:n], t)
            for t in (b, e)
        )
        uneven = DeviceRanker(
            config, params, max_rows_per_call=rows, batch_buckets=(users,),
            candidate_buckets=candidate_buckets,
        )  # fmt: skip
        assert uneven.padded_shape(users, 23) == (users, width)
        assert uneven.users_per_pass(width) == group
        got, want = uneven.score(more_b, more_e), wide.score(more_b, more_e)
        assert got.logits.shape[0] == users
        np.testing.assert_allclose(got.logits[:, :23], want.logits[:, :23], atol=1e-5)
        np.testing.assert_allclose(
            got.continuous_preds[:, :23], want.continuous_preds[:, :23], atol=1e-5
        )
