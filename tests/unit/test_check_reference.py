"""`phoenix-check-reference` (`make check-reference`): our production ranker against reference
folders written with X's code (tests/data/production), the way a user runs it; exit status 0
within the tolerances and 2 for a folder or file it cannot use (1, over the tolerances:
tests/unit/test_production_model.py, which has the programs compiled)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from phoenix.ops import check_reference

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = REPO_ROOT / "tests" / "data" / "production"


def test_command_passes_on_x_small_references(tmp_path):
    figures = tmp_path / "figures.json"
    done = subprocess.run(
        [sys.executable, "-m", "phoenix.ops.check_reference", str(DATA), "--json", str(figures)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ok: 2 reference set(s) within the tolerances" in done.stdout
    for name in ("small_serving", "small_training_kernel", "log_probs", "continuous"):
        assert name in done.stdout
    report = json.loads(figures.read_text())
    assert report["ok"] and [row["set"] for row in report["sets"]] == [
        "small_serving", "small_training_kernel",
    ]  # fmt: skip
    keys = {row["set"]: row["attention_keys"] for row in report["sets"]}
    assert keys == {"small_serving": "serving_kernel", "small_training_kernel": "exact"}
    for row in report["sets"]:
        by_output = {d["output"]: d for d in row["differences"]}
        assert by_output["log_probs"]["max"] <= 0.08 and by_output["log_probs"]["mean"] <= 0.005
        assert by_output["continuous"]["max"] <= 0.1


def test_unusable_folders_exit_2(tmp_path, capsys):
    assert check_reference.main([str(tmp_path / "missing")]) == 2
    assert "missing: not a folder" in capsys.readouterr().err
    assert check_reference.main([str(tmp_path)]) == 2
    assert "no reference set" in capsys.readouterr().err
    shutil.copy(DATA / "small_serving.npz", tmp_path / "alone.npz")
    assert check_reference.main([str(tmp_path)]) == 2
    assert "no alone_params.npz beside it" in capsys.readouterr().err


def test_parameters_of_another_config_exit_2(tmp_path, capsys):
    """X's parameters that do not fit the set's config are named, not run."""
    for suffix in (".npz", ".json"):
        shutil.copy(DATA / f"small_serving{suffix}", tmp_path / f"odd{suffix}")
    meta = json.loads((tmp_path / "odd.json").read_text())
    meta["overrides"] = [o for o in meta["overrides"] if not o.startswith("emb_size=")]
    meta["overrides"].append("emb_size=64")
    (tmp_path / "odd.json").write_text(json.dumps(meta))
    shutil.copy(DATA / "small_serving_params.npz", tmp_path / "odd_params.npz")
    assert check_reference.main([str(tmp_path)]) == 2
    assert "odd_params.npz: parameters do not fit the config" in capsys.readouterr().err
