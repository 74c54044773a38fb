"""Ingestion: posts and deletions, as JSON lines, into a corpus store (`phoenix-ingest`,
docs/retrieval.md "Feeding the store").

A reader thread takes whole lines from a stream (following a growing file like `tail -f` if
asked), so that the loop can flush on time while the input is idle. Each accepted post or
deletion is held (``Pending``) until a flush is due: once ``flush_posts`` posts are held, or
``flush_seconds`` after the oldest thing held arrived, and at the end. A flush embeds the posts
(``phoenix.corpus_store.embedding``: the server's candidate tower or this process') into one
fresh segment and writes the deletions as tombstones. A bad line is reported with its number
and skipped; ``Tally`` counts what happened.

One JSON object a line; blank lines are skipped and other keys ignored; ids are JSON
integers or strings of digits; created_at is unix seconds (default: now); semantic_ids (a
post's, optional) is a list of the store's semantic ID width of integers in [0, codebook]
(``semantic_ids.SemanticIdSpec``: 6 in [0, 256] unless the manifest says otherwise):

  {"post_id": 17, "author_id": 4, "created_at": 1767225600}    a post
  {"post_id": 18, "author_id": 4, "semantic_ids": [12, 7, 201, 3, 88, 140]}
                                                               a post with its semantic IDs
  {"delete": 17}                                               a deletion
  {"post_id": 17, "deleted": true}                             a deletion too
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Optional, Union

import numpy as np
from tqdm import tqdm

from phoenix.checkpoint import ArtifactError, load_config
from phoenix.corpus_store.embedding import EmbedPosts
from phoenix.corpus_store.manifest import EmbeddedBy, StoreError
from phoenix.corpus_store.segment import Posts
from phoenix.corpus_store.semantic_ids import SemanticIdSpec
from phoenix.corpus_store.store import CorpusStore
from phoenix.corpus_store.towers import check_tower
from phoenix.util.json_lines import JSONLineError, json_line
from phoenix.util.timestamps import FUTURE_SLACK_S  # a post dated further ahead: a unit mistake

MAX_ID = 2**63 - 1
POLL_S = 0.2  # longest wait for input before looking at the clock and the stop flag again
FOLLOW_POLL_S = 0.1  # how often --follow looks for more of a file
QUEUE_LINES = 10_000  # lines read ahead of the parser (bounds memory on a big file)
MAX_REPORTED_BAD = 100  # bad lines printed; the rest are only counted


# ----------------------------------------------------------------------------------------
# Lines: parsing (pure)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NewPost:
    post_id: int
    author_id: int
    created_at: int  # unix seconds
    semantic_ids: Optional[tuple[int, ...]] = None  # the store's width of codes; None: none


@dataclass(frozen=True)
class Deletion:
    post_id: int


Event = Union[NewPost, Deletion]


class BadLine(ValueError):
    """A line that is neither a post nor a deletion (the message says what was wrong)."""


def parse_line(
    line: Union[bytes, str], now: float, sids: SemanticIdSpec = SemanticIdSpec()
) -> Optional[Event]:
    """The post or deletion of one JSON line; None for a blank line; BadLine otherwise.
    ``now`` (unix seconds) dates a post without created_at; ``sids``: the store's semantic
    ID width, which a post's semantic_ids must have."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadLine(f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not line.strip():
        return None
    try:
        data = json_line(line)
    except JSONLineError as error:
        raise BadLine(f"not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise BadLine(f"a JSON {type(data).__name__}, expected an object (a post or a deletion)")
    return _deletion(data) or _post(data, now, sids)


def _deletion(data: dict) -> Optional[Deletion]:
    if "delete" in data:
        post_id = _id(data, "delete", minimum=1)
        if "post_id" in data and _id(data, "post_id", minimum=1) != post_id:
            raise BadLine("'delete' and 'post_id' name different posts, expected one post")
        return Deletion(post_id)
    deleted = data.get("deleted", False)
    if not isinstance(deleted, bool):
        raise BadLine(f"'deleted' is {deleted!r}, expected true or false")
    return Deletion(_id(data, "post_id", minimum=1)) if deleted else None


def _post(data: dict, now: float, sids: SemanticIdSpec) -> NewPost:
    try:
        codes = sids.parse(data.get("semantic_ids"))
    except ValueError as error:
        raise BadLine(str(error)) from None
    post_id, author_id = _id(data, "post_id", minimum=1), _id(data, "author_id", minimum=0)
    return NewPost(post_id, author_id, _created(data, now), codes)


def _id(data: dict, key: str, minimum: int) -> int:
    """An id: a JSON integer, or a string of digits (producers in JavaScript send 64-bit ids
    as strings, since its numbers lose precision beyond 2**53)."""
    expected = f"expected an integer in [{minimum}, 2**63 - 1]"
    if key not in data:
        raise BadLine(f"'{key}' is missing, {expected}")
    value = data[key]
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise BadLine(f"'{key}' is {value!r}, {expected}")
    if not minimum <= number <= MAX_ID:
        raise BadLine(f"'{key}' is {number}, {expected}")
    return number


def _created(data: dict, now: float) -> int:
    value = data.get("created_at")
    if value is None:
        return int(now)
    expected = "expected unix seconds (an integer or a number)"
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise BadLine(f"'created_at' is {value!r}, {expected}")
    if value < 0:
        raise BadLine(f"'created_at' is {value}, {expected} >= 0")
    if value > now + FUTURE_SLACK_S:
        raise BadLine(
            f"'created_at' is {value}, more than a day ahead of now ({int(now)}); "
            f"{expected}, not milliseconds"
        )
    return int(value)


# ----------------------------------------------------------------------------------------
# What is held between flushes (pure: the clock is passed in)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Batch:
    """One flush: posts (one per id) for a new segment, and post ids to delete."""

    posts: tuple[NewPost, ...] = ()
    deletions: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.posts or self.deletions)

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(post ids, author ids, creation times), int64 [n] each."""
        table = np.array([(p.post_id, p.author_id, p.created_at) for p in self.posts], np.int64)
        table = table.reshape(-1, 3)
        return table[:, 0], table[:, 1], table[:, 2]

    def semantic_ids(self, sids: SemanticIdSpec) -> Optional[np.ndarray]:
        """int32 [n, L]: the posts' semantic IDs (zeros for those without); None when no
        post has any."""
        if all(p.semantic_ids is None for p in self.posts):
            return None
        codes = sids.zeros(len(self.posts))
        for row, post in enumerate(self.posts):
            if post.semantic_ids is not None:
                codes[row] = post.semantic_ids
        return codes


class Pending:
    """Posts and deletions accepted and not yet written, and when the oldest arrived.

    A post seen twice keeps its last line (a segment holds a post once). A deletion also
    drops the post if it is held (no need to write a dead row) and is still applied: an
    earlier flush, or another writer, may have stored the post.
    """

    def __init__(self, flush_posts: int, flush_seconds: float):
        self.flush_posts = flush_posts
        self.flush_seconds = flush_seconds
        self._posts: dict[int, NewPost] = {}
        self._deletions: dict[int, None] = {}  # ordered set
        self._since: Optional[float] = None

    def __bool__(self) -> bool:
        return bool(self._posts or self._deletions)

    def add(self, event: Event, now: float) -> None:
        if isinstance(event, Deletion):
            self._posts.pop(event.post_id, None)
            self._deletions[event.post_id] = None
        else:
            self._posts.pop(event.post_id, None)  # re-inserted last: the newest line wins
            self._posts[event.post_id] = event
        if self._since is None:
            self._since = now

    def seconds_left(self, now: float) -> Optional[float]:
        """Seconds until a flush is due by time (<= 0: due); None when nothing is held."""
        return None if self._since is None else self._since + self.flush_seconds - now

    def due(self, now: float) -> bool:
        left = self.seconds_left(now)
        return len(self._posts) >= self.flush_posts or (left is not None and left <= 0)

    def take(self) -> Batch:
        """What is held, emptied."""
        batch = Batch(tuple(self._posts.values()), tuple(self._deletions))
        self._posts, self._deletions, self._since = {}, {}, None
        return batch


@dataclass
class Tally:
    lines: int = 0
    posts: int = 0  # rows written to segments
    deletions: int = 0  # post ids sent to the store as deleted
    segments: int = 0
    bad_lines: int = 0


# ----------------------------------------------------------------------------------------
# Writing a batch: embed, add a segment, delete
# ----------------------------------------------------------------------------------------


class IngestError(RuntimeError):
    """A run ended early (the message names what and why); what was written stays."""


class FlushError(IngestError):
    """A batch could not be written (the message names what and why)."""


class ReadError(IngestError):
    """The input could not be read any further."""


def write_batch(
    store: CorpusStore,
    embed: EmbedPosts,
    batch: Batch,
    tally: Tally,
    embedded_by: Optional[EmbeddedBy] = None,
) -> None:
    """Posts first, then deletions: a post deleted in the same batch is deleted after.
    ``embedded_by``: ``embed``'s tower, refused by a store that records another."""
    lost = f"{len(batch.posts)} posts and {len(batch.deletions)} deletions not written"
    if batch.posts:
        post_ids, author_ids, created_at = batch.columns()
        try:
            embeddings = embed(post_ids, author_ids)
        except Exception as error:  # tritonclient and JAX raise several types
            raise FlushError(f"embedding failed, {lost}: {error}") from error
        try:
            codes = batch.semantic_ids(store.manifest().semantic_ids)
            posts = Posts(post_ids, author_ids, created_at, embeddings, codes)
            store.add(posts, embedded_by=embedded_by)
        except (ArtifactError, OSError) as error:  # StoreError is an ArtifactError
            raise FlushError(f"writing a segment failed, {lost}: {error}") from error
        tally.posts += len(post_ids)
        tally.segments += 1
    if batch.deletions:
        try:
            store.delete(np.array(batch.deletions, np.int64))
        except (ArtifactError, OSError) as error:
            raise FlushError(
                f"writing tombstones failed, {len(batch.deletions)} deletions not applied: {error}"
            ) from error
        tally.deletions += len(batch.deletions)


# ----------------------------------------------------------------------------------------
# Reading lines: a thread, so that time-based flushes happen while the input is idle
# ----------------------------------------------------------------------------------------

END = None  # the reader's last item


def read_lines(stream: BinaryIO, follow: bool, stop: threading.Event) -> Iterator[bytes]:
    """Whole lines of ``stream``; with ``follow``, at the end of the file wait for more (as
    `tail -f`) until ``stop`` is set. A line still without its newline is held back while
    following (the writer may be half way through it) and given at the very end."""
    partial = b""
    while True:
        chunk = stream.readline()
        if chunk:
            partial += chunk
            if partial.endswith(b"\n"):
                yield partial
                partial = b""
        elif follow and not stop.is_set():
            stop.wait(FOLLOW_POLL_S)
        else:
            break
    if partial:
        yield partial


def start_reader(
    lines: Iterator[bytes], stop: threading.Event
) -> tuple[queue.Queue, threading.Thread]:
    """A daemon thread putting (line number, line) on the returned queue, then END; an
    OSError while reading is put instead of END."""
    out: queue.Queue = queue.Queue(QUEUE_LINES)

    def put(item) -> bool:
        while True:  # a bounded wait: give up once the main loop has stopped taking
            try:
                out.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                if stop.is_set():
                    return False

    def run() -> None:
        try:
            for number, line in enumerate(lines, 1):
                if not put((number, line)):
                    return
        except OSError as error:
            put(error)
            return
        put(END)

    thread = threading.Thread(target=run, name="ingest-reader", daemon=True)
    thread.start()
    return out, thread


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


@dataclass
class Ingest:
    """One run: lines in, batches out through ``write`` (tests pass their own)."""

    pending: Pending
    write: Callable[[Batch, Tally], None]  # writes a batch and counts what it wrote
    source: str = "<stdin>"
    clock: Callable[[], float] = time.monotonic  # flush timing
    wall_clock: Callable[[], float] = time.time  # dates posts without created_at
    tally: Tally = field(default_factory=Tally)
    bar: Optional[tqdm] = None
    sids: SemanticIdSpec = SemanticIdSpec()  # the store's semantic ID width (its manifest's)

    def take_line(self, number: int, line: bytes) -> None:
        self.tally.lines += 1
        if self.bar is not None:
            self.bar.update()
        try:
            event = parse_line(line, self.wall_clock(), self.sids)
        except BadLine as error:
            self.bad_line(number, str(error))
            return
        if event is not None:
            self.pending.add(event, self.clock())

    def bad_line(self, number: int, reason: str) -> None:
        self.tally.bad_lines += 1
        if self.tally.bad_lines <= MAX_REPORTED_BAD:
            message = f"warning: {self.source}:{number}: {reason}; line skipped"
            if self.tally.bad_lines == MAX_REPORTED_BAD:
                message += " (further bad lines are counted, not shown)"
            tqdm.write(message, file=sys.stderr)

    def flush(self) -> None:
        batch = self.pending.take()
        if batch:
            self.write(batch, self.tally)

    def run(self, lines: queue.Queue, stop: threading.Event) -> Tally:
        """Take lines until END or ``stop``, flushing when due; then take what was already
        read, and flush everything held."""
        while not stop.is_set():
            item = self._next(lines)
            if item is END:
                break
            if isinstance(item, OSError):
                self.flush()  # what was accepted is not lost to a read error
                raise ReadError(
                    f"{self.source}: reading failed after line {self.tally.lines}: {item}"
                )
            if item is not _IDLE:
                self.take_line(*item)
            if self.pending.due(self.clock()):
                self.flush()
        else:  # stopped (not at the end of the input)
            self._drain(lines)
        self.flush()
        return self.tally

    def consume(self, stream: BinaryIO, follow: bool, stop: threading.Event) -> Tally:
        """``run`` over the lines of ``stream`` read by a thread of its own; ``stop`` ends a
        ``follow`` and is set on the way out, so that the reader ends too."""
        lines, reader = start_reader(read_lines(stream, follow, stop), stop)
        try:
            return self.run(lines, stop)
        finally:
            stop.set()
            if stream is not sys.stdin.buffer:  # (a read of stdin cannot be interrupted)
                reader.join(timeout=2 * POLL_S)  # before the caller closes the file under it

    def _next(self, lines: queue.Queue):
        left = self.pending.seconds_left(self.clock())
        wait = POLL_S if left is None else min(POLL_S, max(0.0, left))
        try:
            return lines.get(timeout=wait)
        except queue.Empty:
            return _IDLE

    def _drain(self, lines: queue.Queue) -> None:
        """Lines read before the stop: accepted too (their source may not give them again)."""
        while True:
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return
            if item is END or isinstance(item, OSError):
                return
            self.take_line(*item)


_IDLE = object()  # no line within the wait


def open_store(
    path: Path, create: bool, artifacts: Path, embedded_by: Optional[EmbeddedBy] = None
) -> CorpusStore:
    """The store at ``path``; if it holds none and ``create``, a new one of ARTIFACTS'
    emb_size, recording the tower ``embedded_by``. StoreError (or OSError) when there is none
    and no ``create``, or it is unusable."""
    from phoenix.corpus_store import is_store

    if is_store(path):
        return CorpusStore(path)
    if not create:
        raise StoreError(f"{path}: not a corpus store (pass --create to make one)")
    return CorpusStore.create(path, load_config(artifacts).emb_size, embedded_by=embedded_by)


def check_width(store: CorpusStore, embed: EmbedPosts, tower_name: str) -> None:
    """A tower of another width than the store's is refused before any line is read (a
    served tower's width is known once it answers: the store checks it at the first flush)."""
    emb_size = store.manifest().emb_size
    if embed.emb_size is not None and embed.emb_size != emb_size:
        raise StoreError(
            f"{store.root}: emb_size {emb_size}, but {tower_name}'s candidate tower gives "
            f"{embed.emb_size}"
        )


def check_embedded_by(store: CorpusStore, embedded_by: EmbeddedBy) -> Optional[str]:
    """A store embedded by another tower is refused before any line is read (TowerMismatch
    naming both); the warning to show when the store records no tower (it is fed anyway:
    see ``towers``)."""
    return check_tower(store.root, store.manifest(), embedded_by)


def summary(tally: Tally, store: Path) -> str:
    return (
        f"ingested {tally.lines:,} lines into {store}: posts {tally.posts:,}, deletions "
        f"{tally.deletions:,}, segments written {tally.segments:,}, bad lines skipped "
        f"{tally.bad_lines:,}"
    )
