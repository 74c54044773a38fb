"""Served traffic as training rows: the request log (``phoenix.user_state.request_log``) joined
with the engagement events into ``impressions.npz`` rows of the schema ``logs`` reads.

Each post a logged request returned is one impression of that user at the request's time, with
its ``request_id``, on the For You surface (what ``recommend`` serves). An engagement of the
same user with the same post within ``window_s`` after the impression gives the row its
actions (several engagements: their actions together, the longest dwell); a shown post nobody
engaged with in the window is an impression with every action 0, which is what a ranker
learns "not engaged" from. An engagement joins the latest impression of its post before it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from phoenix.config import ACTION_NAMES
from phoenix.training.logs import IMPRESSION_COLUMNS
from phoenix.training.synthetic import SURFACE_NAMES
from phoenix.user_state.events import Engagement
from phoenix.user_state.request_log import RequestRecord

FEED_SURFACE = SURFACE_NAMES.index("home_for_you")  # where recommend's feed is shown


def impression_rows(
    records: Sequence[RequestRecord], engagements: Iterable[Engagement], window_s: float
) -> dict[str, np.ndarray]:
    """The ``impressions.npz`` columns (``logs.IMPRESSION_COLUMNS``) of the posts ``records``
    returned, with the actions of ``engagements`` within ``window_s`` of each impression."""
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
    return {name: rows[name].astype(column.dtype) for name, column in IMPRESSION_COLUMNS.items()}


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
