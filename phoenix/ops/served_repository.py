"""The repository a launcher serves: a copy of the model repository whose configs name the
artifacts it serves, with every model file's bytecode beside it.

A launcher given an artifact directory (``TritonServer(artifacts_dir=...)``: serve, the demo,
the tests and benchmarks) serves such a copy: its configs carry ``artifact_dir`` (the
directory's absolute path), ``artifact_version`` (its version label) and ``config_digest``
(the sha256 of its config.json; ``checkpoint.identity`` says what each is);
``GET /v2/models/<model>/config`` reports them, clients compare the digest with their own
artifacts' (``phoenix.client.served_artifacts``) and a model instance refuses to start when
either is not that of the artifacts it loads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from phoenix.checkpoint.identity import artifact_version, config_digest
from phoenix.schema.contracts import ARTIFACT_DIR, ARTIFACT_VERSION, CONFIG_DIGEST

SERVED_HEADER = (
    "# The config of {source}, served with the artifacts {artifacts}\n"
    "# (written by phoenix.ops.served_repository when the server started).\n"
)


def config_files(model_dir: Path) -> list[Path]:
    """A model's config files: config.pbtxt and the named ones Triton may pick instead."""
    return [model_dir / "config.pbtxt", *sorted((model_dir / "configs").glob("*.pbtxt"))]


def stated_artifacts(artifact_dir: Path) -> dict[str, str]:
    """{parameter: text} a served config states its artifacts with: ``artifact_dir``
    (absolute), ``artifact_version``, ``config_digest``."""
    return {
        ARTIFACT_DIR.name: ARTIFACT_DIR.text(Path(artifact_dir).resolve()),
        ARTIFACT_VERSION.name: ARTIFACT_VERSION.text(artifact_version(artifact_dir)),
        CONFIG_DIGEST.name: CONFIG_DIGEST.text(config_digest(artifact_dir)),
    }


def write_served_repository(source: Path, dest: Path, artifact_dir: Path) -> Path:
    """A copy of the repository ``source`` at ``dest`` (replaced) whose every config reading an
    artifact directory names ``artifact_dir`` (absolute), its version label and its config
    digest; returns ``dest``."""
    from google.protobuf import text_format

    from phoenix.ops.configs import read_config

    artifact_dir = Path(artifact_dir).resolve()
    stated = stated_artifacts(artifact_dir)
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
            for name, value in stated.items():
                config.parameters[name].string_value = value
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
