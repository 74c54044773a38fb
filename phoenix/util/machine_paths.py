"""Text that names no folder of the machine that wrote it (imports the standard library only).

What the project writes for a reader elsewhere (a stub's profile summary, a benchmark's log or
result) would otherwise carry the writer's paths: the checkout, the Python's own files in a
traceback or a profile, the temporary folder. A reader of the repository cannot follow them.
"""

from __future__ import annotations

import re
import sys
import sysconfig
import tempfile
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding the phoenix package
SITE_PACKAGES = re.compile(r"(?:/[\w.@+-]+)+/(?:site|dist)-packages/")


def machine_prefixes(root: Path = CHECKOUT) -> list[tuple[str, str]]:
    """(a path prefix of this machine, what is written instead), the most specific first."""
    stdlib = sysconfig.get_paths()["stdlib"]
    temporary = str(Path(tempfile.gettempdir()).resolve())
    return [(f"{root}/", ""), (str(root), "."), (f"{stdlib}/", "<python>/"),
            (f"{sys.prefix}/", "<venv>/"), (sys.prefix, "<venv>"),
            (f"{temporary}/", "<tmp>/")]  # fmt: skip


def portable_text(text: str, root: Path = CHECKOUT) -> str:
    """``text`` with this machine's paths made readable anywhere: ``root``'s (the checkout)
    relative, site-packages' from ``site-packages/``, the standard library's from
    ``<python>/``, the running Python's environment's from ``<venv>/``, the temporary
    folder's from ``<tmp>/``."""
    text = SITE_PACKAGES.sub("site-packages/", text)
    for prefix, shown in machine_prefixes(root):
        text = text.replace(prefix, shown)
    return text


def main(argv=None) -> int:
    """Rewrite each FILE named in ``argv`` in place with ``portable_text`` (the GPU lease packs
    its logs so)."""
    for name in sys.argv[1:] if argv is None else argv:
        path = Path(name)
        path.write_text(portable_text(path.read_text(errors="replace")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
