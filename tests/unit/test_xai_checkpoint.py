"""phoenix.checkpoint.xai against a checkpoint written by X's own trainer code (xrex's
checkpoint_write.save_checkpoint, orbax-checkpoint 0.9.1: tests/data/xai_checkpoint/README.md):
the exact arrays, the three ways to name a step, and every kind of damage refused with the
file named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from phoenix.checkpoint.xai import (
    XaiCheckpointError,
    find_step_directory,
    haiku_name,
    load_xai_checkpoint,
)
from phoenix.checkpoint.xai_integrity import Extent, array_locations
from tests.conftest import DATA_DIR, REPO_ROOT

DATA = DATA_DIR / "xai_checkpoint"
RUN = "home_direct_packed_nano_offline_kafka_dump"
ELAPSED = "elapsed_samples_000000000000004096"
SID_TABLE = "params.~.feat_prep_post_sid_combined"  # the largest array: its own data file


def step_of(run_dir: Path) -> Path:
    (step,) = (run_dir / ELAPSED).iterdir()
    return step


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(DATA / "expected.npz") as archive:
        return {key: archive[key] for key in archive.files}


@pytest.fixture(scope="module")
def loaded():
    return load_xai_checkpoint(DATA / RUN, extra=["emb_table"])


@pytest.fixture
def run_copy(tmp_path) -> Path:
    """A copy of the run directory to damage."""
    target = tmp_path / RUN
    shutil.copytree(DATA / RUN, target, symlinks=True)
    return target.resolve()


def refused(path: Path, **kwargs) -> str:
    with pytest.raises(XaiCheckpointError) as caught:
        load_xai_checkpoint(path, **kwargs)
    return str(caught.value)


def data_extent(step: Path, name: str) -> tuple[Path, Extent]:
    """The data file holding the array ``name`` (one chunk), and where in it."""
    (extent,) = array_locations(step / "orbax-ckpt")[name].extents
    return step / "orbax-ckpt" / extent.file, extent


# ----------------------------------------------------------------------------------------
# A good checkpoint
# ----------------------------------------------------------------------------------------


def test_the_parameters_are_the_saved_arrays_exactly(loaded, expected):
    params = {k: v for k, v in expected.items() if k.endswith("/0")}
    assert len(params) == 52
    assert sorted(loaded.params) == sorted(params)
    for name, array in params.items():
        assert loaded.params[name].dtype == array.dtype == np.float32, name
        np.testing.assert_array_equal(loaded.params[name], array, err_msg=name)
    # layer weights stacked on a leading axis (2 layers), as in the nano golden parameters
    qkv = "transformer/layer_stack/decoder_layer_0/multi_head_attention/qkv/w/0"
    assert loaded.params[qkv].shape == (2, 16, 256)


def test_the_step_config_and_extra_entries(loaded, expected):
    assert loaded.step == int(expected["step"]) == 64
    assert loaded.elapsed_samples == 4096
    assert loaded.config_name == RUN
    assert loaded.config["model_config"]["model_config"]["num_layers"] == 2
    table = loaded.extra["emb_table"]
    assert str(table.dtype) == "bfloat16" and table.shape == expected["emb_table"].shape
    np.testing.assert_array_equal(table.view(np.uint16), expected["emb_table"].view(np.uint16))
    assert loaded.not_loaded["opt_state"] == 88 and "emb_table" not in loaded.not_loaded
    assert loaded.verified


def test_a_run_an_elapsed_or_a_step_directory_name_the_same_step(run_copy):
    step = step_of(run_copy)
    assert find_step_directory(run_copy) == step.resolve()
    assert find_step_directory(run_copy / ELAPSED) == step.resolve()
    assert find_step_directory(step) == step.resolve()
    assert find_step_directory(run_copy / "latest") == step.resolve()


def test_a_checkpoint_root_with_one_run_names_its_newest_step(run_copy):
    root = run_copy.parent
    assert find_step_directory(root) == step_of(run_copy).resolve()
    shutil.copytree(run_copy, root / "other_run", symlinks=True)
    with pytest.raises(
        XaiCheckpointError, match=rf"^{root}: holds several runs \({RUN}, other_run\)"
    ):
        find_step_directory(root)


def test_a_newer_step_without_its_completed_marker_is_passed_over(run_copy):
    """An interrupted save (no 'completed') is not a step to load, as in xrex's discovery;
    ``latest`` pointing at it is passed over too."""
    step = step_of(run_copy)
    newer = run_copy / "elapsed_samples_000000000000008192" / step.name
    shutil.copytree(step, newer)
    (newer / "completed").unlink()
    (run_copy / "latest").unlink()
    (run_copy / "latest").symlink_to(newer.relative_to(run_copy))
    assert find_step_directory(run_copy) == step.resolve()
    (newer / "completed").write_text("8192")
    assert find_step_directory(run_copy) == newer.resolve()


def test_haiku_names():
    assert haiku_name("params.~.user_hash_0_proj") == "~/user_hash_0_proj/0"
    assert haiku_name("params.transformer/layer_stack/x.w") == "transformer/layer_stack/x/w/0"
    assert haiku_name("params.recsys_aggregated_model.unembeddings.0") == (
        "recsys_aggregated_model/unembeddings/0"
    )
    with pytest.raises(ValueError, match="opt_state.count"):
        haiku_name("opt_state.count")


# ----------------------------------------------------------------------------------------
# Damage, each refused with the file named
# ----------------------------------------------------------------------------------------


def test_a_deleted_data_file(run_copy):
    path, _ = data_extent(step_of(run_copy), SID_TABLE)
    path.unlink()
    message = refused(run_copy)
    assert message.startswith(f"{path}: missing: it holds arrays ") and SID_TABLE in message


def test_a_truncated_data_file(run_copy):
    path, _ = data_extent(step_of(run_copy), SID_TABLE)
    os.truncate(path, path.stat().st_size // 2)
    message = refused(run_copy)
    assert message.startswith(f"{path}: truncated: {path.stat().st_size} bytes, but array ")


def test_flipped_bytes_in_a_data_file(run_copy):
    """One byte inside the sid table's stored bytes: Orbax reads it without complaint (array
    chunks are stored raw, unchecked), the Adler-32 of checksums.0.json catches it."""
    path, extent = data_extent(step_of(run_copy), SID_TABLE)
    data = bytearray(path.read_bytes())
    data[extent.offset + extent.length // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    message = refused(run_copy)
    checksums = step_of(run_copy) / "checksums.0.json"
    assert message.startswith(
        f"{checksums}: checksum mismatch for '{SID_TABLE}': the array read from {path} has "
    )


def test_an_edited_checksum(run_copy):
    path = step_of(run_copy) / "checksums.0.json"
    document = json.loads(path.read_text())
    document["global_checksums"]["params.~.user_hash_0_proj"] ^= 1
    path.write_text(json.dumps(document))
    message = refused(run_copy)
    assert message.startswith(f"{path}: checksum mismatch for 'params.~.user_hash_0_proj'")
    # --no-verify reads it all the same (the structure is still checked)
    assert load_xai_checkpoint(run_copy, verify=False).verified is False


def test_no_verify_reads_no_checksum_file(run_copy):
    (step_of(run_copy) / "checksums.0.json").unlink()
    checkpoint = load_xai_checkpoint(run_copy, verify=False)
    assert not checkpoint.verified and len(checkpoint.params) == 52


def test_an_entry_the_state_does_not_have(run_copy):
    metadata = step_of(run_copy) / "orbax-ckpt" / "_METADATA"
    assert refused(run_copy, extra=["emb_tables"]) == (
        f"{metadata}: the saved tree has no 'emb_tables' (its entries: calib_ema, emb_table, "
        "emb_table_state, offset_keys, offset_values, opt_state, params, post_embeddings, "
        "rce_ema, rng, step)"
    )


def test_a_recorded_shape_that_differs(run_copy):
    path = step_of(run_copy) / "checksums.0.json"
    document = json.loads(path.read_text())
    document["shapes"][SID_TABLE] = [1800, 8]
    path.write_text(json.dumps(document))
    assert refused(run_copy) == (
        f"{path}: '{SID_TABLE}' recorded with shape (1800, 8), but the array read is (1799, 8)"
    )


@pytest.mark.parametrize(
    "relative, problem",
    [
        ("config.json", "missing: the run's training config"),
        ("checksums.0.json", "missing: the tensors' checksums"),
        ("orbax-ckpt/_METADATA", "missing: Orbax's record of the saved tree"),
        ("orbax-ckpt/manifest.ocdbt", "missing: the OCDBT manifest"),
        ("completed", "missing: the trainer never marked this step complete"),
    ],
)
def test_a_missing_file(run_copy, relative, problem):
    step = step_of(run_copy)
    (step / relative).unlink()
    assert refused(step).startswith(f"{step / relative}: {problem}")


def test_a_run_directory_without_a_complete_step(run_copy):
    (step_of(run_copy) / "completed").unlink()
    assert "no complete step found" in refused(run_copy)


def test_a_damaged_tree_node(run_copy):
    """The B+tree node file (in orbax-ckpt/d/) holds every key; damaged, it is named."""
    step = step_of(run_copy)
    (node,) = (step / "orbax-ckpt" / "d").iterdir()
    node.write_bytes(b"\0" * node.stat().st_size)
    message = refused(step)
    assert message.startswith(f"{node}: an OCDBT B+tree node cannot be read")


def test_config_json_that_is_not_json(run_copy):
    path = step_of(run_copy) / "config.json"
    path.write_text("{name: nano")
    assert refused(run_copy).startswith(f"{path}: not readable JSON")


def test_an_uncommitted_orbax_save(run_copy):
    step = step_of(run_copy)
    pending = step / "orbax-ckpt.orbax-checkpoint-tmp-1796179383"
    (step / "orbax-ckpt").rename(pending)
    assert refused(step) == f"{pending}: an Orbax save that was never committed"


def save_other_state(step: Path, state: dict) -> Path:
    """Replace the step's Orbax tree by ``state`` (saved with our orbax-checkpoint)."""
    import orbax.checkpoint as ocp

    shutil.rmtree(step / "orbax-ckpt")
    ocp.PyTreeCheckpointer().save(step / "orbax-ckpt", state)
    return step / "orbax-ckpt" / "_METADATA"


def test_a_state_without_params(run_copy):
    step = step_of(run_copy)
    metadata = save_other_state(step, {"weights": {"w": np.zeros(3, np.float32)}})
    assert refused(step) == f"{metadata}: the saved tree has no 'params' (its entries: weights)"


def test_params_that_are_not_haiku_modules(run_copy):
    step = step_of(run_copy)
    metadata = save_other_state(step, {"params": {"a": {"b": {"w": np.zeros(3, np.float32)}}}})
    assert refused(step) == (
        f"{metadata}: unexpected structure: 'params.a.b.w' is not a Haiku parameter "
        "'params.<module>.<name>'"
    )


def test_old_checksum_versions_are_refused(run_copy):
    path = step_of(run_copy) / "checksums.0.json"
    path.write_text(json.dumps({"shapes": {}}))
    assert refused(run_copy) == (
        f"{path}: checksum format version 1 records no per-tensor checksums (versions 2 and 3 do)"
    )


# ----------------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "phoenix.checkpoint.xai", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)


def test_the_command_lists_a_good_checkpoint():
    done = run_cli(str(DATA / RUN))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1] == f"config      {RUN}"
    assert lines[2] == "step        64 (elapsed samples 4096)"
    assert lines[3] == "params      52 arrays, 54,584 values"
    assert any(
        line.split() == ["~/feat_prep_post_sid_combined/0", "(1799,", "8)", "float32"]
        for line in lines
    )
    assert "opt_state (88 arrays)" in lines[-2] and "rng (1 array)" in lines[-2]
    assert lines[-1] == "verified    ok: 53 arrays match checksums.0.json"


def test_the_command_refuses_a_damaged_checkpoint(run_copy):
    (step_of(run_copy) / "config.json").unlink()
    done = run_cli(str(run_copy))
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: {step_of(run_copy) / 'config.json'}: missing: the run's training config",
        "verified    no",
    ]
