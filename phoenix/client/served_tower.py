"""The candidate tower for the corpus tools: the running server's ``candidate_tower`` asked
over tritonclient (``ServedCandidateTower``), or ARTIFACTS' in this process; both embed posts
as ``phoenix.corpus_store.embedding.EmbedPosts`` says. ``tower_identity`` names the tower, as a
store records it (``phoenix.corpus_store.towers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from phoenix.client.client import infer
from phoenix.client.inprocess import server_model_config
from phoenix.client.served_artifacts import choose_artifacts, served_artifacts
from phoenix.corpus_store.embedding import EmbedPosts, Progress
from phoenix.corpus_store.manifest import EmbeddedBy
from phoenix.corpus_store.towers import tower_of
from phoenix.schema.contracts import CANDIDATE_TOWER

IN_PROCESS, SERVED = "in-process", "served"
WHERE = (IN_PROCESS, SERVED)


TOWER_INPUTS = (CANDIDATE_TOWER.input("post_id"), CANDIDATE_TOWER.input("author_id"))


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
        parts = []
        for start in range(0, len(post_ids), self.batch_size):
            rows = slice(start, min(len(post_ids), start + self.batch_size))
            arrays = {  # [rows, 1] each, in the contract's dtypes
                spec.name: np.asarray(ids[rows, None], spec.dtype)
                for spec, ids in zip(TOWER_INPUTS, (post_ids, author_ids))
            }
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

        if artifacts is None:
            raise ValueError("the candidate tower in this process needs the artifacts")
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
    served = served_artifacts(client, protocol, models=("candidate_tower",))
    return tower_of(choose_artifacts(None, served, artifacts))
