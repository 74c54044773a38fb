"""Served traffic from Redis -> a training log directory (``python -m phoenix.training
served-logs``).

Reads what ``phoenix.user_state`` wrote while serving: the request log stream (every feed
served, ``request_log``) and each served user's engagements (the ``seq`` history the event path
fills, ``UserStateStore.engagement_log``), joins them into impressions
(``served_logs.impression_rows``) and writes a directory that ``logs.load_logs`` reads:

- the world's tables (posts, authors, ground truth) of the synthetic world the served
  artifacts were trained on (their training.json), so ids line up and the ceiling is known;
- impressions: the served rows on the world's clock (the first served second is the world's
  first held-out second, ``served_logs.WorldTime``), after the served users' history context
  (the engagements the store was loaded with: what the served requests' histories held);
- meta.json: the world's meta, with ``split_ts`` the first held-out served second (the last
  ``held_out_fraction`` of the served time range) and ``train_from_ts`` the first served
  second (training takes served rows only), and a ``served`` block saying what was read.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from phoenix.checkpoint import read_json, write_json
from phoenix.training.served_logs import (
    TimeSplit,
    WorldTime,
    complete_rows,
    concat_impressions,
    history_context,
    impression_rows,
    indexed_impressions,
)
from phoenix.user_state import Engagement, UserStateStore, connect
from phoenix.user_state.request_log import RequestRecord, read_request_log
from phoenix.world import synthetic
from phoenix.world.logs import save_logs
from phoenix.world.trained import trained_world

DEFAULT_WINDOW_S = 3600.0
DEFAULT_HELD_OUT_FRACTION = 0.25
READ_USERS = 500  # users per engagement read (one pipeline each)


class ExportError(ValueError):
    """Nothing usable to export: no served requests in the range, or too few to split."""


@dataclass(frozen=True)
class ExportSummary:
    requests: int
    rows: int  # served impressions written
    engaged_rows: int
    engagements: int  # engagement events read
    dropped_unknown: int  # rows of users or posts the world does not know
    dropped_incomplete: int  # rows whose engagements the history cap may have dropped
    context_rows: int  # history rows before serving
    train_rows: int
    held_out_rows: int
    split: TimeSplit

    def text(self, out: Path) -> str:
        return (
            f"{self.requests:,} requests -> {self.rows:,} impressions "
            f"({self.engaged_rows:,} engaged, {self.engagements:,} engagement events read; "
            f"{self.train_rows:,} training, {self.held_out_rows:,} held out; dropped "
            f"{self.dropped_unknown:,} unknown, {self.dropped_incomplete:,} past the history "
            f"cap) + {self.context_rows:,} history rows, into {out}"
        )


def read_requests(client, since: float, until: float) -> list[RequestRecord]:
    """The request log's records with a time in [since, until], oldest first."""
    return [r for _, r in read_request_log(client) if since <= r.ts <= until]


def shown_top(record: RequestRecord, top_n: int) -> RequestRecord:
    """``record`` with its feed cut to the ``top_n`` posts a client showed."""
    if top_n < 1:
        raise ValueError(f"top_n must be >= 1, got {top_n}")
    return dataclasses.replace(
        record,
        ranked_post_ids=record.ranked_post_ids[:top_n],
        ranked_author_ids=record.ranked_author_ids[:top_n],
    )


def read_engagements(
    store: UserStateStore, user_ids: list[int], since: float, until: float
) -> tuple[list[Engagement], dict[int, float]]:
    """(every engagement of ``user_ids`` in [since, until], {user: complete_from})."""
    events: list[Engagement] = []
    complete_from: dict[int, float] = {}
    for start in range(0, len(user_ids), READ_USERS):
        batch = user_ids[start : start + READ_USERS]
        for user, log in zip(batch, store.engagement_log(batch, since, until)):
            complete_from[user] = log.complete_from
            r = log.records
            events += [
                Engagement(user, int(p), int(a), t / 1000.0, int(bits), int(s), float(d))
                for p, a, bits, s, d, t in zip(
                    r["post_id"], r["author_id"], r["actions"], r["surface"],
                    r["dwell_seconds"], r["ts_ms"],
                )
            ]  # fmt: skip
    return events, complete_from


def export_served_logs(
    redis_url: str,
    artifacts: Path,
    out: Path,
    window_s: float = DEFAULT_WINDOW_S,
    since: Optional[float] = None,
    until: Optional[float] = None,
    held_out_fraction: float = DEFAULT_HELD_OUT_FRACTION,
    top_n: Optional[int] = None,
    log=print,
) -> ExportSummary:
    """Read the served traffic of [since, until] (default: all the log keeps, up to now)
    from the store at ``redis_url`` and write the log directory ``out`` for the world of
    ``artifacts`` (the served artifacts)."""
    since = 0.0 if since is None else float(since)
    until = time.time() if until is None else float(until)
    store = UserStateStore(connect(redis_url), name=redis_url)
    records = read_requests(store.client, since, until)
    if top_n is not None:  # a client shows the top of the feed: the rest was never seen
        records = [shown_top(r, top_n) for r in records]
    if not records:
        raise ExportError(
            f"{redis_url}: no served requests in the request log between "
            f"{since:.0f} and {until:.0f} (was the server run with --redis?)"
        )
    split = TimeSplit.of([r.ts for r in records], held_out_fraction)
    if split.split <= split.first:
        raise ExportError(
            f"{len(records)} requests all within one second: too short a time range to hold "
            "any part out; serve longer"
        )
    users = sorted({r.user_id for r in records})
    engagements, complete_from = read_engagements(store, users, split.first, until + window_s)
    rows = impression_rows(records, engagements, window_s)
    complete = complete_rows(rows, complete_from)
    rows = {k: v[complete] for k, v in rows.items()}

    world = trained_world(artifacts)
    seed = int(read_json(artifacts / "training.json", "training.json").get("seed", 0))
    to_world = WorldTime(math.floor(split.first), world.spec.split_ts)
    served, unknown = indexed_impressions(rows, world, to_world)
    split_ts = int(to_world(split.split))
    log(f"regenerating the world's logs for the served users' histories "
        f"({world.spec.num_users:,} users)")  # fmt: skip
    _, world_impressions = synthetic.generate_logs(world.spec, seed)
    keep = store.limits.history_cap
    context = history_context(world_impressions, np.unique(served.user), world.spec.split_ts, keep)
    save_logs(out, world, concat_impressions(context, served), seed)

    held_out = int((served.ts >= split_ts).sum())
    summary = ExportSummary(
        requests=len(records),
        rows=len(served),
        engaged_rows=int(served.actions.any(axis=1).sum()),
        engagements=len(engagements),
        dropped_unknown=unknown,
        dropped_incomplete=int((~complete).sum()),
        context_rows=len(context),
        train_rows=len(served) - held_out,
        held_out_rows=held_out,
        split=split,
    )
    meta_path = Path(out).resolve() / "meta.json"
    meta = read_json(meta_path, "meta.json")
    meta.update(
        split_ts=split_ts,
        train_from_ts=int(to_world(split.first)),
        end_ts=int(to_world(split.last)) + 1,
        served={
            "source": redis_url,
            "artifacts": str(artifacts),
            "window_s": window_s,
            "held_out_fraction": held_out_fraction,
            "top_n": top_n,
            "wall_first": split.first,
            "wall_split": split.split,
            "wall_last": split.last,
            "clock": "world ts = world split_ts + floor(wall ts - floor(wall_first))",
        }
        | {k: v for k, v in dataclasses.asdict(summary).items() if k != "split"},
    )
    write_json(meta_path, meta)
    return summary
