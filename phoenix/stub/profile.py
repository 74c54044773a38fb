"""Where a stub's time goes: cProfile around every ``execute``, written out when the stub ends.

Set ``PHOENIX_STUB_PROFILE`` to a folder before starting the server (the stubs inherit it):
each model instance then profiles its ``execute`` calls and, in ``finalize``, writes

    <instance>-<pid>.prof   the raw statistics (``python -m pstats`` reads them)
    <instance>-<pid>.txt    executions and requests seen, and the 40 functions with the most
                            time of their own

Meant for machines without a sampling profiler (no perf, gdb or py-spy): it is how the host
work per request that bounds a served ranker on a GPU was found (docs/gpu.md, "Profiling a
stub"). Off unless the variable is set: cProfile slows the code it watches.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from phoenix.util.machine_paths import portable_text

PROFILE_ENV = "PHOENIX_STUB_PROFILE"
TOP_FUNCTIONS = 40


class StubProfile:
    """One model instance's profile, written to ``folder``."""

    def __init__(self, folder: Path, instance: str):
        self.folder = folder
        self.instance = instance
        self.executions = 0
        self.requests = 0
        self._profile = cProfile.Profile()

    @classmethod
    def from_environment(cls, instance: str) -> Optional[StubProfile]:
        """The instance's profile when PROFILE_ENV names a folder; None when it is unset."""
        folder = os.environ.get(PROFILE_ENV, "")
        return cls(Path(folder), instance) if folder else None

    @contextmanager
    def execution(self, requests: int):
        """Profile what runs inside (one ``execute`` of ``requests`` requests)."""
        self.executions += 1
        self.requests += requests
        self._profile.enable()
        try:
            yield
        finally:
            self._profile.disable()

    def save(self) -> Optional[Path]:
        """Write the statistics and their summary; the summary's path (None: nothing ran)."""
        if not self.executions:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = self.folder / f"{self.instance}-{os.getpid()}"
        self._profile.dump_stats(stem.with_suffix(".prof"))
        summary = stem.with_suffix(".txt")
        summary.write_text(self.summary())
        return summary

    def summary(self) -> str:
        out = io.StringIO()
        out.write(
            f"{self.instance}: {self.executions} executions, {self.requests} requests "
            f"({self.requests / self.executions:.1f} per execution)\n"
        )
        stats = pstats.Stats(self._profile, stream=out)
        stats.sort_stats("tottime").print_stats(TOP_FUNCTIONS)
        return portable_text(out.getvalue())  # frames name no folder of this machine
