"""Generated blocks of Markdown documents: the text between a start and an end marker (HTML
comments), written by a generator (`make configs`, the benchmarks' reports) and checked by a
test. Imports the standard library and phoenix.util."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Optional

from phoenix.util.command_line import command_parser


class DocBlockError(ValueError):
    """A document lacks a block's markers, or holds them more than once or out of order."""


def with_block(text: str, start: str, end: str, block: str, where: Path | str) -> str:
    """``text`` with what stands between ``start`` and ``end`` replaced by ``block``; each
    marker must be there once, the start first."""
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise DocBlockError(f"{where}: expected one {start} ... {end} block")
    before, rest = text.split(start)
    _, after = rest.split(end)
    return f"{before}{start}\n{block}\n{end}{after}"


def write_or_check(
    documents: Sequence[tuple[Path, str, str]], what: str, fix: str, check: bool
) -> int:
    """Write each stale document of ``documents`` ((path, its text, the text wanted)); with
    ``check``, write nothing and name them. Exit status: 0 up to date or written, 1 stale
    under ``check``."""
    stale = [(path, wanted) for path, text, wanted in documents if wanted != text]
    if not stale:
        print(f"{what}: up to date")
        return 0
    if check:
        names = ", ".join(str(path) for path, _ in stale)
        print(f"{names}: {what} out of date: run {fix}", file=sys.stderr)
        return 1
    for path, wanted in stale:
        path.write_text(wanted)
        print(f"{path}: {what} rewritten")
    return 0


def generator_main(
    argv: Optional[Sequence[str]],
    module: str,
    what: str,
    files: Mapping[str, Path],
    documents: Callable[[argparse.Namespace], Sequence[tuple[Path, str, str]]],
    label: str,
) -> int:
    """A block generator's command, ``python -m module``: an option per document it reads
    (``files``: option to default path) and --check; ``documents(args)`` reads and renders
    (path, its text, the text wanted), then ``write_or_check``. A file it cannot read or a
    block's markers amiss: a message on stderr and exit status 2."""
    parser = command_parser(f"python -m {module}", what)
    for option, default in files.items():
        parser.add_argument(option, type=Path, default=default, help="(%(default)s)")
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    args = parser.parse_args(argv)
    try:
        rendered = documents(args)
    except (OSError, DocBlockError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return write_or_check(rendered, label, f"python -m {module}", args.check)
