"""What every command line of the project shares (standard library only: the GPU machine's
bootstrap script imports it before anything is installed)."""

from __future__ import annotations

import argparse
from typing import Optional


def command_parser(
    prog: str, description: str, epilog: Optional[str] = None
) -> argparse.ArgumentParser:
    """An argument parser that prints ``description`` and ``epilog`` with their own line
    breaks (module docstrings, example lists) instead of rewrapping them."""
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
