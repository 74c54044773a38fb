"""Which candidate tower embedded a store, and the one check every reader and writer makes.

A store's vectors are only comparable with user vectors of the same two-tower model: a
retriever serving another tower's store would rank posts silently wrong. Every manifest
generation records the tower that embedded it (``Manifest.embedded_by``: its digest,
``phoenix.checkpoint.tower``); a retriever opening the store, and a writer adding vectors to
it, pass their own tower and are refused another's.

A store written before stores recorded their tower records none: it is accepted with a
warning (docs/retrieval.md, "Which tower embedded this store", says why and how to re-embed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from phoenix.corpus_store.manifest import MANIFEST_FILE, EmbeddedBy, Manifest, StoreError

REEMBED_HINT = (
    "re-embed the corpus with these artifacts into a new store: phoenix-build-corpus "
    "--in-process --artifacts {artifacts} --store NEW_DIR (posts from a file, --generate or "
    "--from-generator), then serve NEW_DIR with these artifacts"
)


class TowerMismatch(StoreError):
    """A store embedded by another candidate tower (the message names both digests)."""


def tower_of(artifact_dir) -> EmbeddedBy:
    """The candidate tower of an artifact directory, as a store records it (ArtifactError
    when the directory is missing or broken)."""
    from phoenix.checkpoint import load_config
    from phoenix.checkpoint.tower import candidate_tower_digest

    root = Path(artifact_dir).resolve()
    return EmbeddedBy(candidate_tower_digest(root), load_config(root).version, str(root))


def check_tower(root, manifest: Manifest, tower: Optional[EmbeddedBy]) -> Optional[str]:
    """None when generation ``manifest`` of the store at ``root`` was embedded by ``tower``
    (or there is no tower to check); TowerMismatch naming both towers and the files when it
    was embedded by another; a warning to report when the store records none."""
    if tower is None:
        return None
    where = Path(root) / MANIFEST_FILE
    recorded = manifest.embedded_by
    hint = REEMBED_HINT.format(artifacts=tower.artifacts or "ARTIFACTS")
    if recorded is None:
        return (
            f"{where}: generation {manifest.generation} records no candidate tower (written "
            f"before stores recorded one), so it cannot be checked against {tower.describe()}; "
            f"to have it checked, {hint}"
        )
    if recorded.digest != tower.digest:
        raise TowerMismatch(
            f"{where}: generation {manifest.generation} was embedded by {recorded.describe()}, "
            f"not by {tower.describe()}: the store's post vectors and this tower's are of "
            f"different models; {hint}"
        )
    return None
