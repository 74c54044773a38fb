"""A benchmark's figures written as the committed result files are: JSON, one space indent, and
no path of the machine that measured them (``phoenix.util.machine_paths``)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from harness import REPO_ROOT
from phoenix.util.machine_paths import portable_text


def shown_path(path: Path | str) -> str:
    """A path as results record it: relative to the checkout when inside it, as
    ``portable_text`` writes it when in a Python's or the temporary folder, else its name
    alone (a program found on the PATH, a folder of the measuring machine)."""
    resolved = Path(path).resolve()
    if resolved.is_relative_to(REPO_ROOT):
        return str(resolved.relative_to(REPO_ROOT))
    shown = portable_text(str(resolved), REPO_ROOT)
    return shown if shown != str(resolved) else resolved.name


def command_line(module: str, argv) -> str:
    """The command that ran a benchmark, as its results record it: ``python -m MODULE`` and
    its arguments (``argv``; None: this process's), no path of this machine."""
    return portable_text(shlex.join(["python", "-m", module, *(argv or sys.argv[1:])]))


def write_results(path: Path, results: dict) -> Path:
    """``results`` as JSON at ``path`` (its folder made if missing); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    return path


def add_work_and_out(parser: argparse.ArgumentParser, work: Path, out: Path) -> None:
    """A benchmark's --work (its scratch folder, under build/) and --out (its results JSON)."""
    parser.add_argument(
        "--work", type=Path, default=work, help="scratch folder (default: %(default)s)"
    )
    parser.add_argument(
        "--out", type=Path, default=out, help="the results' JSON (default: %(default)s)"
    )
