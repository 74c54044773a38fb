"""Which artifacts a server serves, as its model configs say (``phoenix.ops.served_repository``
writes them), and the client's own artifacts checked against them: a client without
``--artifacts`` uses the served ones; one whose ``--artifacts`` have another config digest is
refused, naming both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.identity import ArtifactMismatch, config_digest, short
from phoenix.schema.contracts import ARTIFACT_DIR, CONFIG_DIGEST
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN

# The models a client asks for the served artifacts, in order (all read the same directory):
# recommend's chain, its stages' models, the candidate tower.
ASKED_MODELS = tuple(
    dict.fromkeys(
        [step.model for step in RECOMMEND.steps]
        + [stage.model for stage in RECOMMEND_CHAIN.stages]
        + ["candidate_tower"]
    )
)


@dataclass(frozen=True)
class ServedArtifacts:
    """The artifacts a server says it serves; an empty digest: its configs do not say (a
    repository served as committed, ``artifact_dir`` relative to the model's directory)."""

    directory: str
    digest: str


def served_artifacts(client, protocol: str, models: Iterable[str] = ASKED_MODELS):
    """What the first of ``models`` loaded on the server states in its config; the error of
    the last model asked when none answers."""
    from phoenix.client.inprocess import server_parameters

    error: Optional[Exception] = None
    for model in models:
        try:
            parameters = server_parameters(client, protocol, model)
        except Exception as failed:  # tritonclient raises several types: not loaded, no server
            error = failed
            continue
        return ServedArtifacts(
            parameters.get(ARTIFACT_DIR.name, ""), parameters.get(CONFIG_DIGEST.name, "")
        )
    raise error or ValueError("no model to ask")


def choose_artifacts(
    chosen: Optional[Path], served: ServedArtifacts, fallback: Optional[Path]
) -> Path:
    """The artifact directory a client uses: ``chosen`` when its digest is the served one (or
    the server does not say), else ArtifactMismatch naming both; without ``chosen``, the
    served directory (``fallback`` when the server does not say which; ArtifactMismatch when
    there is no fallback either)."""
    if chosen is not None:
        if served.digest and (mine := config_digest(chosen)) != served.digest:
            raise ArtifactMismatch(
                f"the artifacts {chosen} (config digest {short(mine)}) are not the ones the "
                f"server serves: {served.directory} (config digest {short(served.digest)})"
            )
        return Path(chosen)
    if not served.digest:
        if fallback is None:
            raise ArtifactMismatch("the server does not say which artifacts it serves: name them")
        return Path(fallback)
    directory = Path(served.directory)
    try:
        here = config_digest(directory)
    except ArtifactError:
        raise ArtifactMismatch(
            f"the server serves the artifacts {directory} (config digest "
            f"{short(served.digest)}), which this machine does not have; pass a copy of them"
        ) from None
    if here != served.digest:
        raise ArtifactMismatch(
            f"the artifacts {directory} changed since the server loaded them: config digest "
            f"{short(here)} here, {short(served.digest)} served"
        )
    return directory
