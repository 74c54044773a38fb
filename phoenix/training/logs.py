"""Engagement logs on disk: the schema, a writer and a checked reader.

A log directory holds uncompressed ``.npz`` files (``np.load(..., allow_pickle=False)`` reads
them) and one JSON file. Ids are raw int64 ids as the servers take them; times are Unix seconds.

``impressions.npz`` (one row per impression, sorted by user and time; the columns a real log of
the original's features has)
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
from typing import Any, Union

import numpy as np

from phoenix.checkpoint import read_json, read_npz, write_json, write_npz
from phoenix.config import ACTION_NAMES
from phoenix.training.synthetic import (
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

IMPRESSION_COLUMNS = {
    "user_id": (np.int64, 1),
    "post_id": (np.int64, 1),
    "author_id": (np.int64, 1),
    "impression_ts": (np.int64, 1),
    "request_id": (np.int64, 1),
    "product_surface": (np.int32, 1),
    "dwell_seconds": (np.float32, 1),
    "actions": (np.uint8, 2),
}
POST_COLUMNS = {
    "post_id": (np.int64, 1),
    "author_id": (np.int64, 1),
    "topic": (np.int32, 1),
    "media": (np.int8, 1),
    "created_ts": (np.int64, 1),
}
AUTHOR_COLUMNS = {"author_id": (np.int64, 1), "topic": (np.int32, 1), "handle": (np.str_, 1)}
TRUTH_COLUMNS = {
    "user_id": (np.int64, 1),
    "interest": (np.float32, 2),
    "dislike": (np.float32, 2),
    "follows": (np.int64, 2),
    "activity": (np.float32, 1),
    "author_quality": (np.float32, 1),
    "post_quality": (np.float32, 1),
}


class LogError(ValueError):
    """A log directory is missing a file or a column, or a column has the wrong type."""


def world_arrays(world: World) -> dict[str, dict[str, np.ndarray]]:
    """The posts, authors and ground-truth tables of ``world`` as written."""
    return {
        "posts.npz": {
            "post_id": world.post_ids,
            "author_id": world.author_ids[world.post_author],
            "topic": world.post_topic.astype(np.int32),
            "media": world.post_media.astype(np.int8),
            "created_ts": world.post_created_ts,
        },
        "authors.npz": {
            "author_id": world.author_ids,
            "topic": world.author_topic.astype(np.int32),
            "handle": world.author_handles,
        },
        "ground_truth.npz": {
            "user_id": world.user_ids,
            "interest": world.interest,
            "dislike": world.dislike,
            "follows": world.author_ids[world.follows],
            "activity": world.activity,
            "author_quality": world.author_quality,
            "post_quality": world.post_quality,
        },
    }


def impression_arrays(world: World, impressions: Impressions) -> dict[str, np.ndarray]:
    return {
        "user_id": world.user_ids[impressions.user],
        "post_id": world.post_ids[impressions.post],
        "author_id": world.author_ids[world.post_author[impressions.post]],
        "impression_ts": impressions.ts,
        "request_id": impressions.request,
        "product_surface": impressions.surface.astype(np.int32),
        "dwell_seconds": impressions.dwell_seconds.astype(np.float32),
        "actions": impressions.actions.astype(np.uint8),
    }


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
    for name, arrays in world_arrays(world).items():
        write_npz(root / name, arrays)
    write_npz(root / "impressions.npz", impression_arrays(world, impressions))
    write_json(root / "meta.json", meta(world, impressions, seed))


def _check_columns(arrays: dict, columns: dict, name: str, rows: int | None = None) -> dict:
    for key, (dtype, ndim) in columns.items():
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
        user_ids=truth["user_id"],
        interest=truth["interest"],
        dislike=truth["dislike"],
        follows=_indices(truth["follows"], authors["author_id"], "ground_truth.npz follows"),
        activity=truth["activity"],
        author_ids=authors["author_id"],
        author_topic=authors["topic"],
        author_quality=truth["author_quality"],
        post_ids=posts["post_id"],
        post_author=_indices(posts["author_id"], authors["author_id"], "posts.npz author_id"),
        post_topic=posts["topic"],
        post_media=posts["media"],
        post_created_ts=posts["created_ts"],
        post_quality=truth["post_quality"],
        topic_names=tuple(info["topic_names"]),
    )
    impressions = Impressions(
        user=_indices(imp["user_id"], world.user_ids, "impressions.npz user_id"),
        post=_indices(imp["post_id"], world.post_ids, "impressions.npz post_id"),
        ts=imp["impression_ts"],
        request=imp["request_id"],
        surface=imp["product_surface"].astype(np.int8),
        dwell_seconds=imp["dwell_seconds"],
        actions=imp["actions"],
    )
    return world, impressions, info
