"""The retrieval corpus (``corpus.npz``): unit candidate vectors of unique posts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from phoenix.checkpoint.files import (
    CORPUS_FILE,
    PathLike,
    artifact_root,
    check_float_array,
    check_key_sets,
    existing_file,
    read_npz,
    resolve_inside,
    write_npz,
)
from phoenix.config import ArtifactConfig, ArtifactError

CORPUS_KEYS = ("post_ids", "candidate_representations", "author_ids")
OPTIONAL_CORPUS_KEYS = ("topics", "created_at")
UNIT_NORM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Corpus:
    """Retrieval corpus: unit candidate vectors of unique posts."""

    post_ids: np.ndarray  # int64 [N], unique, > 0
    embeddings: np.ndarray  # float32 [N, D], unit L2 norm
    author_ids: np.ndarray  # int64 [N]
    topics: Optional[np.ndarray] = None  # int64 [N]
    created_at: Optional[np.ndarray] = None  # int64 [N], unix seconds (the feed's age filter)

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "post_ids": self.post_ids,
            "candidate_representations": self.embeddings,
            "author_ids": self.author_ids,
        }
        if self.topics is not None:
            arrays["topics"] = self.topics
        if self.created_at is not None:
            arrays["created_at"] = self.created_at
        return arrays


def _check_int_vector(array: np.ndarray, key: str, name: str, size: int) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.integer):
        raise ArtifactError(f"{name}: '{key}' has dtype {array.dtype}, expected int64")
    if tuple(array.shape) != (size,):
        raise ArtifactError(f"{name}: '{key}' has shape {tuple(array.shape)}, expected ({size},)")
    return array.astype(np.int64, copy=False)


def _check_post_ids(post_ids: np.ndarray, name: str) -> np.ndarray:
    if post_ids.ndim != 1 or post_ids.shape[0] < 1:
        raise ArtifactError(
            f"{name}: 'post_ids' has shape {tuple(post_ids.shape)}, expected (N,) with N >= 1"
        )
    post_ids = _check_int_vector(post_ids, "post_ids", name, post_ids.shape[0])
    if np.any(post_ids <= 0):
        raise ArtifactError(f"{name}: 'post_ids' must be > 0, found {int(post_ids.min())}")
    unique, counts = np.unique(post_ids, return_counts=True)
    if unique.shape[0] != post_ids.shape[0]:
        duplicates = unique[counts > 1][:5].tolist()
        raise ArtifactError(f"{name}: 'post_ids' must be unique, found duplicates {duplicates}")
    return post_ids


def _check_unit_norms(embeddings: np.ndarray, name: str) -> None:
    norms = np.linalg.norm(embeddings.astype(np.float64), axis=-1)
    worst = int(np.argmax(np.abs(norms - 1.0)))
    if abs(norms[worst] - 1.0) > UNIT_NORM_TOLERANCE:
        raise ArtifactError(
            f"{name}: 'candidate_representations' row {worst} has L2 norm {norms[worst]:.6f}, "
            f"expected 1 (tolerance {UNIT_NORM_TOLERANCE})"
        )


def check_corpus(
    arrays: Mapping[str, np.ndarray], emb_size: Optional[int], name: str = CORPUS_FILE
) -> Corpus:
    """Validate corpus arrays; ``emb_size`` None skips the width check."""
    check_key_sets(
        arrays, dict.fromkeys(CORPUS_KEYS + OPTIONAL_CORPUS_KEYS), name, OPTIONAL_CORPUS_KEYS
    )
    post_ids = _check_post_ids(np.asarray(arrays["post_ids"]), name)
    size = post_ids.shape[0]
    embeddings = np.asarray(arrays["candidate_representations"])
    width = emb_size if emb_size is not None else (embeddings.shape[-1] if embeddings.ndim else 0)
    embeddings = check_float_array(embeddings, "candidate_representations", name, (size, width))
    _check_unit_norms(embeddings, name)
    author_ids = _check_int_vector(np.asarray(arrays["author_ids"]), "author_ids", name, size)
    topics = arrays.get("topics")
    if topics is not None:
        topics = _check_int_vector(np.asarray(topics), "topics", name, size)
    created_at = arrays.get("created_at")
    if created_at is not None:
        created_at = _check_int_vector(np.asarray(created_at), "created_at", name, size)
    return Corpus(post_ids, embeddings, author_ids, topics, created_at)


def _corpus_location(path_or_dir: PathLike) -> tuple[Path, str]:
    """(containing directory, file name) of a corpus given as a file or a directory."""
    path = Path(path_or_dir)
    if path.is_dir():
        return path, CORPUS_FILE
    return path.parent, path.name


def load_corpus(path_or_dir: PathLike, config: Optional[ArtifactConfig] = None) -> Corpus:
    """Load ``corpus.npz`` (a file, or the one inside a directory) and validate it."""
    directory, filename = _corpus_location(path_or_dir)
    path = existing_file(artifact_root(directory), filename)
    emb_size = config.emb_size if config is not None else None
    return check_corpus(read_npz(path, filename), emb_size, filename)


def load_post_dates(path_or_dir: PathLike) -> tuple[np.ndarray, Optional[np.ndarray]]:
    """(post ids, creation times or None) of a corpus file, checked, reading only those two
    arrays: the vectors, most of the file, stay on disk (what the feed policy needs)."""
    directory, filename = _corpus_location(path_or_dir)
    path = existing_file(artifact_root(directory), filename)
    arrays = read_npz(path, filename, keys=("post_ids", "created_at"))
    if "post_ids" not in arrays:
        raise ArtifactError(f"{filename}: missing array 'post_ids'")
    post_ids = _check_post_ids(arrays["post_ids"], filename)
    created_at = arrays.get("created_at")
    if created_at is not None:
        created_at = _check_int_vector(created_at, "created_at", filename, len(post_ids))
    return post_ids, created_at


def save_corpus(path: PathLike, corpus: Corpus) -> None:
    """Validate and write a corpus (to ``path``, or to ``path/corpus.npz`` for a directory)."""
    directory, filename = _corpus_location(path)
    directory.mkdir(parents=True, exist_ok=True)
    checked = check_corpus(corpus.to_arrays(), None, filename)
    write_npz(resolve_inside(directory, filename), checked.to_arrays())
