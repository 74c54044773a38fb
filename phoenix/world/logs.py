"""Engagement logs on disk: the schema, a writer and a checked reader.

A log directory holds uncompressed ``.npz`` files (``np.load(..., allow_pickle=False)`` reads
them) and one JSON file. Ids are raw int64 ids as the servers take them; times are Unix seconds.

``impressions.npz`` (one row per impression, in any order: the reader groups them by user, time
and request; the columns a real log of the original's features has)
    user_id          int64 [N]
    post_id          int64 [N]
    author_id        int64 [N]      the post's author
    impression_ts    int64 [N]      when the feed showed the post
    request_id       int64 [N]      the feed request (session) that showed it
    product_surface  int32 [N]      index into meta.json "surface_names"
    dwell_seconds    float32 [N]
    actions          uint8 [N, 19]  0/1 per action, columns as meta.json "action_names"

``posts.npz``: ``post_id`` int64, ``author_id`` int64, ``topic`` int32 (index into
"topic_names"), ``media`` int8 (index into "media_names"), ``created_ts`` int64.

``authors.npz``: ``author_id`` int64, ``topic`` int32, ``handle`` str.

``ground_truth.npz`` (the planted model; real logs have no such file, it feeds the ceiling):
``user_id`` int64 [U], ``interest`` and ``dislike`` float32 [U, T], ``follows`` int64 [U, F]
(author ids), ``activity`` float32 [U], ``author_quality`` float32 [A] (rows of authors.npz),
``post_quality`` float32 [P] (rows of posts.npz).

``meta.json``: ``schema`` (version), ``seed``, ``spec`` (the WorldSpec), ``split_ts`` (first
second of the held-out days), ``start_ts``, ``end_ts``, ``action_names``, ``topic_names``,
``surface_names``, ``media_names``, ``positive_actions`` and row counts.

The same spec and seed give byte-identical files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from phoenix.checkpoint import read_json, read_npz, write_json, write_npz
from phoenix.config import ACTION_NAMES
from phoenix.world.synthetic import (
    MEDIA_NAMES,
    POSITIVE_ACTIONS,
    START_TS,
    SURFACE_NAMES,
    Impressions,
    World,
    WorldSpec,
)

SCHEMA_VERSION = 1
FILES = ("impressions.npz", "posts.npz", "authors.npz", "ground_truth.npz", "meta.json")


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a log file: its type and rank, and how the generator's tables hold it.

    ``field`` names the World or Impressions attribute that the column is, unchanged; the
    reader fills that attribute from it. Columns that map ids through indices give ``of``.
    """

    dtype: Any
    ndim: int = 1
    field: str | None = None
    of: Callable[[World, Impressions], np.ndarray] | None = None

    def array(self, world: World, impressions: Impressions) -> np.ndarray:
        if self.of is not None:
            value = self.of(world, impressions)
        else:
            assert self.field is not None, "a column names its field or gives ``of``"
            value = getattr(world if hasattr(world, self.field) else impressions, self.field)
        return np.asarray(value).astype(self.dtype)


IMPRESSION_COLUMNS = {
    "user_id": Column(np.int64, of=lambda w, i: w.user_ids[i.user]),
    "post_id": Column(np.int64, of=lambda w, i: w.post_ids[i.post]),
    "author_id": Column(np.int64, of=lambda w, i: w.author_ids[w.post_author[i.post]]),
    "impression_ts": Column(np.int64, field="ts"),
    "request_id": Column(np.int64, field="request"),
    "product_surface": Column(np.int32, of=lambda w, i: i.surface),  # int8 in memory
    "dwell_seconds": Column(np.float32, field="dwell_seconds"),
    "actions": Column(np.uint8, 2, field="actions"),
}
POST_COLUMNS = {
    "post_id": Column(np.int64, field="post_ids"),
    "author_id": Column(np.int64, of=lambda w, _: w.author_ids[w.post_author]),
    "topic": Column(np.int32, field="post_topic"),
    "media": Column(np.int8, field="post_media"),
    "created_ts": Column(np.int64, field="post_created_ts"),
}
AUTHOR_COLUMNS = {
    "author_id": Column(np.int64, field="author_ids"),
    "topic": Column(np.int32, field="author_topic"),
    "handle": Column(np.str_, of=lambda w, _: w.author_handles),  # derived, not read back
}
TRUTH_COLUMNS = {
    "user_id": Column(np.int64, field="user_ids"),
    "interest": Column(np.float32, 2, field="interest"),
    "dislike": Column(np.float32, 2, field="dislike"),
    "follows": Column(np.int64, 2, of=lambda w, _: w.author_ids[w.follows]),
    "activity": Column(np.float32, field="activity"),
    "author_quality": Column(np.float32, field="author_quality"),
    "post_quality": Column(np.float32, field="post_quality"),
}
TABLES = {
    "impressions.npz": IMPRESSION_COLUMNS,
    "posts.npz": POST_COLUMNS,
    "authors.npz": AUTHOR_COLUMNS,
    "ground_truth.npz": TRUTH_COLUMNS,
}


class LogError(ValueError):
    """A log directory is missing a file or a column, a column has the wrong type, rows
    disagree (a request of two users), or the logs are another preset's or seed's."""


def table_arrays(
    columns: dict[str, Column], world: World, impressions: Impressions
) -> dict[str, np.ndarray]:
    """One file's columns, as written, from the generator's index-based tables."""
    return {name: column.array(world, impressions) for name, column in columns.items()}


def meta(world: World, impressions: Impressions, seed: int) -> dict[str, Any]:
    spec = world.spec
    return {
        "schema": SCHEMA_VERSION,
        "seed": seed,
        "spec": dataclasses.asdict(spec),
        "start_ts": START_TS,
        "split_ts": spec.split_ts,
        "end_ts": spec.end_ts,
        "action_names": list(ACTION_NAMES),
        "positive_actions": list(POSITIVE_ACTIONS),
        "topic_names": list(world.topic_names),
        "surface_names": list(SURFACE_NAMES),
        "media_names": list(MEDIA_NAMES),
        "num_impressions": len(impressions),
        "num_users": spec.num_users,
        "num_authors": spec.num_authors,
        "num_posts": spec.num_posts,
    }


def save_logs(directory: Union[str, Path], world: World, impressions: Impressions, seed: int):
    """Write the five files of a log directory (see the module docstring)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    for name, columns in TABLES.items():
        write_npz(root / name, table_arrays(columns, world, impressions))
    write_json(root / "meta.json", meta(world, impressions, seed))


def _check_columns(arrays: dict, columns: dict, name: str, rows: int | None = None) -> dict:
    for key, column in columns.items():
        dtype, ndim = column.dtype, column.ndim
        if key not in arrays:
            raise LogError(f"{name}: missing column '{key}'")
        array = arrays[key]
        if array.dtype.kind != np.dtype(dtype).kind or array.ndim != ndim:
            raise LogError(
                f"{name}: column '{key}' is {array.dtype} with {array.ndim} dims, "
                f"expected {np.dtype(dtype).name} with {ndim}"
            )
        if rows is not None and array.shape[0] != rows:
            raise LogError(f"{name}: column '{key}' has {array.shape[0]} rows, expected {rows}")
    return arrays


def _read(root: Path, name: str, columns: dict, same_rows: bool = True) -> dict[str, np.ndarray]:
    path = root / name
    if not path.is_file():
        raise LogError(f"{root}: missing {name}")
    arrays = read_npz(path, name)
    first = next(iter(columns))
    rows = arrays[first].shape[0] if same_rows and first in arrays else None
    return _check_columns(arrays, columns, name, rows)


def _indices(ids: np.ndarray, of: np.ndarray, name: str) -> np.ndarray:
    """Row of each id in ``ids`` inside the unique id array ``of``."""
    order = np.argsort(of)
    pos = np.clip(np.searchsorted(of[order], ids), 0, len(of) - 1)
    if not np.array_equal(of[order][pos], ids):
        raise LogError(f"{name}: ids that the other tables do not know")
    return order[pos].astype(np.int32)


def _fields(arrays: dict[str, np.ndarray], columns: dict[str, Column]) -> dict[str, np.ndarray]:
    """The generator's attributes that are columns of one file unchanged."""
    return {c.field: arrays[name] for name, c in columns.items() if c.field is not None}


def load_logs(directory: Union[str, Path]) -> tuple[World, Impressions, dict[str, Any]]:
    """Read a log directory back into the generator's index-based form, plus its meta."""
    root = Path(directory)
    if not root.is_dir():
        raise LogError(f"{root}: log directory not found")
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise LogError(f"{root}: missing meta.json")
    info = read_json(meta_path, "meta.json")
    if info.get("schema") != SCHEMA_VERSION:
        raise LogError(f"meta.json: schema {info.get('schema')!r}, expected {SCHEMA_VERSION}")
    if info.get("action_names") != list(ACTION_NAMES):
        raise LogError("meta.json: action_names differ from phoenix.config.ACTION_NAMES")
    spec = WorldSpec(**info["spec"])
    posts = _read(root, "posts.npz", POST_COLUMNS)
    authors = _read(root, "authors.npz", AUTHOR_COLUMNS)
    truth = _read(root, "ground_truth.npz", TRUTH_COLUMNS, same_rows=False)
    for key, table, rows in (
        ("author_quality", "authors.npz", len(authors["author_id"])),
        ("post_quality", "posts.npz", len(posts["post_id"])),
        ("interest", "ground_truth.npz user_id", len(truth["user_id"])),
        ("dislike", "ground_truth.npz user_id", len(truth["user_id"])),
        ("follows", "ground_truth.npz user_id", len(truth["user_id"])),
        ("activity", "ground_truth.npz user_id", len(truth["user_id"])),
    ):
        if truth[key].shape[0] != rows:
            raise LogError(
                f"ground_truth.npz: '{key}' has {truth[key].shape[0]} rows, {table} {rows}"
            )
    imp = _read(root, "impressions.npz", IMPRESSION_COLUMNS)
    if imp["actions"].shape[1] != len(ACTION_NAMES):
        raise LogError(f"impressions.npz: 'actions' must have {len(ACTION_NAMES)} columns")
    world = World(
        spec=spec,
        follows=_indices(truth["follows"], authors["author_id"], "ground_truth.npz follows"),
        post_author=_indices(posts["author_id"], authors["author_id"], "posts.npz author_id"),
        topic_names=tuple(info["topic_names"]),
        **_fields(truth, TRUTH_COLUMNS),
        **_fields(authors, AUTHOR_COLUMNS),
        **_fields(posts, POST_COLUMNS),
    )
    impressions = Impressions(
        user=_indices(imp["user_id"], world.user_ids, "impressions.npz user_id"),
        post=_indices(imp["post_id"], world.post_ids, "impressions.npz post_id"),
        surface=imp["product_surface"].astype(np.int8),
        **_fields(imp, IMPRESSION_COLUMNS),
    )
    return world, in_training_order(impressions), info


def in_training_order(imp: Impressions) -> Impressions:
    """The rows in the order training relies on: grouped by user (in the order of
    ground_truth.npz's rows), then by time, then by request, so each request is one run of
    rows. Logs already in that order (as the generator writes them) are returned as they are.
    Raises ``LogError`` for a request_id whose rows name more than one user or time."""
    by_request = np.argsort(imp.request, kind="stable")
    request, user, ts = imp.request[by_request], imp.user[by_request], imp.ts[by_request]
    same = request[1:] == request[:-1]
    split = same & ((user[1:] != user[:-1]) | (ts[1:] != ts[:-1]))
    if split.any():
        raise LogError(
            f"impressions.npz: request_id {request[1:][split][0]} has rows of more than one "
            "user_id or impression_ts (a request is one user at one time)"
        )
    if _ordered(imp.user, imp.ts, imp.request):
        return imp
    order = np.lexsort((imp.request, imp.ts, imp.user))
    return Impressions(**{f.name: getattr(imp, f.name)[order] for f in dataclasses.fields(imp)})


def _ordered(*keys: np.ndarray) -> bool:
    """Whether rows are in lexicographic order of ``keys`` (most significant first)."""
    ahead = np.zeros(max(len(keys[0]) - 1, 0), bool)  # decided: this row sorts after the last
    for key in keys:
        step = np.diff(key)
        if ((step < 0) & ~ahead).any():
            return False
        ahead |= step > 0
    return True
