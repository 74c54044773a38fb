"""Tiny trained artifacts shared by the slow and integration tests: trained once for all the
test processes of this code (tests/built_once.py), with the CPU programs their servers load.
Read-only: a test that changes them changes a copy."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from tests.built_once import built_once

PRESET, SEED = "tiny", 0


@functools.cache
def trained_tiny() -> tuple[Path, Path, dict]:
    """(artifact dir, log dir, training summary) of the tiny preset, seed 0, evaluated."""
    from phoenix.checkpoint.files import TRAINING_FILE
    from phoenix.ops.compile import ensure_programs
    from phoenix.training.pipeline import run_pipeline

    device = "cpu"

    def train(root: Path) -> None:
        run_pipeline(PRESET, root / "artifacts", seed=SEED, logs_dir=root / "logs",
                     log=lambda *_: None)  # fmt: skip
        # Once, here, as serve does: otherwise both instances of every model of the first
        # server over them compile every program at once, and a test serving a copy again.
        ensure_programs(root / "artifacts", device)

    root = built_once("trained-tiny", train, {"preset": PRESET, "seed": SEED, "device": device})
    artifacts = root / "artifacts"
    # run_pipeline's summary as it wrote it (what the tests read is plain JSON)
    summary = json.loads((artifacts / TRAINING_FILE).read_text())
    return artifacts, root / "logs", summary
