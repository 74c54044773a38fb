"""Tiny trained artifacts shared by the slow and integration tests: trained once for all the
test processes of this code (tests/built_once.py), the programs their servers compile
included. Read-only: a test that changes them changes a copy."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.built_once import built_once

PRESET, SEED = "tiny", 0


@functools.cache
def trained_tiny() -> tuple[Path, Path, dict]:
    """(artifact dir, log dir, training summary) of the tiny preset, seed 0, evaluated."""
    from phoenix.training.pipeline import TRAINING_FILE, run_pipeline

    def train(root: Path) -> None:
        run_pipeline(PRESET, root / "artifacts", seed=SEED, logs_dir=root / "logs",
                     log=lambda *_: None)  # fmt: skip

    root = built_once("trained-tiny", train, {"preset": PRESET, "seed": SEED})
    artifacts = root / "artifacts"
    # run_pipeline's summary as it wrote it (what the tests read is plain JSON)
    summary = json.loads((artifacts / TRAINING_FILE).read_text())
    return artifacts, root / "logs", summary
