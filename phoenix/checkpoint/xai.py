"""Load X's production Phoenix checkpoints: what xrex's trainer saves with Orbax and
``xai_checkpointing``.

    python -m phoenix.checkpoint.xai CHECKPOINT [--extra emb_table] [--no-verify]

Layout (xrex ``checkpoint_write.save_checkpoint`` and ``utils.metadata``)::

    <run name>/                                 a run directory
      latest -> elapsed_samples_<N>/<run id>    the newest step (a relative symlink)
      elapsed_samples_<N, 18 digits>/           one per saved step
        <run id>/                               a step directory: one checkpoint
          orbax-ckpt/        the training state, an Orbax PyTree checkpoint: one OCDBT
                             database of zarr3 arrays, _METADATA (the tree),
                             _sharding, _CHECKPOINT_METADATA
          checksums.0.json   per tensor: shape, dtype, sharding, Adler-32 (xai_integrity)
          config.json        the run's training config (xai_configlib JSON; 'name')
          run.json           the run (name, id, parent)
          metadata.json      elapsed samples and tokens, checkpoint index
          completed          the commit marker, written after everything else

The state is xrex's ``RecsysTrainingState`` with each ``Parameter`` unwrapped to its array:
``params`` (Haiku's ``{module: {name: array}}``), ``opt_state``, ``rng``, ``step``,
``emb_table`` (the hashed-id embedding table, bfloat16), ``emb_table_state``,
``offset_keys``/``offset_values``, ``post_embeddings``, ``rce_ema``/``calib_ema``. An array's
checkpoint name is its tree path joined with '.': ``params.<module>.<name>``.

``load_xai_checkpoint`` reads ``params`` (and the scalar ``step``, and any other entry asked
for with ``extra``) and never the optimizer state, checks every array it reads against
``checksums.0.json``, and returns the parameters named as our Haiku models name them:
``<module>/<name>/0``, the trailing ``/0`` being the leaf of xrex's ``Parameter`` wrapper
(the naming of ``tests/data/xai_checkpoint/expected.npz``). Arrays keep their saved dtype
(float32 parameters under xrex's default ``precision_level=2``; bfloat16 ones at level 0).

Given a run directory it loads the step ``latest`` points to when that step is complete,
else the complete step with the most elapsed samples (what xrex's trainer resumes from);
given an ``elapsed_samples_<N>`` directory, its complete run id last in order (xrex's manual
``load=``); given a step directory, that step (what xrex's serving takes); given the trainer's
checkpoint root holding one run directory, that run's. A step is complete when it has its
``completed`` marker and its committed ``orbax-ckpt/`` (as xrex's own discovery requires).
Every problem raises ``XaiCheckpointError`` naming the file.

Imports numpy, ``phoenix.config`` and, when loading, orbax-checkpoint and tensorstore (never
the engine or the model packages).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np

from phoenix.checkpoint.files import PathLike
from phoenix.checkpoint.xai_integrity import (
    CHECKSUMS_FILE,
    ArrayBytes,
    XaiCheckpointError,
    array_locations,
    check_files,
    parse_checksums,
    verify_array,
)
from phoenix.config import ArtifactError
from phoenix.util.command_line import command_parser

ORBAX_DIR = "orbax-ckpt"
CONFIG_FILE = "config.json"
COMPLETED_FILE = "completed"
METADATA_FILE = "metadata.json"
LATEST_LINK = "latest"
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp-"  # Orbax's name for a save not yet committed
PARAMS = "params"
_STEP_DIR = re.compile(r"elapsed_(?:samples|tokens)_(\d+)")

__all__ = [
    "XaiCheckpoint",
    "XaiCheckpointError",
    "find_step_directory",
    "haiku_name",
    "load_xai_checkpoint",
    "main",
]


@dataclass(frozen=True)
class XaiCheckpoint:
    """One loaded step of an xrex run."""

    path: Path  # the step directory
    params: dict[str, np.ndarray]  # '<module>/<name>/0' -> array
    config: dict[str, Any]  # config.json
    step: Optional[int]  # the state's training step
    elapsed_samples: Optional[int]  # from metadata.json
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # checkpoint name -> array
    not_loaded: dict[str, int] = field(default_factory=dict)  # top-level entry -> arrays
    verified: bool = True  # every array read matched checksums.0.json

    @property
    def config_name(self) -> Optional[str]:
        name = self.config.get("name")
        return name if isinstance(name, str) else None


# ----------------------------------------------------------------------------------------
# Finding the step directory
# ----------------------------------------------------------------------------------------


def _is_complete_step(path: Path) -> bool:
    """Marked completed, and its Orbax tree committed (no uncommitted temporary beside it)."""
    if not (path / COMPLETED_FILE).is_file() or not (path / ORBAX_DIR).is_dir():
        return False
    return not any(path.glob(f"{ORBAX_DIR}{ORBAX_TMP_SUFFIX}*"))


def _is_step_directory(path: Path) -> bool:
    names = (ORBAX_DIR, CHECKSUMS_FILE, CONFIG_FILE, COMPLETED_FILE)
    return any((path / name).exists() for name in names) or any(
        path.glob(f"{ORBAX_DIR}{ORBAX_TMP_SUFFIX}*")
    )


def _newest_complete(candidates: Iterable[tuple[int, str, Path]]) -> Optional[Path]:
    complete = [c for c in candidates if _is_complete_step(c[2])]
    return max(complete)[2] if complete else None


def _run_steps(run_dir: Path) -> list[tuple[int, str, Path]]:
    """Every ``elapsed_samples_<N>/<run id>/`` of a run directory, complete or not."""
    return [
        (int(m[1]), step.name, step)
        for elapsed in run_dir.iterdir()
        if elapsed.is_dir() and (m := _STEP_DIR.fullmatch(elapsed.name))
        for step in elapsed.iterdir()
        if step.is_dir()
    ]


def _newest_of_run(run_dir: Path) -> Optional[Path]:
    """The step ``latest`` points to when complete, else the newest complete step."""
    latest = run_dir / LATEST_LINK
    if latest.exists():
        target = latest.resolve()
        if target.is_relative_to(run_dir) and _is_complete_step(target):
            return target
    return _newest_complete(_run_steps(run_dir))


def find_step_directory(path: PathLike) -> Path:
    """The step directory ``path`` names: itself; the newest complete run id of an
    ``elapsed_samples_<N>`` directory; the newest complete step of a run directory; or that of
    the one run of a checkpoint root (the trainer's ``checkpoint_dir``, ``<run name>/`` in it)."""
    root = Path(path)
    if not root.is_dir():
        raise XaiCheckpointError(root, "not a directory (expected a checkpoint directory)")
    root = root.resolve()
    if _is_step_directory(root):
        return root
    match = _STEP_DIR.fullmatch(root.name)
    if match:
        samples = int(match[1])
        found = _newest_complete((samples, d.name, d) for d in root.iterdir() if d.is_dir())
        if found is None:
            raise XaiCheckpointError(
                root, f"no complete checkpoint in it (no <run id>/ with '{COMPLETED_FILE}')"
            )
        return found
    steps = _run_steps(root)
    if not steps:  # a checkpoint root: its runs are the folders holding steps
        runs = sorted(d for d in root.iterdir() if d.is_dir() and _run_steps(d))
        if len(runs) > 1:
            names = ", ".join(run.name for run in runs)
            raise XaiCheckpointError(root, f"holds several runs ({names}): name one of them")
        if runs:
            root, steps = runs[0], _run_steps(runs[0])
    found = _newest_of_run(root)
    if found is None:
        what = "complete step" if steps else "checkpoint"
        raise XaiCheckpointError(
            root,
            f"no {what} found: expected a step directory (with {ORBAX_DIR}/ and "
            f"{CHECKSUMS_FILE}) or a run directory (elapsed_samples_<N>/<run id>/ steps with "
            f"a '{COMPLETED_FILE}' marker)",
        )
    return found


# ----------------------------------------------------------------------------------------
# Names
# ----------------------------------------------------------------------------------------


def haiku_name(checkpoint_name: str) -> str:
    """``params.<module>.<name>`` (or the older ``...<name>.0``) -> ``<module>/<name>/0``."""
    parts = checkpoint_name.split(".")
    if parts[-1] == "0":
        parts = parts[:-1]
    if len(parts) != 3 or parts[0] != PARAMS:
        raise ValueError(f"'{checkpoint_name}' is not a Haiku parameter 'params.<module>.<name>'")
    return f"{parts[1]}/{parts[2]}/0"


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A metadata tree's non-empty leaves by checkpoint name (keys joined with '.')."""
    if isinstance(tree, Mapping):
        items: Iterable[tuple[Any, Any]] = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    elif tree is None:
        return {}
    else:
        return {prefix: tree}
    flat: dict[str, Any] = {}
    for key, value in items:
        flat.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


# ----------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------


def _read_tree(orbax_dir: Path) -> dict[str, Any]:
    """The saved tree's structure (Orbax's ``_METADATA``), leaves its ``ArrayMetadata``."""
    import orbax.checkpoint as ocp

    metadata_file = orbax_dir / "_METADATA"
    if not metadata_file.is_file():
        raise XaiCheckpointError(metadata_file, "missing: Orbax's record of the saved tree")
    try:  # the handler raises what went wrong (a Checkpointer would log it and return None)
        tree = ocp.PyTreeCheckpointHandler().metadata(orbax_dir)
    except Exception as err:  # Orbax raises many kinds for a damaged _METADATA or _sharding
        raise XaiCheckpointError(
            _named_file(str(err), metadata_file),
            f"Orbax cannot read the saved tree ({type(err).__name__}: {err})",
        ) from err
    if not isinstance(getattr(tree, "tree", None), dict):
        raise XaiCheckpointError(metadata_file, "Orbax found no saved PyTree in it")
    return tree.tree


def _named_file(message: str, default: Path) -> Path:
    """The file a tensorstore message names (``local file "<path>"``), else ``default``."""
    match = re.search(r'local file "([^"]+)"', message)
    return Path(match[1]) if match and Path(match[1]).is_file() else default


def _restore(orbax_dir: Path, subtree: dict[str, Any], files: Mapping[str, str]) -> dict:
    """``subtree`` (part of the saved tree) read by Orbax as numpy arrays."""
    import jax
    import orbax.checkpoint as ocp

    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), subtree)
    args = ocp.args.PyTreeRestore(item=subtree, restore_args=restore_args, partial_restore=True)
    try:
        return ocp.PyTreeCheckpointer().restore(orbax_dir, args=args)
    except Exception as err:  # tensorstore's DATA_LOSS, OUT_OF_RANGE, crc32c errors ...
        text = str(err)
        name = next((n for n in files if f'"{n}/' in text), None)
        where = orbax_dir / files[name] if name else orbax_dir
        what = f"array '{name}'" if name else "the state"
        raise XaiCheckpointError(where, f"Orbax cannot read {what}: {text}") from err


def _read_json(path: Path, what: str) -> Any:
    """A step's JSON file, or ``XaiCheckpointError`` naming it."""
    if not path.is_file():
        raise XaiCheckpointError(path, f"missing: {what}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise XaiCheckpointError(path, f"not readable JSON ({err})") from err


def _read_config(step_dir: Path) -> dict[str, Any]:
    path = step_dir / CONFIG_FILE
    config = _read_json(path, "the run's training config")
    if not isinstance(config, dict):
        raise XaiCheckpointError(path, f"expected a JSON object, found {type(config).__name__}")
    return config


def _elapsed_samples(step_dir: Path) -> Optional[int]:
    """metadata.json's count (the file is optional: xrex falls back on 'completed')."""
    path = step_dir / METADATA_FILE
    if not path.is_file():
        return None
    document = _read_json(path, "the step's counters")
    value = document.get("elapsed_samples") if isinstance(document, dict) else None
    return value if isinstance(value, int) else None


def _check_step(step_dir: Path) -> Path:
    """The step's files a load needs are there; its Orbax directory."""
    orbax_dir = step_dir / ORBAX_DIR
    pending = sorted(step_dir.glob(f"{ORBAX_DIR}{ORBAX_TMP_SUFFIX}*"))
    if pending:
        raise XaiCheckpointError(pending[0], "an Orbax save that was never committed")
    if not orbax_dir.is_dir():
        raise XaiCheckpointError(orbax_dir, "missing: the saved state (an Orbax checkpoint)")
    if not (step_dir / COMPLETED_FILE).is_file():
        raise XaiCheckpointError(
            step_dir / COMPLETED_FILE,
            "missing: the trainer never marked this step complete (an interrupted save?)",
        )
    if not (orbax_dir / "manifest.ocdbt").is_file():
        raise XaiCheckpointError(orbax_dir / "manifest.ocdbt", "missing: the OCDBT manifest")
    return orbax_dir


def load_xai_checkpoint(
    path: PathLike, *, extra: Sequence[str] = (), verify: bool = True
) -> XaiCheckpoint:
    """Read an xrex checkpoint's parameters (Haiku names), config and step.

    ``path``: a run, ``elapsed_samples_<N>`` or step directory (``find_step_directory``).
    ``extra``: other top-level entries to read too (``emb_table``, ``post_embeddings``),
    returned by checkpoint name in ``extra``. ``verify=False`` leaves ``checksums.0.json``
    unread (the arrays unchecked); the layout checks remain."""
    step_dir = find_step_directory(path)
    orbax_dir = _check_step(step_dir)
    config = _read_config(step_dir)
    checksums_path = step_dir / CHECKSUMS_FILE
    checksums = None
    if verify:
        recorded = _read_json(checksums_path, "the tensors' checksums")
        checksums = parse_checksums(checksums_path, recorded)

    locations = array_locations(orbax_dir)  # first: it names a damaged database file
    tree = _read_tree(orbax_dir)
    metadata_file = orbax_dir / "_METADATA"
    wanted = [PARAMS, *extra] + (["step"] if tree.get("step") is not None else [])
    for entry in wanted:
        if tree.get(entry) is None:
            raise XaiCheckpointError(
                metadata_file,
                f"the saved tree has no '{entry}' (its entries: {', '.join(sorted(tree))})",
            )
    subtree = {entry: tree[entry] for entry in dict.fromkeys(wanted)}
    names = list(_flatten(subtree))
    param_names = [n for n in names if n.startswith(f"{PARAMS}.")]
    if not param_names:
        raise XaiCheckpointError(metadata_file, "unexpected structure: 'params' holds no arrays")
    for name in param_names:
        try:
            haiku_name(name)
        except ValueError as err:
            raise XaiCheckpointError(metadata_file, f"unexpected structure: {err}") from err

    check_files(orbax_dir, locations, names)
    files = {name: _where(locations[name]) for name in names}
    arrays = _flatten(_restore(orbax_dir, subtree, files))
    if sorted(arrays) != sorted(names):
        raise XaiCheckpointError(orbax_dir, "Orbax returned other arrays than _METADATA lists")
    if checksums is not None:
        for name in names:
            verify_array(checksums, name, np.asarray(arrays[name]), str(orbax_dir / files[name]))

    step = arrays.get("step")
    return XaiCheckpoint(
        path=step_dir,
        params={haiku_name(n): np.asarray(arrays[n]) for n in param_names},
        config=config,
        step=int(step) if step is not None and np.ndim(step) == 0 else None,
        elapsed_samples=_elapsed_samples(step_dir),
        extra={n: np.asarray(arrays[n]) for n in names if n.split(".")[0] in extra},
        not_loaded={
            entry: len(_flatten(value))
            for entry, value in sorted(tree.items())
            if entry not in subtree and _flatten(value)
        },
        verified=verify,
    )


def _where(found: ArrayBytes) -> str:
    """The file an array's bytes are in (its first), for messages."""
    files = found.files()
    return files[0] if files else "."


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser(
        "python -m phoenix.checkpoint.xai",
        "Check and list an xrex (X's production Phoenix) checkpoint: every parameter's name,\n"
        "shape and dtype, the config name and step, and whether every array read matches\n"
        f"{CHECKSUMS_FILE}. Exit status 0: loaded (and verified, without --no-verify); 1:\n"
        "refused (the error names the file and what is wrong); 2: bad command line.",
        "Examples:\n"
        "  python -m phoenix.checkpoint.xai checkpoints/home_direct_packed_nano\n"
        "  python -m phoenix.checkpoint.xai "
        "checkpoints/home_direct_packed_nano/elapsed_samples_000000000000004096/<run id>\n"
        "  python -m phoenix.checkpoint.xai checkpoints --extra emb_table",
    )
    parser.add_argument(
        "checkpoint",
        type=Path,
        help="a step, elapsed_samples_<N> or run directory, or a checkpoint root of one run",
    )
    parser.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="ENTRY",
        help="also read and verify this top-level entry of the state (e.g. emb_table); repeatable",
    )
    parser.add_argument(
        "--no-verify", action="store_true", help=f"do not compare arrays with {CHECKSUMS_FILE}"
    )
    return parser.parse_args(argv)


def describe(checkpoint: XaiCheckpoint) -> list[str]:
    """The lines ``main`` prints for a loaded checkpoint."""
    arrays = {**checkpoint.params, **checkpoint.extra}
    width = max(len(name) for name in arrays)
    values = sum(int(a.size) for a in checkpoint.params.values())
    lines = [
        f"checkpoint  {checkpoint.path}",
        f"config      {checkpoint.config_name or '(config.json has no name)'}",
        f"step        {checkpoint.step} (elapsed samples {checkpoint.elapsed_samples})",
        f"params      {len(checkpoint.params)} arrays, {values:,} values",
    ]
    lines += [f"  {n:<{width}}  {str(a.shape):<16} {a.dtype}" for n, a in arrays.items()]
    skipped = ", ".join(
        f"{entry} ({n} array{'s' * (n != 1)})" for entry, n in checkpoint.not_loaded.items()
    )
    lines.append(f"not read    {skipped or '-'}")
    count = len(arrays) + (checkpoint.step is not None)
    lines.append(
        f"verified    ok: {count} arrays match {CHECKSUMS_FILE}"
        if checkpoint.verified
        else f"verified    no (--no-verify): structure checked, {CHECKSUMS_FILE} not compared"
    )
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        checkpoint = load_xai_checkpoint(
            args.checkpoint, extra=args.extra, verify=not args.no_verify
        )
    except ArtifactError as err:
        print(f"error: {err}", file=sys.stderr)
        print("verified    no", file=sys.stderr)
        return 1
    print("\n".join(describe(checkpoint)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
