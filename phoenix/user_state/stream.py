"""Applying user-state events from a Redis Stream, at least once and without doubling.

Producers ``publish`` events as stream entries (one field, ``event``: the JSON line of
``phoenix.user_state.events``). A ``StreamConsumer`` reads them in a consumer group
(XREADGROUP), applies each batch to the store in one pipeline, and acknowledges the batch
(XACK) only after it was applied. After a restart it first re-reads its own pending entries
(delivered, never acknowledged) and takes over entries another consumer left pending longer
than ``claim_idle_ms`` (XAUTOCLAIM): nothing is lost, and since applying an event twice changes
nothing (the store's writes are idempotent), nothing is doubled.

A bad entry (not JSON, a wrong field, or an event serving would not take: ``EventLimits``) is
logged with its entry id, counted and acknowledged: it would fail again on every re-read. A
batch the store cannot apply stops the consumer with ``StreamConsumerError`` naming the stream,
group and the batch's first and last entry ids; the batch stays pending and is re-read by the
next start.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Iterable

import redis
from redis.exceptions import RedisClusterException

from phoenix.user_state.client import SOCKET_TIMEOUT_S, Client, unavailable_or_failed
from phoenix.user_state.events import Event, EventError, EventLimits, parse_event, to_json
from phoenix.user_state.store import UserStateStore

logger = logging.getLogger(__name__)

STREAM = "user-state:events"
GROUP = "user-state"
FIELD = "event"
BATCH_SIZE = 500  # entries per XREADGROUP: one store pipeline each
CLAIM_IDLE_MS = 60_000  # a dead consumer's entries are taken over after a minute
# XREADGROUP's BLOCK must end before the client's socket timeout, or the wait reads as a dead
# server.
BLOCK_MS = int(SOCKET_TIMEOUT_S * 1000) // 2


class StreamConsumerError(RuntimeError):
    """A batch could not be read, applied or acknowledged; it stays pending."""


def publish(client: Client, events: Iterable[Event], stream: str = STREAM) -> list[str]:
    """Append ``events`` to ``stream`` in one pipeline; their entry ids."""
    pipe = client.pipeline(transaction=False)
    for event in events:
        pipe.xadd(stream, {FIELD: to_json(event)})
    return [i.decode() if isinstance(i, bytes) else i for i in pipe.execute()]


@dataclass
class ConsumerCounts:
    batches: int = 0
    applied: int = 0  # events applied (a re-read entry counts again)
    skipped: int = 0  # bad entries, acknowledged without being applied


class StreamConsumer:
    """One consumer of a consumer group over the events stream."""

    def __init__(
        self,
        client: Client,
        store: UserStateStore,
        *,
        consumer: str,
        limits: EventLimits,
        stream: str = STREAM,
        group: str = GROUP,
        batch_size: int = BATCH_SIZE,
        claim_idle_ms: int = CLAIM_IDLE_MS,
    ):
        self.client, self.store, self.limits = client, store, limits
        self.stream, self.group, self.consumer = stream, group, consumer
        self.batch_size, self.claim_idle_ms = batch_size, claim_idle_ms
        self.counts = ConsumerCounts()
        self._own_pending_done = False  # own unacknowledged entries are re-read first

    def _where(self) -> str:
        return f"stream {self.stream!r} group {self.group!r} consumer {self.consumer!r}"

    def _call(self, what: str, command, *args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (redis.RedisError, RedisClusterException) as error:
            raise StreamConsumerError(
                f"{self._where()}: {what}: {unavailable_or_failed(self.store.name, what, error)}"
            ) from error

    def ensure_group(self) -> None:
        """Create the group (and the stream) reading from the first entry, unless it exists."""
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise StreamConsumerError(
                    f"{self._where()}: creating the group: {error}"
                ) from error

    def _next_entries(self, block_ms: int | None) -> list:
        """Own pending entries first, then entries idle at a dead consumer, then new ones."""
        if not self._own_pending_done:
            reply = self._call(
                "reading pending entries", self.client.xreadgroup, self.group, self.consumer,
                {self.stream: "0"}, count=self.batch_size,
            )  # fmt: skip
            entries = reply[0][1] if reply else []
            if entries:
                return entries
            self._own_pending_done = True
        claimed = self._call("claiming idle entries", self.client.xautoclaim, self.stream,
                             self.group, self.consumer, self.claim_idle_ms, "0-0",
                             count=self.batch_size)  # fmt: skip
        if claimed[1]:
            return claimed[1]
        reply = self._call("reading new entries", self.client.xreadgroup, self.group,
                           self.consumer, {self.stream: ">"}, count=self.batch_size,
                           block=block_ms)  # fmt: skip
        return reply[0][1] if reply else []

    def _parse(self, entry_id: str, fields) -> Event | None:
        try:
            if not fields or FIELD.encode() not in fields:
                raise EventError(f"no {FIELD!r} field (deleted or foreign entry)")
            line = fields[FIELD.encode()].decode("utf-8", errors="replace")
            return parse_event(line, self.limits)
        except EventError as error:
            logger.warning("%s: entry %s: %s; refused", self._where(), entry_id, error)
            self.counts.skipped += 1
            return None

    def poll(self, block_ms: int | None = None) -> int:
        """Read, apply and acknowledge one batch; the number of entries (0: none waiting).
        ``block_ms`` waits that long for new entries (None: do not wait; at most BLOCK_MS)."""
        if block_ms is not None and not 0 < block_ms <= BLOCK_MS:
            raise ValueError(f"block_ms must lie in (0, {BLOCK_MS}] (below the socket timeout)")
        entries = self._next_entries(block_ms)
        if not entries:
            return 0
        ids = [e[0].decode() if isinstance(e[0], bytes) else e[0] for e in entries]
        events = [
            ev for ev in (self._parse(i, fields) for i, (_, fields) in zip(ids, entries)) if ev
        ]
        batch = f"batch {ids[0]}..{ids[-1]} ({len(ids)} entries)"
        try:
            self.store.apply(events)
        except Exception as error:
            raise StreamConsumerError(
                f"{self._where()}: {batch} not applied, nothing acknowledged (it is re-read on "
                f"the next start): {error}"
            ) from error
        self._call(f"acknowledging {batch}", self.client.xack, self.stream, self.group, *ids)
        self.counts.batches += 1
        self.counts.applied += len(events)
        return len(ids)

    def run(self, stop: threading.Event, block_ms: int = BLOCK_MS) -> ConsumerCounts:
        """Poll until ``stop`` is set; a failure raises StreamConsumerError."""
        self.ensure_group()
        while not stop.is_set():
            self.poll(block_ms)
        return self.counts

    def drain(self) -> ConsumerCounts:
        """Apply everything waiting (pending, idle elsewhere, new), then return."""
        self.ensure_group()
        while self.poll(None):
            pass
        return self.counts
