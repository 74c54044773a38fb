"""Which artifacts these are (imports the checkpoint's files only).

A version of the artifacts has one identity people read, its **version label**
(``artifact_version``): config.json's ``version`` when it has one, else ``sha256-`` and 12 hex
digits of its content digest (config, weights and tables), so that two versions served side
by side (a rollout) never share a label. The served configs (``artifact_version``), the
metrics' ``version`` label, the rollout's report and messages all show it.

The **config digest** (``config_digest``: sha256 of ``config.json`` alone: shapes,
vocabularies, actions, hash parameters) is no version: it is what a client and a server must
agree on to build requests and read answers, which retrained weights of one config keep. The
served configs carry it as ``config_digest`` for the clients' check; messages call it "config
digest".
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from phoenix.checkpoint.files import (
    CONFIG_FILE,
    RANKER_PARAMS_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    ArtifactError,
    artifact_root,
    existing_file,
)
from phoenix.checkpoint.production import EMB_TABLE_FILE


class ArtifactMismatch(ValueError):
    """The client's artifacts are not the served ones (the message names both)."""


def servable_artifact_dir(artifacts: Path) -> Path:
    """``artifacts`` made absolute, or ArtifactError saying how to create it."""
    if not (Path(artifacts) / CONFIG_FILE).is_file():
        raise ArtifactError(
            f"{artifacts} is no Phoenix artifact directory (no {CONFIG_FILE}). Create demo "
            f"artifacts with `python -m phoenix.artifacts --preset mini --out {artifacts}`."
        )
    return Path(artifacts).resolve()


def config_digest(artifact_dir: str | Path) -> str:
    """sha256 (hex) of the artifact directory's config.json; ArtifactError when it has none."""
    path = existing_file(artifact_root(artifact_dir), CONFIG_FILE)
    return hashlib.sha256(path.read_bytes()).hexdigest()


# What a version's content is: its config and its trained weights and tables (a production
# ranker's hashed table among them).
CONTENT_FILES = (
    CONFIG_FILE,
    RANKER_PARAMS_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    EMB_TABLE_FILE,
)


def content_digest(artifact_dir: str | Path) -> str:
    """sha256 (hex) over CONTENT_FILES of ``artifact_dir`` (those it has): two trainings of one
    config differ here where their config.json does not. Computed once per version of the
    files (their sizes and modification times): a model instance and its services ask for it
    more than once at start-up, and the tables are the size of the vocabularies."""
    root = artifact_root(artifact_dir).resolve()
    stats = []
    for name in CONTENT_FILES:
        path = root / name
        if path.is_file():
            stat = path.stat()
            stats.append((name, stat.st_size, stat.st_mtime_ns))
    return _content_digest(root, tuple(stats))


@functools.lru_cache(maxsize=32)
def _content_digest(root: Path, stats: tuple[tuple[str, int, int], ...]) -> str:
    total = hashlib.sha256()
    for name, _, _ in stats:
        with (root / name).open("rb") as file:
            total.update(name.encode() + hashlib.file_digest(file, "sha256").digest())
    return total.hexdigest()


def artifact_version(artifact_dir: str | Path) -> str:
    """The artifacts' version label: config.json's ``version``, else one made of their content
    (``sha256-`` and 12 hex digits of ``content_digest``), so that two unversioned versions
    served side by side (a rollout) never share a label in the metrics."""
    from phoenix.checkpoint import load_config

    version = load_config(artifact_root(artifact_dir)).version
    if version is not None:
        return str(version)
    return f"sha256-{content_digest(artifact_dir)[:12]}"


def short(digest: str) -> str:
    return digest[:12] or "(none)"
