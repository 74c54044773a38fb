"""Embedding posts for a corpus: the server's `candidate_tower`, or the one in this process.

Both have one signature, ``embed(post_ids [n], author_ids [n], progress=None) -> float32
[n, D]`` (``progress`` is called with the posts just embedded), so that building a store,
ingesting into one and writing a corpus file do not care where the tower runs.
``emb_size`` is the tower's width when it is known before it has answered (in process), else
None. ``tower_identity`` names the tower, as a store records it (``towers``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional, Protocol

import numpy as np

from phoenix.corpus_store.manifest import EmbeddedBy
from phoenix.corpus_store.towers import tower_of

Progress = Callable[[int], None]
IN_PROCESS, SERVED = "in-process", "served"
WHERE = (IN_PROCESS, SERVED)


class EmbedPosts(Protocol):
    emb_size: Optional[int]

    def __call__(
        self, post_ids: np.ndarray, author_ids: np.ndarray, progress: Optional[Progress] = None
    ) -> np.ndarray: ...


class ServedCandidateTower:
    """The running server's `candidate_tower`, asked ``batch_size`` posts a request."""

    emb_size: Optional[int] = None  # known once the server has answered

    def __init__(self, client, protocol: str, batch_size: int):
        self.client = client
        self.protocol = protocol
        self.batch_size = served_batch_limit(client, protocol, batch_size)

    def __call__(
        self, post_ids: np.ndarray, author_ids: np.ndarray, progress: Optional[Progress] = None
    ) -> np.ndarray:
        from phoenix.client.client import infer

        parts = []
        for start in range(0, len(post_ids), self.batch_size):
            rows = slice(start, min(len(post_ids), start + self.batch_size))
            arrays = {"post_id": post_ids[rows, None], "author_id": author_ids[rows, None]}
            wanted = ["candidate_embedding"]
            out = infer(self.client, self.protocol, "candidate_tower", arrays, wanted)
            parts.append(out["candidate_embedding"])
            if progress is not None:
                progress(rows.stop - rows.start)
        if not parts:
            return np.zeros((0, 0), np.float32)
        return np.concatenate(parts).astype(np.float32)


def served_batch_limit(client, protocol: str, wanted: int) -> int:
    """``wanted`` posts a request, capped at candidate_tower's max_batch_size."""
    from phoenix.client.inprocess import server_model_config

    limit = int(server_model_config(client, protocol, "candidate_tower").get("max_batch_size", 0))
    return max(1, min(wanted, limit) if limit > 0 else wanted)


def candidate_tower(
    where: str,
    *,
    artifacts: Optional[Path] = None,
    client=None,
    protocol: str = "http",
    batch_size: int = 1024,
) -> EmbedPosts:
    """The tower ``where`` names: ARTIFACTS' in this process (``batch_size`` rows a compiled
    call; ArtifactError if they do not load), or the server's through ``client``
    (``batch_size`` posts a request; the server's errors if it does not answer)."""
    if where == IN_PROCESS:
        from phoenix.engine.candidate_tower import CandidateTower  # imports JAX: only now

        return CandidateTower.from_artifacts(artifacts, rows_per_call=batch_size)
    if where == SERVED:
        return ServedCandidateTower(client, protocol, batch_size)
    raise ValueError(f"where: {where!r}, expected one of {WHERE}")


def tower_identity(
    where: str, *, artifacts: Optional[Path] = None, client=None, protocol: str = "http"
) -> EmbeddedBy:
    """The ``EmbeddedBy`` of the tower ``where`` names: ARTIFACTS' own in process; for the
    server's, the candidate tower of the artifact directory the server states it serves,
    read on this machine (ArtifactMismatch when it is not here or changed since the server
    loaded it; ARTIFACTS when the server does not say which it serves)."""
    if where == IN_PROCESS:
        return tower_of(artifacts)
    from phoenix.ops.served_artifacts import choose_artifacts, served_artifacts

    served = served_artifacts(client, protocol, models=("candidate_tower",))
    return tower_of(choose_artifacts(None, served, artifacts))
