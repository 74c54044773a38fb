"""Tiny trained artifacts shared by the slow and integration tests (trained once per run)."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

SEED = 0


@functools.cache
def trained_tiny() -> tuple[Path, Path, dict]:
    """(artifact dir, log dir, training summary) of the tiny preset, seed 0, evaluated."""
    from phoenix.training.pipeline import run_pipeline

    root = Path(tempfile.mkdtemp(prefix="phoenix-trained-tiny-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    artifacts, logs = root / "artifacts", root / "logs"
    summary = run_pipeline("tiny", artifacts, seed=SEED, logs_dir=logs, log=lambda *_: None)
    return artifacts, logs, summary
