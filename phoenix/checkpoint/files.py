"""Artifact files: paths kept inside the artifact directory, atomic deterministic writers, a
checked npz/JSON reader, and the array checks that parameters, tables and corpus share."""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np

from phoenix.config import ArtifactConfig, ArtifactError

PathLike = Union[str, os.PathLike]

CONFIG_FILE = "config.json"
RANKER_PARAMS_FILE = "ranker/model_params.npz"
RETRIEVAL_PARAMS_FILE = "retrieval/model_params.npz"
TABLES_FILE = "embedding_tables.npz"
CORPUS_FILE = "corpus.npz"
EXAMPLE_FILE = "example_sequence.json"
TRAINING_FILE = "training.json"  # trained artifacts: the world and the run that made them
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamp: identical arrays give identical files


# ----------------------------------------------------------------------------------------
# Paths
# ----------------------------------------------------------------------------------------


def artifact_root(directory: PathLike) -> Path:
    root = Path(directory)
    if not root.is_dir():
        raise ArtifactError(f"{root}: artifact directory not found")
    return root.resolve()


def resolve_inside(root: Path, relative: str) -> Path:
    """``root / relative`` resolved; it must stay inside ``root`` (symlinks included)."""
    root = root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ArtifactError(
            f"{relative}: resolves to {path}, which is outside the artifact directory {root}"
        )
    return path


def existing_file(root: Path, relative: str) -> Path:
    path = resolve_inside(root, relative)
    if not path.is_file():
        raise ArtifactError(f"{relative}: file not found in {root}")
    return path


# ----------------------------------------------------------------------------------------
# Deterministic, atomic writers and a checked npz reader
# ----------------------------------------------------------------------------------------


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary sibling and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_npz_file(tmp: Path, arrays: Mapping[str, np.ndarray]) -> None:
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(arrays[key]), allow_pickle=False)


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Uncompressed ``.npz`` readable by ``np.load``; same arrays -> same bytes."""
    _atomic_write(path, lambda tmp: _write_npz_file(tmp, arrays))


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    _atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_npz(path: Path, name: str, keys: Optional[Sequence[str]] = None) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickles), or only those of ``keys`` that it holds (the
    others are never read from disk); errors name ``name`` and the key."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ArtifactError(f"{name}: not a readable .npz file ({err})") from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ArtifactError(f"{name}: not an .npz archive (found a single .npy array)")
    arrays = {}
    with archive:
        for key in archive.files if keys is None else [k for k in keys if k in archive.files]:
            try:
                arrays[key] = archive[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
                raise ArtifactError(f"{name}: '{key}' cannot be read ({err})") from err
    return arrays


def read_json(path: Path, name: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{name}: not readable JSON ({err})") from err


# ----------------------------------------------------------------------------------------
# Checks shared by parameters, tables and corpus
# ----------------------------------------------------------------------------------------


def describe_keys(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{k}'" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def check_key_sets(
    found: Mapping[str, Any], expected: Mapping[str, Optional[tuple]], name: str, optional=()
) -> None:
    """Every expected key present (bar ``optional``) and nothing else; shapes may be None."""
    missing = sorted(set(expected) - set(found) - set(optional))
    if missing:
        shape = expected[missing[0]]
        detail = "" if shape is None else f" ('{missing[0]}' expected with shape {tuple(shape)})"
        raise ArtifactError(f"{name}: missing key {describe_keys(missing)}{detail}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ArtifactError(f"{name}: unexpected key {describe_keys(extra)}")


def check_float_array(array: np.ndarray, key: str, name: str, shape: tuple) -> np.ndarray:
    """Exact shape, floating dtype, finite values; returns the array as float32."""
    if tuple(array.shape) != tuple(shape):
        raise ArtifactError(
            f"{name}: '{key}' has shape {tuple(array.shape)}, expected {tuple(shape)}"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ArtifactError(f"{name}: '{key}' has dtype {array.dtype}, expected a float dtype")
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise ArtifactError(f"{name}: '{key}' has {bad} non-finite values (NaN or inf)")
    return array.astype(np.float32, copy=False)  # the models create float32 parameters


def load_config(directory: PathLike) -> ArtifactConfig:
    """Parse and validate ``<directory>/config.json``."""
    root = artifact_root(directory)
    return ArtifactConfig.from_dict(read_json(existing_file(root, CONFIG_FILE), CONFIG_FILE))


def save_config(directory: PathLike, config: ArtifactConfig) -> None:
    root = Path(directory).resolve()
    write_json(resolve_inside(root, CONFIG_FILE), config.to_dict())
