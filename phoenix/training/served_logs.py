"""Served traffic as training rows: the request log (``phoenix.user_state.request_log``) joined
with the engagement events into ``impressions.npz`` rows of the schema ``logs`` reads.

Each post a logged request returned is one impression of that user at the request's time, with
its ``request_id``, on the For You surface (what ``recommend`` serves). An engagement of the
same user with the same post within ``window_s`` after the impression gives the row its
actions (several engagements: their actions together, the longest dwell); a shown post nobody
engaged with in the window is an impression with every action 0, which is what a ranker
learns "not engaged" from. An engagement joins the latest impression of its post before it.

The rest puts those rows on the synthetic world's clock and indices (``WorldTime``,
``indexed_impressions``), splits them by time into training and held-out rows (``TimeSplit``)
and adds the histories the store held when serving began (``history_context``);
``phoenix.training.served_export`` reads Redis and writes the log directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from phoenix.config import ACTION_NAMES
from phoenix.user_state.events import Engagement
from phoenix.user_state.request_log import RequestRecord
from phoenix.world.logs import IMPRESSION_COLUMNS
from phoenix.world.synthetic import SURFACE_NAMES, Impressions

FEED_SURFACE = SURFACE_NAMES.index("home_for_you")  # where recommend's feed is shown


def impression_rows(
    records: Sequence[RequestRecord], engagements: Iterable[Engagement], window_s: float
) -> dict[str, np.ndarray]:
    """The ``impressions.npz`` columns (``logs.IMPRESSION_COLUMNS``) of the posts ``records``
    returned, with the actions of ``engagements`` within ``window_s`` of each impression; not
    the columns the writer derives from the world (timezone, hour of day)."""
    if not window_s > 0:
        raise ValueError(f"window_s must be > 0, got {window_s}")
    count = sum(len(r.ranked_post_ids) for r in records)
    rows = {
        "user_id": _concat([np.full(len(r.ranked_post_ids), r.user_id) for r in records]),
        "post_id": _concat([r.ranked_post_ids for r in records]),
        "author_id": _concat([r.ranked_author_ids for r in records]),
        "impression_ts": _concat([np.full(len(r.ranked_post_ids), r.ts) for r in records]),
        "request_id": _concat([np.full(len(r.ranked_post_ids), r.request_id) for r in records]),
        "product_surface": np.full(count, FEED_SURFACE),
        "dwell_seconds": np.zeros(count),
        "actions": np.zeros((count, len(ACTION_NAMES))),
    }
    _join(rows, np.array([r.ts for r in records for _ in r.ranked_post_ids]), engagements, window_s)
    return {
        name: rows[name].astype(column.dtype)
        for name, column in IMPRESSION_COLUMNS.items()
        if name in rows
    }


def _concat(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0)


def _join(rows: dict, shown_at: np.ndarray, engagements: Iterable[Engagement], window_s: float):
    """Set the actions and dwell of the impressions each engagement follows within window_s."""
    impressions: dict[tuple[int, int], list[int]] = {}
    for i in np.argsort(shown_at, kind="stable"):  # each (user, post)'s rows, oldest first
        key = (int(rows["user_id"][i]), int(rows["post_id"][i]))
        impressions.setdefault(key, []).append(int(i))
    bits = np.arange(len(ACTION_NAMES))
    for event in engagements:
        candidates = impressions.get((event.user_id, event.post_id), [])
        before = [i for i in candidates if shown_at[i] <= event.ts <= shown_at[i] + window_s]
        if not before:
            continue
        row = before[-1]  # the latest impression before the engagement
        rows["actions"][row] = np.maximum(rows["actions"][row], (event.actions >> bits) & 1)
        rows["dwell_seconds"][row] = max(rows["dwell_seconds"][row], event.dwell_seconds)


# ----------------------------------------------------------------------------------------
# Served rows in the world's time and index form, split into training and held-out time
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimeSplit:
    """Served traffic from ``first`` to ``last`` (wall seconds); rows at or after ``split``
    are held out (the last ``held_out_fraction`` of the range)."""

    first: float
    split: float
    last: float

    @classmethod
    def of(cls, request_ts: Sequence[float], held_out_fraction: float) -> TimeSplit:
        if not 0 < held_out_fraction < 1:
            raise ValueError(f"held_out_fraction must lie in (0, 1), got {held_out_fraction}")
        if len(request_ts) == 0:
            raise ValueError("no served requests to split")
        first, last = float(np.min(request_ts)), float(np.max(request_ts))
        return cls(first, first + (1.0 - held_out_fraction) * (last - first), last)


@dataclass(frozen=True)
class WorldTime:
    """Served wall-clock seconds on the world's clock: ``origin_wall`` (the first served
    request) is the world's first held-out second, as ``phoenix.world.users`` loads the
    store (the world's engagements end just before serving starts)."""

    origin_wall: float
    origin_world: int

    def __call__(self, wall_ts) -> np.ndarray:
        offset = np.floor(np.asarray(wall_ts, np.float64) - self.origin_wall)
        return self.origin_world + offset.astype(np.int64)


def complete_rows(rows: dict[str, np.ndarray], complete_from: dict[int, float]) -> np.ndarray:
    """Mask of the rows whose engagements are all still kept: a row shown before its user's
    ``complete_from`` (the store's history cap dropped older engagements) may have lost its
    actions, and an unlabelled row would teach "not engaged"."""
    start = np.array([complete_from.get(int(u), -np.inf) for u in rows["user_id"]], np.float64)
    return rows["impression_ts"] >= start


def indexed_impressions(rows: dict[str, np.ndarray], world, to_world: WorldTime):
    """(``Impressions`` of the rows whose user and post the world knows, in world time and
    world indices; how many rows were dropped as unknown)."""
    from phoenix.world.simulate import index_of  # numpy only

    user = index_of(world.user_ids, rows["user_id"])
    post = index_of(world.post_ids, rows["post_id"])
    known = (user >= 0) & (post >= 0)
    imp = Impressions(
        user=user[known].astype(np.int32),
        post=post[known].astype(np.int32),
        ts=to_world(rows["impression_ts"][known]),
        request=rows["request_id"][known].astype(np.int64),
        surface=rows["product_surface"][known].astype(np.int8),
        dwell_seconds=rows["dwell_seconds"][known].astype(np.float32),
        actions=rows["actions"][known].astype(np.uint8),
    )
    return imp, int((~known).sum())


def concat_impressions(*parts: Impressions) -> Impressions:
    names = [f.name for f in dataclasses.fields(Impressions)]
    return Impressions(**{n: np.concatenate([getattr(p, n) for p in parts]) for n in names})


def history_context(world_impressions: Impressions, users: np.ndarray, before_ts: int, keep: int):
    """The engaged impressions the store held for ``users`` (world indices) when serving
    began: each one's newest ``keep`` engaged impressions before ``before_ts`` (what
    ``phoenix.world.users.load_users`` loads). They make up the served requests'
    histories; training does not take them as examples (``LogIndex.train_from_ts``)."""
    from phoenix.world.users import newest_per_group  # numpy only

    imp = world_impressions
    rows = np.flatnonzero(
        imp.actions.any(axis=1) & (imp.ts < before_ts) & np.isin(imp.user, users)
    )  # in (user, time) order, as the generator writes them
    rows = rows[newest_per_group(imp.user[rows], keep)]
    return Impressions(**{f.name: getattr(imp, f.name)[rows] for f in dataclasses.fields(imp)})
