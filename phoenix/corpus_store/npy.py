"""Reading one ``.npy`` file where several threads read at once.

numpy parses a ``.npy`` header with ``ast.literal_eval``. CPython 3.11 keeps the AST
converter's recursion depth in interpreter-wide state, so two threads parsing headers at once
can fail one of them with ``SystemError: AST constructor recursion depth mismatch`` (seen in
CI: store readers and a follower thread opening segments together). One lock around the read
makes the parse single-file; the memory map it returns is then shared freely.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Literal, Optional

import numpy as np

HEADER_LOCK = threading.Lock()


def load_npy(path: Path, mmap_mode: Optional[Literal["r"]] = None) -> np.ndarray:
    """``np.load`` of one ``.npy`` file (no pickles), one thread at a time."""
    with HEADER_LOCK:
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
