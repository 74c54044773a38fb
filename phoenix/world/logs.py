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
    timezone         int32 [N]      the viewer's timezone (X's 32 buckets; schema 2)
    hour_of_day      int32 [N]      the local hour + 1 (1..24; schema 2)
    (the last two are written for readers of the files; this reader derives them from the
    users' timezones and the times, and takes a file without them)

``posts.npz``: ``post_id`` int64, ``author_id`` int64, ``topic`` int32 (index into
"topic_names"), ``media`` int8 (index into "media_names"), ``created_ts`` int64,
``semantic_ids`` int32 [P, L] (codes 1..256, 0 none; schema 2).

``authors.npz``: ``author_id`` int64, ``topic`` int32, ``handle`` str.

``users.npz`` (schema 2): ``user_id`` int64 and the profile, one column per
``phoenix.feed_features.PROFILE_FEATURES`` (``installed_apps`` bool [U, 64]).

``ground_truth.npz`` (the planted model; real logs have no such file, it feeds the ceiling):
``user_id`` int64 [U], ``interest`` and ``dislike`` float32 [U, T], ``follows`` int64 [U, F]
(author ids), ``activity`` float32 [U], ``author_quality`` float32 [A] (rows of authors.npz),
``post_quality`` float32 [P] (rows of posts.npz).

``meta.json``: ``schema`` (version), ``seed``, ``spec`` (the WorldSpec), ``split_ts`` (first
second of the held-out days), ``start_ts``, ``end_ts``, ``action_names``, ``topic_names``,
``surface_names``, ``media_names``, ``positive_actions``, ``semantic_ids`` (levels and
codebook size) and row counts.

Schema 2 added the production ranker's features (the columns marked above and users.npz);
schema 1 directories are read too, their semantic IDs and profiles unknown (zeros). The same
spec and seed give byte-identical files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Union

import numpy as np

from phoenix.checkpoint import read_json, read_npz, write_json, write_npz
from phoenix.config import ACTION_NAMES
from phoenix.feed_features import (
    PROFILE_FEATURES,
    SID_CODEBOOK_SIZE,
    SID_NUM_LEVELS,
    feature,
)
from phoenix.world.features import UserProfiles
from phoenix.world.synthetic import (
    MEDIA_NAMES,
    POSITIVE_ACTIONS,
    START_TS,
    SURFACE_NAMES,
    Impressions,
    World,
    WorldSpec,
)

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
FILES = (
    "impressions.npz",
    "posts.npz",
    "authors.npz",
    "users.npz",
    "ground_truth.npz",
    "meta.json",
)


@dataclasses.dataclass(frozen=True)
class Column:
    """One column of a log file: its type and rank, and how the generator's tables hold it.

    ``field`` names the World or Impressions attribute that the column is, unchanged; the
    reader fills that attribute from it. Columns that map ids through indices give ``of``.
    ``since``: the schema version that added the column (older directories lack it);
    ``derived``: the reader derives it from the other files, so a file may lack it.
    """

    dtype: Any
    ndim: int = 1
    field: str | None = None
    of: Callable[[World, Impressions], np.ndarray] | None = None
    since: int = 1
    derived: bool = False

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
    "timezone": Column(np.int32, of=lambda w, i: i.timezone(w), since=2, derived=True),
    "hour_of_day": Column(np.int32, of=lambda w, i: i.hour_of_day(w), since=2, derived=True),
}
POST_COLUMNS = {
    "post_id": Column(np.int64, field="post_ids"),
    "author_id": Column(np.int64, of=lambda w, _: w.author_ids[w.post_author]),
    "topic": Column(np.int32, field="post_topic"),
    "media": Column(np.int8, field="post_media"),
    "created_ts": Column(np.int64, field="post_created_ts"),
    "semantic_ids": Column(np.int32, 2, of=lambda w, _: w.post_semantic_ids, since=2),
}
AUTHOR_COLUMNS = {
    "author_id": Column(np.int64, field="author_ids"),
    "topic": Column(np.int32, field="author_topic"),
    "handle": Column(np.str_, of=lambda w, _: w.author_handles),  # derived, not read back
}


def _profile_column(name: str, dtype, ndim: int) -> Column:
    return Column(dtype, ndim, of=lambda w, _: getattr(w.profiles, name), since=2)


USER_COLUMNS = {
    "user_id": Column(np.int64, of=lambda w, _: w.user_ids, since=2),
    **{f.name: _profile_column(f.name, f.dtype, 2 if f.width else 1) for f in PROFILE_FEATURES},
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
    "users.npz": USER_COLUMNS,
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
        "semantic_ids": {"levels": SID_NUM_LEVELS, "codebook_size": SID_CODEBOOK_SIZE},
        "num_impressions": len(impressions),
        "num_users": spec.num_users,
        "num_authors": spec.num_authors,
        "num_posts": spec.num_posts,
    }


def save_logs(directory: Union[str, Path], world: World, impressions: Impressions, seed: int):
    """Write the six files of a log directory (see the module docstring)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    for name, columns in TABLES.items():
        write_npz(root / name, table_arrays(columns, world, impressions))
    write_json(root / "meta.json", meta(world, impressions, seed))


def _check_columns(
    arrays: dict, columns: dict, name: str, rows: int | None = None, schema: int = SCHEMA_VERSION
) -> dict:
    for key, column in columns.items():
        dtype, ndim = column.dtype, column.ndim
        if column.since > schema or column.derived and key not in arrays:
            continue  # a column added after the directory's schema, or one derived on reading
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


def _read(
    root: Path, name: str, columns: dict, same_rows: bool = True, schema: int = SCHEMA_VERSION
) -> dict[str, np.ndarray]:
    path = root / name
    if not path.is_file():
        raise LogError(f"{root}: missing {name}")
    arrays = read_npz(path, name)
    first = next(iter(columns))
    rows = arrays[first].shape[0] if same_rows and first in arrays else None
    return _check_columns(arrays, columns, name, rows, schema)


def _indices(ids: np.ndarray, of: np.ndarray, name: str) -> np.ndarray:
    """Row of each id in ``ids`` inside the unique id array ``of``."""
    order = np.argsort(of)
    pos = np.clip(np.searchsorted(of[order], ids), 0, len(of) - 1)
    if not np.array_equal(of[order][pos], ids):
        raise LogError(f"{name}: ids that the other tables do not know")
    return order[pos].astype(np.int32)


def _fields(arrays: dict[str, np.ndarray], columns: dict[str, Column]) -> dict[str, np.ndarray]:
    """The generator's attributes that are columns of one file unchanged (those it has)."""
    return {c.field: arrays[name] for name, c in columns.items() if c.field and name in arrays}


def load_logs(directory: Union[str, Path]) -> tuple[World, Impressions, dict[str, Any]]:
    """Read a log directory back into the generator's index-based form, plus its meta."""
    root = Path(directory)
    if not root.is_dir():
        raise LogError(f"{root}: log directory not found")
    meta_path = root / "meta.json"
    if not meta_path.is_file():
        raise LogError(f"{root}: missing meta.json")
    info = read_json(meta_path, "meta.json")
    schema = info.get("schema")
    if schema not in READABLE_SCHEMAS:
        raise LogError(f"meta.json: schema {schema!r}, expected one of {READABLE_SCHEMAS}")
    if info.get("action_names") != list(ACTION_NAMES):
        raise LogError("meta.json: action_names differ from phoenix.config.ACTION_NAMES")
    spec = WorldSpec(**info["spec"])
    posts = _read(root, "posts.npz", POST_COLUMNS, schema=schema)
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
    imp = _read(root, "impressions.npz", IMPRESSION_COLUMNS, schema=schema)
    if imp["actions"].shape[1] != len(ACTION_NAMES):
        raise LogError(f"impressions.npz: 'actions' must have {len(ACTION_NAMES)} columns")
    world = World(
        spec=spec,
        follows=_indices(truth["follows"], authors["author_id"], "ground_truth.npz follows"),
        post_author=_indices(posts["author_id"], authors["author_id"], "posts.npz author_id"),
        post_semantic_ids=_semantic_ids(posts, schema),
        profiles=_profiles(root, truth["user_id"], schema),
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


def _semantic_ids(posts: dict[str, np.ndarray], schema: int) -> np.ndarray:
    """posts.npz's semantic IDs, or none known (zeros) in a schema 1 directory."""
    if schema < 2:
        return np.zeros((len(posts["post_id"]), SID_NUM_LEVELS), np.int32)
    sids = posts["semantic_ids"]
    if sids.shape[0] != len(posts["post_id"]) or (sids < 0).any():
        raise LogError(
            f"posts.npz: 'semantic_ids' {sids.shape} with codes {int(sids.min(initial=0))}.., "
            f"expected one row of codes >= 0 per post"
        )
    return sids.astype(np.int32)


def _profiles(root: Path, user_ids: np.ndarray, schema: int) -> UserProfiles:
    """users.npz's profiles in the order of ``user_ids``, or nothing known in schema 1."""
    if schema < 2:
        return UserProfiles.unknown(len(user_ids))
    users = _read(root, "users.npz", USER_COLUMNS, schema=schema)
    rows = _indices(user_ids, users["user_id"], "users.npz user_id")
    apps, width = users["installed_apps"], feature("installed_apps").width
    if apps.shape[1:] != (width,):
        raise LogError(f"users.npz: 'installed_apps' is {apps.shape}, expected [U, {width}]")
    return UserProfiles(**{f.name: users[f.name][rows].astype(f.dtype) for f in PROFILE_FEATURES})


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
