"""Every client prints its help from its module docstring, run by module or by path."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["build_corpus", "compact", "demo", "encode_user", "events", "feed_policy", "ingest"]
CLIENTS += ["rank", "recommend", "retrieve"]


@pytest.mark.parametrize("name", CLIENTS)
def test_help_by_module_is_the_docstring(name, capsys):
    module = importlib.import_module(f"clients.{name}")
    with pytest.raises(SystemExit) as stopped:
        module.parse_args(["--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: python -m clients.{name} ")
    summary, _, rest = module.__doc__.partition("\n")
    assert summary in text and "Examples:" in rest and "Examples:" in text
    assert text.index("options:") < text.index("Examples:")  # examples after the options


@pytest.mark.parametrize("name", CLIENTS)
def test_help_by_path_runs_too(name, tmp_path):
    """`python clients/NAME.py` has no module spec; its help names the -m form all the same."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "clients" / f"{name}.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m clients.{name} ")
