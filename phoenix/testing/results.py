"""A benchmark's figures written as the committed result files are: JSON, one space indent."""

from __future__ import annotations

import json
from pathlib import Path

from phoenix.testing import REPO_ROOT


def shown_path(path: Path) -> str:
    """A path as results record it: relative to the checkout when inside it, so a result file
    names no folder of the machine it was measured on."""
    resolved = Path(path).resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def write_results(path: Path, results: dict) -> Path:
    """``results`` as JSON at ``path`` (its folder made if missing); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path
