"""The stubs of one tritonserver, as they register themselves: Triton documents no way to tell
which process serves which model instance (docs/reliability.md, "The supervisor"). Every stub
imports this module: standard library and psutil only."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import psutil

STUB_DIR_ENV = "PHOENIX_STUB_DIR"


class StubProcess(NamedTuple):
    """One live Python-backend stub: its pid, the model instance it serves and that model's
    name as served (e.g. ranker__next during a rollout; "" when its stub did not say)."""

    pid: int
    instance: str
    model: str = ""


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, start time in ticks since boot) from /proc/<pid>/stat, None when it
    is gone; the command name may hold spaces and ')': fields follow the last ')'."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[19])


def register_stub(args: Mapping[str, str]) -> None:
    """Record this stub in $PHOENIX_STUB_DIR (from `ServiceModel.initialize`), if it is set."""
    directory = os.environ.get(STUB_DIR_ENV)
    if not directory:
        return
    pid, instance = os.getpid(), args["model_instance_name"]
    stat = _proc_stat(pid)
    assert stat is not None  # this process' own
    record = {"pid": pid, "instance": instance, "model": args.get("model_name", ""),
              "started": stat[2]}  # fmt: skip
    path = Path(directory) / f"{instance}.{pid}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record))
    partial.replace(path)  # a reader never sees half a record


def list_stubs(server_pid: int) -> list[StubProcess]:
    """The live stubs of the tritonserver `server_pid`: records whose process is alive, is a
    child of that server and started when the record says (a reused pid is not the stub). A
    killed stub stays a zombie (tritonserver never reaps it): dead, its record kept."""
    try:
        directory = psutil.Process(server_pid).environ().get(STUB_DIR_ENV)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return []
    stubs = []
    for path in sorted(Path(directory).glob("*.json")) if directory else []:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        stat = _proc_stat(record["pid"])
        if stat and stat[0] not in "ZX" and stat[1:] == (server_pid, record["started"]):
            stubs.append(StubProcess(record["pid"], record["instance"], record.get("model", "")))
    return stubs
