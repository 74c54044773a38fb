"""A benchmark's figures written as the committed result files are: JSON, one space indent."""

from __future__ import annotations

import json
from pathlib import Path


def write_results(path: Path, results: dict) -> Path:
    """``results`` as JSON at ``path`` (its folder made if missing); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path
