"""Calls timed the way the xrex step times both forwards, X's (bench/xrex_side.py) and ours
(bench/bench_xrex.py): one call first (a compile, where the program is not made yet), then
``repeats`` calls, each one's outputs fetched to the host as serving fetches them. Imports
jax inside the function (X's side imports it only after X's release is on the path)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def timed_calls(call: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    """(seconds of the first call, seconds of each timed call, the first call's outputs on
    the host)."""
    import jax

    started = time.perf_counter()
    outputs = jax.device_get(call())
    first = time.perf_counter() - started
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.device_get(call())
        seconds.append(time.perf_counter() - started)
    return first, seconds, outputs


def milliseconds(seconds: list[float]) -> dict[str, Any]:
    """The timed calls as the results record them."""
    return {
        "ms": [round(s * 1e3, 3) for s in seconds],
        "median_ms": round(statistics.median(seconds) * 1e3, 3),
    }
