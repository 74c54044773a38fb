"""Integrity of an xrex checkpoint's tensors: where each one's bytes lie, and its checksums.

Two questions a loader of X's production checkpoints (``phoenix.checkpoint.xai``) must answer
before it trusts an array:

- **Where are its bytes?** Orbax stores the whole state in one OCDBT database under
  ``orbax-ckpt/``: a manifest, B+tree nodes and data files (``d/<hash>``, and
  ``ocdbt.process_<i>/d/<hash>`` for each writing process). Each array is a zarr3 array whose
  keys are ``<name>/zarr.json`` and ``<name>/c/<i>/...`` (its chunks); a small value sits
  inline in a B+tree node, a larger one at a byte range of a data file. ``array_locations``
  walks the database with tensorstore's own ``ocdbt.dump`` and ``check_files`` confirms each
  referenced file is there and long enough, so a missing or truncated file is named before
  Orbax tries (and fails with a message that names only the key).
- **Are they the bytes that were saved?** xrex's trainer writes ``checksums.<process>.json``
  beside ``orbax-ckpt/`` (``xai_checkpointing.checksum``): per tensor its shape, dtype
  (``numpy.dtype.str``; bfloat16 reads ``<V2``), sharding (partition spec and mesh), one
  Adler-32 per device of that device's shard (``shard_checksums``, format ``adler32``) and,
  from version 3, one of the whole array's C-order bytes (``global_checksums``, format
  ``global_adler32``). Version 2 names a ``Parameter`` leaf with a trailing ``.0``.
  ``verify_array`` recomputes the whole-array checksum when there is one, else each shard's.

Every problem raises ``XaiCheckpointError`` naming the file and what is wrong.

Imports numpy, the standard library and, when called, tensorstore.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from phoenix.config import ArtifactError

CHECKSUMS_FILE = "checksums.0.json"  # written by process 0, the only one that writes it
_ARRAY_KEY = re.compile(r"(?P<name>.+)/(?:zarr\.json|c(?:/\d+)*)")


class XaiCheckpointError(ArtifactError):
    """An xrex checkpoint is missing, partial, damaged or not the expected layout.

    ``path`` is the file (or directory) at fault, ``problem`` what is wrong with it."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(f"{path}: {problem}")


# ----------------------------------------------------------------------------------------
# Where each array's bytes lie (OCDBT)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Extent:
    """Bytes ``[offset, offset + length)`` of ``file`` (a path under ``orbax-ckpt/``)."""

    file: str
    offset: int
    length: int


@dataclass
class ArrayBytes:
    """Where one array's keys are stored: its ``zarr.json`` seen, its chunks' extents, and the
    B+tree node files holding its inline values."""

    has_metadata: bool = False
    extents: list[Extent] = field(default_factory=list)
    node_files: set[str] = field(default_factory=set)

    def files(self) -> list[str]:
        return sorted({e.file for e in self.extents} | self.node_files)


def parse_location(location: str) -> tuple[str, Extent]:
    """``'<kind>:<base path>:<relative path>:<offset>:<length>'`` (an OCDBT dump's location)
    to its kind and extent; the file is ``<base path><relative path>``."""
    head, offset, length = location.rsplit(":", 2)
    kind, base, relative = head.split(":", 2)
    return kind, Extent(base + relative, int(offset), int(length))


def array_locations(orbax_dir: Path) -> dict[str, ArrayBytes]:
    """Every array of the OCDBT database in ``orbax_dir``, by its checkpoint name."""
    import tensorstore as ts

    base = ts.KvStore.open({"driver": "file", "path": f"{orbax_dir}/"}).result()
    try:
        manifest = ts.ocdbt.dump(base).result()
    except Exception as err:  # tensorstore raises ValueError and others with a status text
        raise XaiCheckpointError(
            orbax_dir / "manifest.ocdbt", f"the OCDBT manifest cannot be read ({err})"
        ) from err
    arrays: dict[str, ArrayBytes] = {}
    versions = manifest.get("versions") or []
    root = versions[-1]["root"].get("location") if versions else None
    if root is not None:
        _walk_node(ts, base, orbax_dir, root, b"", arrays)
    return arrays


def _walk_node(
    ts: Any, base: Any, orbax_dir: Path, location: str, prefix: bytes, arrays: dict
) -> None:
    """One B+tree node: recurse into children (their keys follow ``subtree_common_prefix``),
    record each leaf entry under its array."""
    _, node_extent = parse_location(location)
    node_file = orbax_dir / node_extent.file
    if not node_file.is_file():
        raise XaiCheckpointError(node_file, "missing: it holds a node of the OCDBT B+tree")
    try:
        node = ts.ocdbt.dump(base, location).result()
    except Exception as err:
        raise XaiCheckpointError(
            node_file, f"an OCDBT B+tree node cannot be read at bytes {_span(node_extent)} ({err})"
        ) from err
    for entry in node["entries"]:
        key = prefix + entry["key"]
        if "location" in entry and entry["location"].startswith("btreenode"):
            child_prefix = prefix + entry.get("subtree_common_prefix", b"")
            _walk_node(ts, base, orbax_dir, entry["location"], child_prefix, arrays)
            continue
        match = _ARRAY_KEY.fullmatch(key.decode("utf-8", "replace"))
        if match is None:
            continue  # not an array's key (nothing else is stored, but never mind)
        found = arrays.setdefault(match["name"], ArrayBytes())
        if key.endswith(b"/zarr.json"):
            found.has_metadata = True
        elif "indirect_value" in entry:
            found.extents.append(parse_location(entry["indirect_value"])[1])
        else:
            found.node_files.add(node_extent.file)


def _span(extent: Extent) -> str:
    return f"[{extent.offset}, {extent.offset + extent.length})"


def check_files(orbax_dir: Path, locations: Mapping[str, ArrayBytes], names: Sequence[str]) -> None:
    """Every array of ``names`` is in the database and every data file they need is there and
    long enough (a missing, emptied or truncated file is named with the arrays it holds, the
    largest first)."""
    needed: dict[str, list[tuple[str, Extent]]] = {}
    for name in names:
        where = locations.get(name)
        if where is None or not where.has_metadata:
            raise XaiCheckpointError(
                orbax_dir, f"the OCDBT database has no array '{name}' although _METADATA lists it"
            )
        for extent in where.extents:
            needed.setdefault(extent.file, []).append((name, extent))
    for file, uses in sorted(needed.items()):
        path = orbax_dir / file
        held = _describe(_largest_first(uses))
        if not path.is_file():
            raise XaiCheckpointError(path, f"missing: it holds {held}")
        size = path.stat().st_size
        name, extent = max(uses, key=lambda use: use[1].offset + use[1].length)
        if size < extent.offset + extent.length:
            raise XaiCheckpointError(
                path,
                f"truncated: {size} bytes, but array '{name}' is stored at bytes {_span(extent)}",
            )


def _largest_first(uses: list[tuple[str, Extent]]) -> list[str]:
    """The arrays of one file, those with the most bytes in it first (a file of one big table
    and many small parameters is named by the table)."""
    held: dict[str, int] = {}
    for name, extent in uses:
        held[name] = held.get(name, 0) + extent.length
    return sorted(held, key=lambda name: (-held[name], name))


def _describe(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"array{'s' if len(names) > 1 else ''} {shown}{more}"


# ----------------------------------------------------------------------------------------
# checksums.0.json
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checksums:
    """The parsed checksum file: per tensor name, what it records."""

    path: Path
    version: int
    shapes: Mapping[str, Any]
    dtypes: Mapping[str, Any]
    shardings: Mapping[str, Any]
    shard_checksums: Mapping[str, Any]
    global_checksums: Mapping[str, Any]


def parse_checksums(path: Path, document: Any) -> Checksums:
    """``checksums.0.json``'s content (already JSON-decoded) as ``Checksums``."""
    if not isinstance(document, dict):
        raise XaiCheckpointError(path, f"expected a JSON object, found {type(document).__name__}")
    version = document.get("version", 1)
    if not isinstance(version, int) or version < 2:
        raise XaiCheckpointError(
            path,
            f"checksum format version {version!r} records no per-tensor checksums "
            "(versions 2 and 3 do)",
        )
    tables = {}
    for key in ("shapes", "dtypes", "shardings", "shard_checksums", "global_checksums"):
        table = document.get(key, {})
        if not isinstance(table, dict):
            raise XaiCheckpointError(path, f"'{key}' is not a JSON object")
        if version < 3:  # version 2 kept the Parameter wrapper's leaf index in the name
            table = {str(name).removesuffix(".0"): value for name, value in table.items()}
        tables[key] = table
    return Checksums(path=path, version=version, **tables)


def adler32(data: np.ndarray) -> int:
    """Adler-32 of an array's C-order bytes (what ``zlib.adler32`` gives for ``tobytes()``)."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # any dtype, bfloat16 too
    return zlib.adler32(raw.data) & 0xFFFFFFFF


def verify_array(checksums: Checksums, name: str, array: np.ndarray, where: str) -> None:
    """``array`` (read from ``where``) has the shape, dtype and Adler-32 that ``checksums``
    records for ``name``."""
    path = checksums.path
    shape = checksums.shapes.get(name)
    if shape is not None and list(shape) != list(array.shape):
        raise XaiCheckpointError(
            path,
            f"'{name}' recorded with shape {tuple(shape)}, but the array read is {array.shape}",
        )
    dtype = checksums.dtypes.get(name)
    if dtype is not None and dtype != array.dtype.str:
        raise XaiCheckpointError(
            path,
            f"'{name}' recorded with dtype {dtype!r}, but the array read is "
            f"{array.dtype} ({array.dtype.str!r})",
        )
    if name in checksums.global_checksums:
        _compare(path, name, where, adler32(array), checksums.global_checksums[name], "")
    elif name in checksums.shard_checksums:
        sharding = checksums.shardings.get(name) or {}
        recorded = checksums.shard_checksums[name]
        shards = shard_slices(array.shape, sharding.get("spec") or [], sharding.get("mesh"))
        if not isinstance(recorded, list) or len(recorded) != len(shards):
            raise XaiCheckpointError(
                path, f"'{name}': {len(shards)} device shards, but the file records {recorded!r}"
            )
        for device, (index, value) in enumerate(zip(shards, recorded)):
            _compare(path, name, where, adler32(array[index]), value, f" (device {device})")
    else:
        raise XaiCheckpointError(path, f"no checksum recorded for '{name}'")


def _compare(path: Path, name: str, where: str, computed: int, recorded: Any, shard: str) -> None:
    if computed != recorded:
        shown = f"0x{recorded:08x}" if isinstance(recorded, int) else repr(recorded)
        raise XaiCheckpointError(
            path,
            f"checksum mismatch for '{name}'{shard}: the array read from {where} has Adler-32 "
            f"0x{computed:08x}, this file records {shown} (the data or this file is damaged)",
        )


def shard_slices(
    shape: Sequence[int], spec: Sequence[Any], mesh: Optional[Mapping[str, int]]
) -> list[tuple[slice, ...]]:
    """Each device's block of an array of ``shape`` laid out by a partition ``spec`` over a
    ``mesh`` ({axis: size}, device ids numbered row-major over the axes, as xrex lays out its
    checksum list); a dimension split over several axes takes them major to minor."""
    if not mesh:
        return [tuple(slice(None) for _ in shape)]
    axes, sizes = list(mesh), list(mesh.values())
    blocks = []
    for device in range(int(np.prod(sizes))):
        coords = dict(zip(axes, np.unravel_index(device, sizes)))
        index = []
        for dim, length in enumerate(shape):
            entry = spec[dim] if dim < len(spec) else None
            names = [] if entry is None else [entry] if isinstance(entry, str) else list(entry)
            parts, part = 1, 0
            for axis in names:
                part = part * mesh[axis] + int(coords[axis])
                parts *= mesh[axis]
            step = length // parts
            index.append(slice(part * step, (part + 1) * step))
        blocks.append(tuple(index))
    return blocks
