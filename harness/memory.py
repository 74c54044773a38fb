"""Memory of processes: resident (RSS), and proportional (PSS: a page shared by N processes
counts 1/N in each, so the PSS of processes that map one file adds up to what they hold)."""

from __future__ import annotations

import psutil

GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, or None when it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except GONE:
        return None


def memory_bytes(pid: int) -> dict[str, int] | None:
    """PSS, RSS and USS (pages only this process holds) of a process; None when it is gone."""
    try:
        info = psutil.Process(pid).memory_full_info()
    except GONE:
        return None
    return {"pss": info.pss, "rss": info.rss, "uss": info.uss}


def server_rss(server_pid: int) -> dict[str, int]:
    """RSS in bytes of tritonserver and each of its stubs (by instance name), and the total
    (0 for a process gone meanwhile)."""
    from phoenix.stub.registry import list_stubs

    sizes = {"tritonserver": rss_bytes(server_pid) or 0}
    for stub in list_stubs(server_pid):
        sizes[stub.instance] = rss_bytes(stub.pid) or 0
    sizes["total"] = sum(sizes.values())
    return sizes
