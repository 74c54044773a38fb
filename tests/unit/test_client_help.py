"""Every command prints its help from its module docstring, its usage line naming the command a
user types: the console script `make setup` installs (phoenix-events), or `python -m` for the
ones without one (clients.demo). The installed scripts run as a user types them."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from phoenix.util.command_line import command_name

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["build_corpus", "compact", "demo", "encode_user", "events", "feed_policy", "ingest"]
CLIENTS += ["rank", "recommend", "retrieve"]
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SCRIPT_OF = {target.partition(":")[0]: script for script, target in SCRIPTS.items()}
BIN = Path(sys.executable).parent  # the venv's: where `make setup` installed the scripts


def typed_name(module: str) -> str:
    """The command of ``module`` as the docs tell a user to type it."""
    return SCRIPT_OF.get(module, f"python -m {module}")


@pytest.mark.parametrize("name", CLIENTS)
def test_help_by_module_is_the_docstring(name, capsys):
    module = importlib.import_module(f"clients.{name}")
    with pytest.raises(SystemExit) as stopped:
        module.parse_args(["--help"])
    assert stopped.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: {typed_name(f'clients.{name}')} ")
    summary, _, rest = module.__doc__.partition("\n")
    assert summary in text and "Examples:" in rest and "Examples:" in text
    assert text.index("options:") < text.index("Examples:")  # examples after the options
    if f"clients.{name}" in SCRIPT_OF:  # the examples as typed: the script's name
        assert "python -m" not in text.partition("Examples:")[2]


def test_the_command_name_is_the_installed_script_or_python_m():
    assert command_name("clients.events") == "phoenix-events"
    assert command_name("bench.bench_serving") == "phoenix-bench-serving"
    assert command_name("clients.demo") == "python -m clients.demo"  # no script: make demo


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_installed_script_names_itself_in_its_usage_line(script):
    """`phoenix-events --help` as a user types it: exit 0, `usage: phoenix-events ...`."""
    done = subprocess.run([str(BIN / script), "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {script} "), done.stdout[:200]
    assert "python -m" not in done.stdout.partition("Examples:")[2], done.stdout


def test_a_subcommands_usage_line_names_the_script_and_the_subcommand():
    done = subprocess.run([str(BIN / "phoenix-events"), "apply", "--help"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: phoenix-events apply ")


@pytest.mark.parametrize("name", ["demo", "recommend"])
def test_help_by_path_runs_too(name, tmp_path):
    """`python clients/NAME.py` has no module spec; its help names the command all the same."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "clients" / f"{name}.py"), "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {typed_name(f'clients.{name}')} ")
