"""CPU time of a served stack's processes: tritonserver, each model's stubs, a helper such as
redis-server. A load run's CPU per request and per step is the difference of two readings
divided by the requests, a measure that other work on the machine does not inflate (unlike
Triton's compute times, which count the waits for a core)."""

from __future__ import annotations

from collections.abc import Mapping

import psutil

from harness.memory import GONE


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 when it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except GONE:
        return 0.0
    return times.user + times.system


def served_cpu_seconds(server_pid: int, **helpers: int) -> dict[str, float]:
    """CPU seconds so far of tritonserver, of each model's stubs together (by the name each
    stub registered) and of each ``helpers`` process (name=pid)."""
    from phoenix.stub.registry import list_stubs

    seconds = {"tritonserver": cpu_seconds(server_pid)}
    for stub in list_stubs(server_pid):
        name = stub.model or stub.instance
        seconds[name] = seconds.get(name, 0.0) + cpu_seconds(stub.pid)
    for name, pid in helpers.items():
        seconds[name] = cpu_seconds(pid)
    return seconds


def cpu_ms_per_request(
    before: Mapping[str, float], after: Mapping[str, float], requests: int
) -> dict[str, float]:
    """{process: CPU milliseconds per request} between two readings, and their ``total``."""
    spent = {
        name: (after[name] - before.get(name, 0.0)) * 1000 / max(requests, 1) for name in after
    }
    spent["total"] = sum(spent.values())
    return {name: round(ms, 2) for name, ms in spent.items()}
