"""The Python-backend stub processes of one tritonserver, read with psutil."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psutil

STUB_NAME = "triton_python_backend_stub"
# Triton 2.51 starts a stub as: stub model.py shm-region shm-size shm-growth parent-pid
# backend-dir ipc-size instance-name runtime-modifier; the instance name is argument 8.
STUB_INSTANCE_ARG = 8
_INSTANCE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+_\d+_\d+$")
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


@dataclass(frozen=True)
class StubProcess:
    """One live Python-backend stub: its pid and the model instance it serves."""

    pid: int
    instance: str


def stub_instance_of(argv: list[str]) -> str | None:
    """Instance name (e.g. 'retriever_0_0') from a stub's argv; None for other processes."""
    if not argv or Path(argv[0]).name != STUB_NAME or len(argv) <= STUB_INSTANCE_ARG:
        return None
    name = argv[STUB_INSTANCE_ARG]
    return name if _INSTANCE_NAME.match(name) else None


def _alive(process: psutil.Process) -> bool:
    # A killed stub stays a zombie: tritonserver never reaps it.
    try:
        return process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except _GONE:
        return False


def is_alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        return _alive(psutil.Process(pid))
    except _GONE:
        return False


def list_stubs(server_pid: int) -> list[StubProcess]:
    """Live stub processes whose parent is `server_pid`."""
    try:
        children = psutil.Process(server_pid).children()
    except _GONE:
        return []
    stubs = []
    for child in children:
        try:
            instance = stub_instance_of(child.cmdline()) if _alive(child) else None
        except _GONE:
            continue
        if instance:
            stubs.append(StubProcess(child.pid, instance))
    return stubs


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process, or None when it is gone."""
    try:
        return psutil.Process(pid).memory_info().rss
    except _GONE:
        return None
