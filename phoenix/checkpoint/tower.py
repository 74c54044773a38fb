"""The candidate tower's digest: one sha256 of everything that decides a post's vector.

A corpus store holds vectors one candidate tower made; a retriever whose user tower comes from
other weights would score them against users of another space and answer silently wrong
rankings. The digest names the tower, so that a store can record which one embedded it and a
retriever can refuse another's (``phoenix.corpus_store``, docs/retrieval.md).

What goes in: the candidate tower's parameters (``retrieval/model_params.npz`` under
``CANDIDATE_TOWER_SCOPE``), the item and author hash tables (the tower's inputs), and the
config values that shape or hash its input (``TOWER_CONFIG_KEYS``, the item and author hash
functions). What stays out: the ranker, the user tower, the user table, the version label:
retraining the ranker, or only the user tower, keeps the digest and the store.

Arrays are hashed as named float32 little-endian bytes with their shapes, not as files, so the
same weights written another way (another npz layout, float64) give the same digest.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from phoenix.checkpoint.files import (
    CONFIG_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    PathLike,
    artifact_root,
    existing_file,
    read_npz,
)
from phoenix.checkpoint.params import load_config
from phoenix.config import ArtifactError

CANDIDATE_TOWER_SCOPE = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"
TOWER_TABLES = ("item_embeddings", "author_embeddings")
TOWER_CONFIG_KEYS = (
    "emb_size",
    "num_item_hashes",
    "num_author_hashes",
    "item_vocab_size",
    "author_vocab_size",
    "enable_linear_proj",
)
TOWER_HASHED = ("item", "author")  # the entities whose hash functions feed the tower
DIGEST_FORMAT = "phoenix-candidate-tower/1"  # a new encoding gets a new name


def candidate_tower_digest(directory: PathLike) -> str:
    """sha256 (hex) of the candidate tower of the artifact directory; ArtifactError naming
    the file when a part is missing or unreadable. Cached per directory while its files are
    unchanged (reading the tables is most of the cost)."""
    root = artifact_root(directory)
    names = (CONFIG_FILE, RETRIEVAL_PARAMS_FILE, TABLES_FILE)
    return _digest(root, tuple(_file_stamp(existing_file(root, name)) for name in names))


def _file_stamp(path: Path) -> tuple:
    stat = path.stat()
    return str(path), stat.st_mtime_ns, stat.st_size, stat.st_ino


@functools.lru_cache(maxsize=8)
def _digest(root: Path, _stamps: tuple) -> str:
    config = load_config(root)
    described = {key: getattr(config, key) for key in TOWER_CONFIG_KEYS}
    described["hash_params"] = {e: config.hash_params.for_entity(e).to_dict() for e in TOWER_HASHED}
    params = read_npz(existing_file(root, RETRIEVAL_PARAMS_FILE), RETRIEVAL_PARAMS_FILE)
    arrays = {key: v for key, v in params.items() if key.startswith(CANDIDATE_TOWER_SCOPE + "/")}
    tables = read_npz(existing_file(root, TABLES_FILE), TABLES_FILE, keys=TOWER_TABLES)
    missing = [key for key in TOWER_TABLES if key not in tables]
    if missing:
        raise ArtifactError(f"{TABLES_FILE}: missing key {missing} in {root}")
    arrays.update(tables)
    digest = hashlib.sha256(DIGEST_FORMAT.encode())
    digest.update(json.dumps(described, sort_keys=True).encode())
    for key in sorted(arrays):
        array = np.ascontiguousarray(arrays[key], dtype="<f4")
        digest.update(json.dumps([key, list(array.shape)]).encode())
        digest.update(array.data.cast("B"))
    return digest.hexdigest()
