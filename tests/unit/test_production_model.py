"""The production ranker (phoenix/production, phoenix/engine/production_ranking.py) against
X's own outputs, and its pieces: overrides, hashing, parameter files, positions, key sets,
the prefix cache.

X's outputs come from tests/data/production (its README says how they were made): a small
config of X's nano ranker through X's serving kernel, and the same model through X's
training kernel.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.engine.production_ranking import ProductionRanker, programs
from phoenix.production import (
    NANO,
    ProductionConfig,
    apply_overrides,
    init_params,
    load_params,
    save_params,
)
from phoenix.production.config import HashConfig
from phoenix.production.examples import example_inputs
from phoenix.production.hashing import (
    gather_rows,
    hash_author_ids,
    hash_ip_ids,
    hash_item_ids,
    hash_user_ids,
)
from phoenix.production.model import prefix_key_ok, prefix_positions
from phoenix.production.params import check_params, param_shapes
from phoenix.production.reference import Tolerances, compare, load_set

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "data" / "production"
SERVING = DATA / "small_serving.npz"
TRAINING_KERNEL = DATA / "small_training_kernel.npz"
# A small config for the tests of our own: two blocks of prefix, float32 for exact equalities.
TINY = ProductionConfig(
    emb_size=32, num_layers=2, num_q_heads=2, num_kv_heads=1, key_size=64,
    history_seq_len=254, candidate_seq_len=8, emb_table_width=16, sid_embed_dim=16,
    sid_codebook_size=16, compute_dtype="float32",
    hashes=HashConfig(user_table_size=64, item_table_size=256, author_table_size=128,
                      ip_table_size=32),
)  # fmt: skip


@pytest.fixture(scope="module")
def serving_set():
    return load_set(SERVING)


@pytest.fixture(scope="module")
def serving_outputs(serving_set):
    ranker = ProductionRanker(serving_set.config, serving_set.params)
    return jax.device_get(ranker.rank(serving_set.inputs, serving_set.rows))


def test_x_serving_outputs_within_bfloat16_steps(serving_set, serving_outputs):
    """Our serving forward on X's parameters and inputs gives X's outputs: each log-prob
    within one bfloat16 step of X's and nearly all equal (measured: mean 0.00024)."""
    differences = {
        d.output: d for d in compare(serving_outputs._asdict(), serving_set, Tolerances())
    }
    assert all(d.ok for d in differences.values()), differences
    assert differences["log_probs"].max <= 0.0625 and differences["log_probs"].mean <= 0.001
    assert differences["continuous"].max <= 0.0625 and differences["continuous"].mean <= 0.001


def test_exact_keys_equal_x_training_kernel():
    """With the training kernel (exact key mask) X's outputs move; ours in 'exact' mode
    follow them."""
    ref = load_set(TRAINING_KERNEL)
    assert ref.config.attention_keys == "exact"  # from the set's attn_impl override
    outputs = ProductionRanker(ref.config, ref.params).rank(ref.inputs, ref.rows)
    differences = compare(jax.device_get(outputs)._asdict(), ref, Tolerances())
    assert all(d.ok for d in differences), differences


def test_outputs_over_the_tolerance_exit_1(tmp_path, capsys):
    """phoenix-check-reference on a reference whose X outputs are moved by 0.1 in one
    candidate row fails and names it (in process, the programs compiled above)."""
    from phoenix.ops import check_reference

    for suffix in (".json", "_params.npz"):
        shutil.copy(DATA / f"small_training_kernel{suffix}", tmp_path / f"moved{suffix}")
    with np.load(TRAINING_KERNEL) as data:
        arrays = {name: data[name] for name in data.files}
    arrays["out/log_probs"] = arrays["out/log_probs"].copy()
    arrays["out/log_probs"][1, 2] += 0.1
    np.savez(tmp_path / "moved.npz", **arrays)
    assert check_reference.main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "log_probs   max 0.1" in out and "OVER" in out
    assert "FAILED: moved over the tolerances" in err


def test_docs_example_runs(monkeypatch, capsys):
    """docs/production.md's Python example, from the repository root as a reader runs it."""
    text = (REPO_ROOT / "docs" / "production.md").read_text()
    block = text.split("<!-- production-example:start -->")[1].split("<!-- production-example")[0]
    monkeypatch.chdir(REPO_ROOT)
    exec(block.split("```python\n")[1].split("```")[0], {"__name__": "example"})
    assert 0.0 <= float(capsys.readouterr().out.split()[-1]) <= 0.0625  # a bfloat16 step


def test_hashes_and_gathered_rows_equal_x(serving_set):
    """Raw ids hashed by our code give X's rows (64-bit ids, the int64 wrap, id 0), and our
    gather from the table gives the rows X was fed."""
    with np.load(SERVING) as data:
        arrays = {name: data[name] for name in data.files}
    sizes = json.loads(SERVING.with_suffix(".json").read_text())["hash_table"]
    hashes = dataclasses.replace(
        NANO.hashes,
        user_table_size=sizes["user_id_table_size"],
        item_table_size=sizes["item_id_table_size"],
        author_table_size=sizes["author_id_table_size"],
        ip_table_size=sizes["ip_id_table_size"],
    )
    inputs = serving_set.inputs
    assert (arrays["hash/user_ids"] == 0).any() and (inputs.user.hashes == 0).any()
    np.testing.assert_array_equal(
        hash_user_ids(arrays["hash/user_ids"], hashes), inputs.user.hashes
    )
    np.testing.assert_array_equal(hash_ip_ids(arrays["hash/ip_ids"], hashes), inputs.user.ip_hashes)
    for side, seq in (("history", inputs.history), ("candidate", inputs.candidates)):
        post_ids, author_ids = arrays[f"hash/{side}_post_ids"], arrays[f"hash/{side}_author_ids"]
        np.testing.assert_array_equal(hash_item_ids(post_ids, hashes), seq.post_hashes)
        np.testing.assert_array_equal(hash_author_ids(author_ids, hashes), seq.author_hashes)
    table = jnp.asarray(arrays["hash/table_bf16_as_uint16"].view(jnp.bfloat16))
    for ours, theirs in zip(gather_rows(table, inputs), serving_set.rows, strict=True):
        np.testing.assert_array_equal(np.asarray(ours), theirs)


def test_engine_equals_full_forward_in_float32():
    """The split is exact: prefix once, candidates against its cache = one pass over the
    whole sequence (float32; histories full, crossing a block, inside the first, empty);
    candidates never see each other (scored in halves against one cache they score the
    same); rank_ids gathers the rows the rank of gathered rows takes."""
    from phoenix.ops.check_reference import full_forward

    params = init_params(TINY, seed=3, table_rows=TINY.hashes.num_rows)
    ranker = ProductionRanker(TINY, params)
    lengths = np.asarray([8, 3, 8, 1])
    inputs = example_inputs(TINY, 4, seed=4, history_lens=[254, 131, 37, 0],
                            candidate_lens=lengths)  # fmt: skip
    rows = gather_rows(ranker.table, inputs)
    cache = ranker.prefix(inputs, rows)
    L, P, K, d = TINY.num_layers, TINY.prefix_len, TINY.num_kv_heads, TINY.key_size
    assert cache.keys.shape == cache.values.shape == (L, 4, P, K, d)
    engine = ranker.score_candidates(cache, inputs, rows)
    full = full_forward(TINY)(ranker.weights, inputs, rows)
    real = np.arange(8)[None, :] < lengths[:, None]
    for name in ("logits", "continuous"):
        ours, plain = np.asarray(getattr(engine, name))[real], np.asarray(getattr(full, name))[real]
        np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-5)
    assert np.abs(np.asarray(engine.logits)[real]).max() > 0.1  # not a trivially small output
    for keep in (slice(0, 4), slice(4, None)):  # the other half turned to padding
        post = np.zeros_like(inputs.candidates.post_hashes)
        post[:, keep] = inputs.candidates.post_hashes[:, keep]
        part = inputs._replace(candidates=inputs.candidates._replace(post_hashes=post))
        scored = ranker.score_candidates(cache, part, rows)
        np.testing.assert_allclose(
            np.asarray(scored.logits)[:, keep], np.asarray(engine.logits)[:, keep], atol=1e-6
        )
    np.testing.assert_array_equal(ranker.rank_ids(inputs).logits, engine.logits)
    outside = inputs.history.post_hashes.copy()
    outside[1, 0, 1] = TINY.hashes.num_rows
    bad = inputs._replace(history=inputs.history._replace(post_hashes=outside))
    with pytest.raises(ValueError, match=r"history.post_hashes: rows must lie in \[0, 545\)"):
        ranker.rank_ids(bad)


def test_serving_kernel_keys_reach_the_end_of_the_last_history_block():
    config = dataclasses.replace(TINY, history_seq_len=382)  # P = 384: three blocks
    lengths = np.asarray([382, 200, 126, 127, 0])
    prefix_ok = np.arange(384)[None, :] < (lengths + 2)[:, None]
    keys = np.asarray(prefix_key_ok(jnp.asarray(prefix_ok), config))
    assert keys.sum(axis=1).tolist() == [384, 256, 128, 256, 128]
    exact = dataclasses.replace(config, attention_keys="exact")
    np.testing.assert_array_equal(prefix_key_ok(jnp.asarray(prefix_ok), exact), prefix_ok)


def test_right_anchored_positions():
    config = dataclasses.replace(TINY, history_seq_len=6, attention_block=8)  # P = 8
    prefix_ok = np.asarray([[1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0, 0, 0]], bool)
    positions = np.asarray(prefix_positions(jnp.asarray(prefix_ok), config))
    assert positions.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 6, 7, 0, 0, 0, 0]]


def test_x_override_strings_apply():
    config = apply_overrides(NANO, [
        "num_negatives_per_example=0", "history_seq_len=254", "candidate_seq_len=16",
        "attn_impl=pallas_ranker_attn", "use_seqpack=False", "right_anchored_rope=True",
        "model_config.model_config.sequence_len=272", "emb_size=32", "query_heads=2",
        "kv_heads=1", "model_config.feature_prep.sid_embed_dim=16",
    ])  # fmt: skip
    assert (config.history_seq_len, config.emb_size, config.num_q_heads) == (254, 32, 2)
    assert (config.num_kv_heads, config.sid_embed_dim) == (1, 16)
    assert config.attention_keys == "exact"


@pytest.mark.parametrize(
    "override, message",
    [
        ("no_such_field=1", "no field 'no_such_field'"),
        ("use_seqpack=True", "use_seqpack=False only"),
        ("model_config.model_config.sequence_len=1000", r"2 \+ 1022 \+ 64 = 1088"),
        ("history_seq_len=100", "must fill whole attention blocks"),
        ("emb_size=big", "invalid literal"),
        ("attn_impl=flash_attn", "attn_impl must be one of"),
        ("emb_size", "expected key=value"),
    ],
)
def test_bad_overrides_are_refused_by_name(override, message):
    with pytest.raises(ValueError, match=message):
        apply_overrides(NANO, [override])


def test_params_npz_by_haiku_path_round_trips(tmp_path):
    params = init_params(TINY, seed=1, table_rows=TINY.hashes.num_rows)
    save_params(tmp_path / "params.npz", params)
    loaded = load_params(tmp_path / "params.npz", TINY)
    assert loaded.keys() == params.keys()
    # X's files name each array with its Parameter leaf, "/0": loading strips it
    np.savez(tmp_path / "x.npz", **{f"{name}/0": value for name, value in params.items()})
    assert load_params(tmp_path / "x.npz", TINY).keys() == params.keys()


def test_nano_parameter_tree_is_x_s():
    shapes = param_shapes(NANO)
    assert len(shapes) == 52 and sum(int(np.prod(s)) for s in shapes.values()) == 11_088_640
    assert shapes["transformer/layer_stack/decoder_layer_0/multi_head_attention/qkv/w"] == (
        4, 512, 1024,
    )  # fmt: skip


def test_params_that_do_not_fit_are_named():
    params = init_params(TINY, seed=2)
    del params["~/hist_dwell_time_vec"]
    params["~/user_hash_0_proj"] = params["~/user_hash_0_proj"][:3]
    params["~/extra"] = np.zeros(3)
    with pytest.raises(ValueError) as error:
        check_params(params, TINY)
    for name in ("~/hist_dwell_time_vec", "~/user_hash_0_proj: shape (3, 32)", "~/extra"):
        assert name in str(error.value)


def test_programs_are_shared_per_config():
    assert programs(TINY) is programs(dataclasses.replace(TINY))


def test_bfloat16_steps():
    from phoenix.production.reference import bfloat16_step

    values = np.asarray([0.0, 1.0, 1.5, -0.7, 10.6875, 16.25, 30.0, 300.0])
    steps = [0.0, 2**-7, 2**-7, 2**-8, 2**-4, 2**-3, 2**-3, 2.0]
    np.testing.assert_array_equal(bfloat16_step(values), steps)
    bf16 = values.astype(jnp.bfloat16)  # each step is the gap to the next bfloat16 number
    away = np.where(values < 0, -np.inf, np.inf).astype(jnp.bfloat16)
    gap = np.abs(np.nextafter(bf16, away).astype(np.float64) - bf16.astype(np.float64))
    np.testing.assert_array_equal(gap[1:], steps[1:])


def test_continuous_values_pass_within_two_bfloat16_steps(serving_set, serving_outputs):
    """0.125 apart passes at 10.5 (two steps) and 16.25 (one step) but not at 1.5 (16 steps)
    nor with steps off; 0.375 apart (three steps) fails at 16.25."""
    moved = serving_outputs._asdict()
    expected = dict(serving_set.expected)
    cases = ((10.5, 0.125, True), (16.25, 0.125, True), (1.5, 0.125, False), (16.25, 0.375, False))
    for value, gap, ok in cases:
        expected["continuous"] = serving_set.expected["continuous"].copy()
        expected["continuous"][0, 0, 1] = value
        moved["continuous"] = serving_outputs.continuous.copy()
        moved["continuous"][0, 0, 1] = value + gap
        ref = serving_set._replace(expected=expected)
        continuous = compare(moved, ref, Tolerances())[2]
        assert (continuous.ok, continuous.over) == (ok, 1)
        assert not compare(moved, ref, Tolerances(continuous_steps=0))[2].ok
