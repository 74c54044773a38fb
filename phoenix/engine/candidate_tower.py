"""The candidate tower in this process: raw (post id, author id) pairs to unit vectors.

The one in-process candidate tower: the `candidate_tower` service, artifact generation and
training (corpus files), and the corpus store's builders and ingestion all embed posts with
it. Ids are hashed and looked up on the host (``HashEmbedder``), then
``RetrievalEngine.encode_candidates`` runs its one jitted program of ``candidate_chunk`` rows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Optional

import numpy as np

from phoenix.config import ArtifactConfig
from phoenix.engine.retrieval import RetrievalEngine
from phoenix.hashing import HashEmbedder

ROWS_PER_CALL = 1024  # rows of the compiled program when a caller names none
Progress = Callable[[int], object]  # called with the posts just embedded (tqdm.update)


class CandidateTower:
    """``tower(post_ids [n], author_ids [n])`` -> unit vectors float32 [n, D]."""

    def __init__(self, embedder: HashEmbedder, engine: RetrievalEngine):
        self.embedder = embedder
        self.engine = engine
        self.emb_size = embedder.config.emb_size

    @classmethod
    def from_weights(
        cls,
        config: ArtifactConfig,
        retrieval_params,
        stacked_table: np.ndarray,
        rows_per_call: int = ROWS_PER_CALL,
    ) -> CandidateTower:
        engine = RetrievalEngine(
            config.retrieval_config(), retrieval_params, candidate_chunk=rows_per_call
        )
        return cls(HashEmbedder(config, stacked_table), engine)

    @classmethod
    def from_artifacts(cls, artifact_dir: Path, rows_per_call: int = ROWS_PER_CALL):
        """The tower of an artifact directory (ArtifactError when it is missing or broken)."""
        from phoenix.checkpoint import load_artifacts

        loaded = load_artifacts(artifact_dir, ranker=False, retrieval=True, tables=True)
        return cls.from_weights(
            loaded.config, loaded.retrieval_params, loaded.stacked_table(), rows_per_call
        )

    def __call__(
        self, post_ids: np.ndarray, author_ids: np.ndarray, progress: Optional[Progress] = None
    ) -> np.ndarray:
        post_ids, author_ids = np.asarray(post_ids), np.asarray(author_ids)
        if post_ids.shape != author_ids.shape or post_ids.ndim != 1:
            raise ValueError(
                f"post_ids {post_ids.shape} and author_ids {author_ids.shape}: expected two "
                "1-D arrays of the same length"
            )
        total, step = len(post_ids), self.engine.candidate_chunk
        out = np.zeros((total, self.emb_size), np.float32)
        # one program call at a time: the looked-up hash embeddings of a whole corpus
        # (n x hashes x D floats) would not fit in memory
        for start in range(0, total, step):
            rows = slice(start, min(start + step, total))
            out[rows] = self.embed_chunk(post_ids[rows], author_ids[rows])
            if progress is not None:
                progress(rows.stop - rows.start)
        return out

    def embed_chunk(self, post_ids: np.ndarray, author_ids: np.ndarray) -> np.ndarray:
        _, post_rows = self.embedder.hash_items(post_ids)  # [n, nI]
        _, author_rows = self.embedder.hash_authors(author_ids)  # [n, nA]
        return self.engine.encode_candidates(
            self.embedder.lookup(post_rows), self.embedder.lookup(author_rows)
        )
