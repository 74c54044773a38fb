"""Waiting, bounded, for a condition that another process makes true."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout_s: float, interval_s: float = 0.05):
    """time.monotonic() when ``condition()`` first holds; None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(interval_s)
    return None
