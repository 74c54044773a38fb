"""What every command line of the project shares (standard library only: the GPU machine's
bootstrap script imports it before anything is installed)."""

from __future__ import annotations

import argparse
from functools import cache
from importlib import metadata
from typing import Optional

DISTRIBUTION = "phoenix-serve"  # pyproject.toml's project name


class _RawWithDefaults(
    argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter
):
    """The description's own line breaks, and "(default: ...)" after each option's help."""


def command_parser(
    prog: str, description: str, epilog: Optional[str] = None, *, show_defaults: bool = False
) -> argparse.ArgumentParser:
    """An argument parser that prints ``description`` and ``epilog`` with their own line
    breaks (module docstrings, example lists) instead of rewrapping them; ``show_defaults``:
    every option's help ends with its default."""
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=_RawWithDefaults if show_defaults else argparse.RawDescriptionHelpFormatter,
    )


@cache
def _console_scripts() -> dict[str, str]:
    """Module -> the console script `make setup` installs for its main() (pyproject.toml's
    [project.scripts], as installed); empty where the project is not installed."""
    try:
        entry_points = metadata.distribution(DISTRIBUTION).entry_points
    except metadata.PackageNotFoundError:
        return {}
    scripts = (e for e in entry_points if e.group == "console_scripts")
    return {e.value.partition(":")[0]: e.name for e in sorted(scripts, key=lambda e: e.name)}


def command_name(module: str) -> str:
    """What a user types to run ``module``: its installed console script (phoenix-events for
    clients.events), else ``python -m module``. The usage line of its --help says this."""
    return _console_scripts().get(module) or f"python -m {module}"


def port_number(text: str) -> int:
    """An option's TCP port: 0..65535, 0 for any free port."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0..65535; 0 = any free port)")
    return value


INT64_MAX = 2**63 - 1  # the served models' ids are int64


def id_number(text: str) -> int:
    """An option's user, post or author id: an integer in [0, 2**63 - 1] (the models' int64)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer id") from None
    if not 0 <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"{value} is not an id: ids lie in [0, 2**63 - 1]")
    return value


def id_numbers(text: str) -> list[int]:
    """A comma-separated list of ids (``id_number`` each)."""
    return [id_number(item) for item in text.split(",") if item.strip()]
