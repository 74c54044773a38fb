"""What one run of the loop does (``LoopOptions``), how it reports progress (``Progress``) and
the error a broken step raises (``LoopError``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional


class LoopError(RuntimeError):
    """A step of the loop that broke (the message names the step and where its log is)."""


@dataclass(frozen=True)
class LoopOptions:
    """What one run of the loop does; the defaults are ``make loop``'s."""

    out: Path = Path("bench/results/loop")
    work: Path = Path("build/loop")
    preset: str = "demo"
    seed: int = 0
    v1_retrieval_steps: int = 100
    v1_ranker_steps: int = 200
    v2_retrieval_steps: Optional[int] = None  # None: retrain's default (a quarter of the preset's)
    v2_ranker_steps: Optional[int] = None
    minutes: float = 2.0
    # 64, not 16: v2 learns from these users' served logs and the gate evaluates one request
    # per user, so 16 users gave v2 too little to learn from and the gate too little to judge
    # by (docs/loop.md, "Why 64 users")
    users: int = 64
    world_seed: int = 0
    history_keep: int = 64
    top_n: int = 10
    top_k: int = 10  # = top_n: only the posts a user views are marked served
    shadow_seconds: float = 10.0
    settle_seconds: float = 5.0  # reacting users before and after the rollout
    force: bool = False
    serve_timeout_s: float = 600.0

    def __post_init__(self):
        if not self.minutes > 0:
            raise ValueError(f"--minutes must be > 0, got {self.minutes}")
        if self.users < 1:
            raise ValueError(f"--users must be >= 1, got {self.users}")
        if not 1 <= self.top_n <= self.top_k:
            raise ValueError(f"need 1 <= --top-n <= --top-k, got {self.top_n} and {self.top_k}")
        if self.v1_retrieval_steps < 1 or self.v1_ranker_steps < 1:
            raise ValueError("--v1-retrieval-steps and --v1-ranker-steps must be >= 1")
        if self.shadow_seconds < 0 or self.settle_seconds < 0:
            raise ValueError("--shadow-seconds and --settle-seconds must be >= 0")


class Progress:
    """Prints ``[HH:MM:SS +SECONDS s] text`` lines; ``step`` records each step's times."""

    def __init__(self, write: Callable[[str], None] = print):
        self.write = write
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.steps: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.write(f"[{stamp} +{self.elapsed():6.1f} s] {text}")

    @contextlib.contextmanager
    def step(self, name: str, what: str) -> Iterator[None]:
        start = self.elapsed()
        self(f"{name}: {what}")
        yield
        seconds = self.elapsed() - start
        self.steps.append({"step": name, "what": what, "start_s": round(start, 1),
                           "seconds": round(seconds, 1)})  # fmt: skip
        self(f"{name}: done in {seconds:.1f} s")
