"""`phoenix-artifacts --ranker production` as docs/production.md types it: X's nano preset at
its full geometry, and the ranker of one of X's checkpoints (tests/data/xai_checkpoint, written
by X's own trainer code) served at other lengths by ``--ranker-override``. The checkpoint's
ranker must rank as its weights loaded any other way: the arrays X's trainer held in memory
before it saved them (tests/data/xai_checkpoint/expected.npz)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from phoenix.checkpoint import load_config, load_example_sequence
from phoenix.checkpoint.production import load_production_ranker, production_config
from phoenix.production import forward
from phoenix.production.examples import example_inputs
from phoenix.production.hashing import gather_rows
from phoenix.production.params import canonical_name, device_table, device_weights
from tests.conftest import DATA_DIR

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = DATA_DIR / "xai_checkpoint"
RUN = CHECKPOINT / "home_direct_packed_nano_offline_kafka_dump"
# Serving lengths of our own (user and history fill one attention block of 128), and hash
# tables small enough for the checkpoint's 128-row table (X's real one has every row).
OVERRIDES = (
    "history_seq_len=126", "candidate_seq_len=8", "user_table_size=16", "item_table_size=16",
    "author_table_size=16", "ip_table_size=8",
)  # fmt: skip


def phoenix_artifacts(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "phoenix.artifacts", "--ranker", "production", *args]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_the_nano_preset_has_xs_nano_geometry(tmp_path):
    out = tmp_path / "production-nano"
    done = phoenix_artifacts("--preset", "nano", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"wrote {out}" in done.stdout and "production ranker emb 512, 4 layers" in done.stdout
    ranker = production_config(load_config(out))
    assert (ranker.emb_size, ranker.num_layers, ranker.num_q_heads, ranker.num_kv_heads) == (
        512, 4, 4, 2,
    )  # fmt: skip
    assert (ranker.key_size, ranker.history_seq_len, ranker.candidate_seq_len) == (128, 1022, 64)
    example = load_example_sequence(out)
    assert 0 < len(example.history_post_ids) <= 1022


def test_the_preset_tiny_command_refuses_an_occupied_folder(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    done = phoenix_artifacts("--preset", "tiny", "--out", str(tmp_path / "taken"))
    assert done.returncode == 2 and "is not empty (use --force to overwrite)" in done.stderr


def test_a_checkpoints_ranker_ranks_as_its_weights_loaded_any_other_way(tmp_path):
    """The documented command with the tests' checkpoint and overrides of its own; the forward
    over the artifacts' parameters equals the forward over the trainer's arrays."""
    out = tmp_path / "from-checkpoint"
    done = phoenix_artifacts(
        "--preset", "nano", "--out", str(out), "--ranker-checkpoint", str(RUN),
        *[f"--ranker-override={o}" for o in OVERRIDES],
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    loaded = load_production_ranker(out)
    assert (loaded.config.history_seq_len, loaded.config.candidate_seq_len) == (126, 8)
    assert (loaded.config.emb_size, loaded.config.num_layers) == (16, 2)  # the checkpoint's

    with np.load(CHECKPOINT / "expected.npz") as archive:  # bfloat16 kept as its raw bits
        trainer = {canonical_name(k): archive[k] for k in archive.files if k != "step"}
    bits = trainer["emb_table"].view(np.uint16).astype(np.uint32) << 16
    trainer["emb_table"] = bits.view(np.float32)  # bfloat16 -> float32, exactly
    assert sorted(trainer) == sorted(loaded.params)
    for name, array in trainer.items():
        np.testing.assert_array_equal(loaded.params[name], array, err_msg=name)

    config = dataclasses.replace(loaded.config, compute_dtype="float32")
    # two users, a full and a partial history, one candidate list short of the width
    inputs = example_inputs(config, 2, seed=5, history_lens=[126, 9], candidate_lens=[8, 5])
    run = jax.jit(forward, static_argnames="config")

    def outputs(params):
        rows = gather_rows(device_table(params, config), inputs)
        result = run(device_weights(params, config), inputs, rows, config=config)
        return np.asarray(result.logits), np.asarray(result.continuous)

    served_logits, served_continuous = outputs(loaded.params)
    trainer_logits, trainer_continuous = outputs(trainer)
    np.testing.assert_array_equal(served_logits, trainer_logits)
    np.testing.assert_array_equal(served_continuous, trainer_continuous)
    assert np.isfinite(served_logits).all() and served_logits.std() > 0
    assert json.loads((out / "config.json").read_text())["ranker_family"] == "production"
