"""Which artifacts a server serves, said in its model configs, and the clients' use of it.

A launcher given an artifact directory (``TritonServer(artifacts_dir=...)``: serve, the demo,
the tests and benchmarks) serves a copy of the model repository whose configs carry the truth
in two parameters (``contracts.ARTIFACT_PARAMETERS``): ``artifact_dir``, the directory's
absolute path, and ``artifact_digest``, the sha256 of its ``config.json``. ``GET
/v2/models/<model>/config`` reports them; a model instance refuses to start when the digest is
not that of the artifacts it loads. A client without ``--artifacts`` uses the served ones; one
whose ``--artifacts`` have another digest is refused, naming both.

The digest is of the artifact config (shapes, vocabularies, actions, hash parameters): what a
client needs to agree on to build requests and read answers. Retrained weights of the same
config keep it.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.files import (
    CONFIG_FILE,
    RANKER_PARAMS_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    artifact_root,
    existing_file,
)
from phoenix.schema.contracts import ARTIFACT_DIGEST, ARTIFACT_DIR, RECOMMEND, RECOMMEND_CHAIN

# The models a client asks for the served artifacts, in order (all read the same directory):
# recommend's chain, its stages' models, the candidate tower.
ASKED_MODELS = tuple(
    dict.fromkeys(
        [step.model for step in RECOMMEND.steps]
        + [stage.model for stage in RECOMMEND_CHAIN.stages]
        + ["candidate_tower"]
    )
)
SERVED_HEADER = (
    "# The config of {source}, served with the artifacts {artifacts}\n"
    "# (written by phoenix.ops.served_artifacts when the server started).\n"
)


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


def artifact_digest(artifact_dir: str | Path) -> str:
    """sha256 (hex) of the artifact directory's config.json; ArtifactError when it has none."""
    path = existing_file(artifact_root(artifact_dir), CONFIG_FILE)
    return hashlib.sha256(path.read_bytes()).hexdigest()


# What a version's content is: its config and its trained weights and tables.
CONTENT_FILES = (CONFIG_FILE, RANKER_PARAMS_FILE, RETRIEVAL_PARAMS_FILE, TABLES_FILE)


def content_digest(artifact_dir: str | Path) -> str:
    """sha256 (hex) over CONTENT_FILES of ``artifact_dir`` (those it has): two trainings of one
    config differ here where their config.json does not."""
    root = artifact_root(artifact_dir)
    total = hashlib.sha256()
    for name in CONTENT_FILES:
        path = root / name
        if path.is_file():
            with path.open("rb") as file:
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


# ----------------------------------------------------------------------------------------
# The server side: a repository saying which artifacts it serves
# ----------------------------------------------------------------------------------------


def config_files(model_dir: Path) -> list[Path]:
    """A model's config files: config.pbtxt and the named ones Triton may pick instead."""
    return [model_dir / "config.pbtxt", *sorted((model_dir / "configs").glob("*.pbtxt"))]


def write_served_repository(source: Path, dest: Path, artifact_dir: Path) -> Path:
    """A copy of the repository ``source`` at ``dest`` (replaced) whose every config reading an
    artifact directory names ``artifact_dir`` (absolute) and its digest; returns ``dest``."""
    from google.protobuf import text_format

    from phoenix.ops.configs import read_config

    artifact_dir, digest = Path(artifact_dir).resolve(), artifact_digest(artifact_dir)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for model_dir in sorted(p for p in Path(source).iterdir() if p.is_dir()):
        copy = dest / model_dir.name
        shutil.copytree(model_dir, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for path in filter(Path.is_file, config_files(copy)):
            config = read_config(path)
            if ARTIFACT_DIR.name not in config.parameters:
                continue  # the ensemble, a model of a test's own
            config.parameters[ARTIFACT_DIR.name].string_value = ARTIFACT_DIR.text(artifact_dir)
            config.parameters[ARTIFACT_DIGEST.name].string_value = ARTIFACT_DIGEST.text(digest)
            header = SERVED_HEADER.format(source=path.relative_to(dest), artifacts=artifact_dir)
            path.write_text(header + text_format.MessageToString(config))
        precompile_model_files(copy)
    return dest


def compiled_model_file(source: str) -> bytes:
    """The bytecode of a model.py with ``source``, valid whatever the file's time (a hash-based
    .pyc, PEP 552): Triton may write the file at load time."""
    import importlib.util
    import py_compile
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.py"
        path.write_text(source)
        compiled = Path(importlib.util.cache_from_source(str(path)))
        mode = py_compile.PycInvalidationMode.CHECKED_HASH
        py_compile.compile(str(path), cfile=str(compiled), doraise=True, invalidation_mode=mode)
        return compiled.read_bytes()


def precompile_model_files(model_dir: Path) -> None:
    """Each version's model.py compiled beside it now, so that the Python stub, which imports
    it at load, finds its .pyc and never writes into the model's folder: Triton reloads a
    model whose folder changed after its load when an ensemble over it is loaded, and the
    ensemble stalls meanwhile (docs/rollout.md). The stub embeds this Python (cpython-311),
    and ignores $PYTHONDONTWRITEBYTECODE."""
    import importlib.util

    for model_file in model_dir.glob("[0-9]*/model.py"):
        compiled = Path(importlib.util.cache_from_source(str(model_file)))
        compiled.parent.mkdir(exist_ok=True)
        compiled.write_bytes(compiled_model_file(model_file.read_text()))


def check_loaded(parameters: dict[str, str], artifact_dir: Path) -> None:
    """A model instance's check: the digest its config states is that of the artifacts it
    loads (an ``artifact_dir`` overridden by $PHOENIX_ARTIFACT_DIR could differ)."""
    stated = parameters.get(ARTIFACT_DIGEST.name, "")
    if stated and (loaded := artifact_digest(artifact_dir)) != stated:
        raise ArtifactMismatch(
            f"the config states artifacts of config digest {short(stated)} "
            f"({parameters.get(ARTIFACT_DIR.name)}), but {artifact_dir} has {short(loaded)}"
        )


# ----------------------------------------------------------------------------------------
# The client side: the served artifacts, and the client's own checked against them
# ----------------------------------------------------------------------------------------


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
            parameters.get(ARTIFACT_DIR.name, ""), parameters.get(ARTIFACT_DIGEST.name, "")
        )
    raise error or ValueError("no model to ask")


def choose_artifacts(chosen: Optional[Path], served: ServedArtifacts, fallback: Path) -> Path:
    """The artifact directory a client uses: ``chosen`` when its digest is the served one (or
    the server does not say), else ArtifactMismatch naming both; without ``chosen``, the
    served directory (``fallback`` when the server does not say which)."""
    if chosen is not None:
        if served.digest and (mine := artifact_digest(chosen)) != served.digest:
            raise ArtifactMismatch(
                f"the artifacts {chosen} (config digest {short(mine)}) are not the ones the "
                f"server serves: {served.directory} (config digest {short(served.digest)})"
            )
        return Path(chosen)
    if not served.digest:
        return Path(fallback)
    directory = Path(served.directory)
    try:
        here = artifact_digest(directory)
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
