"""User-state events as JSON lines from a file or standard input, in batches: to the store
(``apply_lines``) or to the events stream (``publish_lines``); the library behind
`phoenix-events`.

The lines are read by a thread of their own (``phoenix.corpus_store.ingestion.start_reader``,
the reader `phoenix-ingest` uses), so that a batch is sent once ``batch_size`` events are held
or as soon as the input is idle (a followed file, a pipe): an event written to a followed file
reaches the store within ``IDLE_FLUSH_S``. A line that is bad or that serving would not take
(``events.EventLimits``) is refused with a warning naming ``source:line``
(``events.parse_lines``) and counted; the other lines are sent, so the input, mended, can be
sent again whole. A batch the store or stream cannot take raises ``BatchError`` naming the
batch's lines; what was sent before it stays sent, and since every write is idempotent the
same input can simply be sent again.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Optional, Sequence

from phoenix.corpus_store.ingestion import END, start_reader
from phoenix.corpus_store.ingestion import read_lines as read_stream_lines
from phoenix.user_state.client import Client, UserStateError
from phoenix.user_state.events import Event, EventLimits, ParseCounts, parse_counted
from phoenix.user_state.store import AppliedCounts, UserStateStore
from phoenix.user_state.stream import publish

BATCH_SIZE = 1000  # events per pipeline: a few hundred KB of commands, milliseconds to apply
IDLE_FLUSH_S = 0.2  # an idle input sends what it holds after this long


class BatchError(RuntimeError):
    """A batch could not be sent (the message names its lines); earlier batches stay sent."""


@dataclass
class LineCounts:
    """What a run read and sent: lines, events parsed, lines refused, batches and events sent,
    and the applied events by kind (``apply_lines`` only)."""

    parsed: ParseCounts = field(default_factory=ParseCounts)
    batches: int = 0
    sent: int = 0
    applied: AppliedCounts = field(default_factory=AppliedCounts)

    def summary(self, where: str) -> str:
        p, a = self.parsed, self.applied
        profiles = f", {a.profiles} profiles" if a.profiles else ""
        kinds = (
            f" ({a.engagements} engagements, {a.follows} follows, {a.unfollows} unfollows, "
            f"{a.posts} posts{profiles})"
            if a.total
            else ""
        )
        return (
            f"{p.lines} lines: {self.sent} events{kinds} in {self.batches} batches to {where}, "
            f"{p.skipped} lines refused"
        )

    @property
    def refused(self) -> int:
        """Lines refused (each one named on standard error as it was read)."""
        return self.parsed.skipped


def parse_line(
    raw: bytes, source: str, number: int, counts: ParseCounts, limits: EventLimits
) -> Event | None:
    """The event of one line as bytes (``events.parse_counted``)."""
    return parse_counted(raw.decode("utf-8", errors="replace"), source, number, counts, limits)


@dataclass
class _Held:
    """Events held for the next batch and the line numbers they came from."""

    events: list[Event] = field(default_factory=list)
    first_line: int = 0
    last_line: int = 0


def send_lines(
    stream: BinaryIO,
    source: str,
    send: Callable[[Sequence[Event]], AppliedCounts | None],
    *,
    limits: EventLimits,
    follow: bool = False,
    stop: Optional[threading.Event] = None,
    batch_size: int = BATCH_SIZE,
    counts: Optional[LineCounts] = None,
    on_line: Callable[[], None] | None = None,
) -> LineCounts:
    """Read ``stream`` (following it as `tail -f` with ``follow`` until ``stop``), parse its
    lines, refuse those serving would not take (``limits``) and ``send`` the other events in
    batches; BatchError names a batch that failed."""
    stop = stop or threading.Event()
    counts = counts if counts is not None else LineCounts()
    lines, reader = start_reader(read_stream_lines(stream, follow, stop), stop)
    held = _Held()

    def flush() -> None:
        if not held.events:
            return
        try:
            applied = send(held.events)
        except (UserStateError, OSError) as error:
            raise BatchError(
                f"{source}: the batch of lines {held.first_line}..{held.last_line} "
                f"({len(held.events)} events) was not sent: {error}"
            ) from error
        counts.batches += 1
        counts.sent += len(held.events)
        if applied is not None:
            counts.applied.add(applied)
        held.events.clear()

    try:
        while True:
            try:
                item = lines.get(timeout=IDLE_FLUSH_S)
            except queue.Empty:
                flush()  # the input is idle: what is held goes now
                if stop.is_set():
                    break
                continue
            if item is END:
                break
            if isinstance(item, OSError):
                flush()
                raise BatchError(f"{source}: reading failed: {item}")
            number, raw = item
            if on_line is not None:
                on_line()
            event = parse_line(raw, source, number, counts.parsed, limits)
            if event is not None:
                if not held.events:
                    held.first_line = number
                held.events.append(event)
                held.last_line = number
            if len(held.events) >= batch_size:
                flush()
        flush()
    finally:
        stop.set()
        reader.join(timeout=2 * IDLE_FLUSH_S)
    return counts


def apply_lines(store: UserStateStore, stream: BinaryIO, source: str, **options) -> LineCounts:
    """``send_lines`` into ``store`` (one pipeline per batch)."""
    return send_lines(stream, source, store.apply, **options)


def publish_lines(client: Client, stream: BinaryIO, source: str, **options) -> LineCounts:
    """``send_lines`` onto the events stream (one pipeline of XADDs per batch), for a
    ``StreamConsumer`` to apply."""

    def send(events: Sequence[Event]) -> None:
        try:
            publish(client, events)
        except Exception as error:  # redis-py raises several types; all mean "not sent"
            raise UserStateError(f"publishing to the events stream failed: {error}") from error

    return send_lines(stream, source, send, **options)
