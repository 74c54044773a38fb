"""phoenix-ingest (clients/ingest.py over phoenix/corpus_store/ingestion.py): JSON lines in,
segments and tombstones out.

The parsing and batching are pure and tested on their own (the clock is a test's); the command
runs against real stores in tmp dirs, embedding with artifacts/trained-demo's candidate tower
in this process (no server)."""

from __future__ import annotations

import json
import os
import queue
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from clients import ingest
from phoenix.corpus_store import CorpusStore, ingestion
from phoenix.corpus_store.towers import tower_of
from phoenix.engine import CandidateTower

REPO_ROOT = Path(__file__).resolve().parents[2]
TRAINED_DEMO = REPO_ROOT / "artifacts" / "trained-demo"
NOW = 1_800_000_000.0
EMB = 8


# -- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "line, event",
    [
        (
            '{"post_id": 7, "author_id": 3, "created_at": 1700000000}',
            ingestion.NewPost(7, 3, 1700000000),
        ),
        ('{"post_id": 7, "author_id": 0}', ingestion.NewPost(7, 0, int(NOW))),  # created_at: now
        ('{"post_id": 7, "author_id": 3, "created_at": null}', ingestion.NewPost(7, 3, int(NOW))),
        (
            '{"post_id": 7, "author_id": 3, "created_at": 1700000000.9}',
            ingestion.NewPost(7, 3, 1700000000),
        ),
        (
            '{"post_id": "9223372036854775807", "author_id": "12"}',
            ingestion.NewPost(2**63 - 1, 12, int(NOW)),
        ),
        (
            '{"post_id": 7, "author_id": 3, "deleted": false, "lang": "en"}',
            ingestion.NewPost(7, 3, int(NOW)),
        ),
        ('{"delete": 7}', ingestion.Deletion(7)),
        ('{"delete": "7", "post_id": 7}', ingestion.Deletion(7)),
        ('{"post_id": 7, "deleted": true}', ingestion.Deletion(7)),
        (b'{"delete": 7}\n', ingestion.Deletion(7)),
        ("", None),
        ("   \n", None),
    ],
)
def test_a_line_is_a_post_a_deletion_or_blank(line, event):
    assert ingestion.parse_line(line, NOW) == event


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"not valid JSON \(Expecting property name .* at column 2\)"),
        # a line read with its newline that leaves the object open: not "column 1" of line 2
        ('{"post_id": 7, "author_id": 3\n', r"\(Expecting ',' delimiter at the end of the line\)"),
        ('{"post_id": 7 "author_id": 3}\n', r"\(Expecting ',' delimiter at column 15\)"),
        (b'{"delete": 7}\xff', r"not UTF-8 text \(invalid start byte at byte 13\)"),
        ("[1, 2]", "a JSON list, expected an object"),
        ('{"author_id": 3}', "'post_id' is missing, expected an integer in \\[1, 2\\*\\*63 - 1\\]"),
        ('{"post_id": 7}', "'author_id' is missing, expected an integer in \\[0,"),
        ('{"post_id": 0, "author_id": 3}', "'post_id' is 0, expected an integer in \\[1,"),
        ('{"post_id": 2.5, "author_id": 3}', "'post_id' is 2.5, expected an integer"),
        ('{"post_id": true, "author_id": 3}', "'post_id' is True, expected an integer"),
        ('{"post_id": "7a", "author_id": 3}', "'post_id' is '7a', expected an integer"),
        ('{"post_id": 9223372036854775808, "author_id": 3}', "is 9223372036854775808"),
        ('{"post_id": 7, "author_id": -1}', "'author_id' is -1, expected an integer in \\[0,"),
        ('{"post_id": 7, "author_id": 3, "created_at": "today"}', "'created_at' is 'today'"),
        ('{"post_id": 7, "author_id": 3, "created_at": -5}', "'created_at' is -5"),
        ('{"post_id": 7, "author_id": 3, "created_at": NaN}', "'created_at' is nan"),
        (
            '{"post_id": 7, "author_id": 3, "created_at": 1800000000000}',
            "more than a day ahead of now .*not milliseconds",
        ),
        ('{"delete": -3}', "'delete' is -3"),
        ('{"delete": 7, "post_id": 8}', "'delete' and 'post_id' name different posts"),
        ('{"post_id": 7, "deleted": "yes"}', "'deleted' is 'yes', expected true or false"),
    ],
)
def test_a_bad_line_says_what_was_wrong(line, message):
    with pytest.raises(ingestion.BadLine, match=message):
        ingestion.parse_line(line, NOW)


# -- batching ---------------------------------------------------------------------------------


def test_flush_by_count_counts_distinct_posts_and_the_last_line_wins():
    pending = ingestion.Pending(flush_posts=3, flush_seconds=60)
    pending.add(ingestion.NewPost(1, 10, 100), now=0)
    pending.add(ingestion.NewPost(2, 10, 100), now=0)
    pending.add(ingestion.NewPost(1, 11, 200), now=0)  # a repeat: still two posts held
    assert not pending.due(now=0)
    pending.add(ingestion.NewPost(3, 10, 100), now=0)
    assert pending.due(now=0)
    batch = pending.take()
    assert batch.posts == (
        ingestion.NewPost(2, 10, 100),
        ingestion.NewPost(1, 11, 200),
        ingestion.NewPost(3, 10, 100),
    )
    assert not pending and pending.seconds_left(now=0) is None and not pending.due(now=99)


def test_flush_by_time_counts_from_the_oldest_thing_held():
    pending = ingestion.Pending(flush_posts=1000, flush_seconds=2.0)
    pending.add(ingestion.Deletion(5), now=10.0)  # a deletion alone starts the clock too
    pending.add(ingestion.NewPost(1, 10, 100), now=11.5)
    assert pending.seconds_left(now=11.5) == pytest.approx(0.5)
    assert not pending.due(now=11.99)
    assert pending.due(now=12.0)
    assert pending.take() == ingestion.Batch((ingestion.NewPost(1, 10, 100),), (5,))


def test_a_deletion_drops_a_held_post_and_is_still_applied():
    pending = ingestion.Pending(flush_posts=10, flush_seconds=2.0)
    pending.add(ingestion.NewPost(1, 10, 100), now=0)
    pending.add(ingestion.NewPost(2, 10, 100), now=0)
    pending.add(ingestion.Deletion(1), now=0)
    assert pending.take() == ingestion.Batch((ingestion.NewPost(2, 10, 100),), (1,))


class ScriptedLines:
    """A reader queue whose items arrive at given times of a fake clock: each get() moves the
    clock to the item's time (IDLE: nothing arrived by then)."""

    IDLE = object()

    def __init__(self, clock: list, script: list):
        self.clock, self.script = clock, list(script)

    def get(self, timeout=None):
        at, item = self.script.pop(0)
        self.clock[0] = at
        if item is self.IDLE:
            raise queue.Empty
        return item

    def get_nowait(self):
        raise queue.Empty


def test_the_loop_flushes_by_count_by_time_and_at_the_end():
    clock = [0.0]
    flushed = []  # (clock time, batch)

    def write(batch, tally):
        flushed.append((clock[0], batch))
        tally.segments += bool(batch.posts)

    post = lambda i: json.dumps({"post_id": i, "author_id": 1, "created_at": 100}).encode()
    script = [
        (0.0, (1, post(1))),
        (0.5, (2, post(2))),
        (0.6, (3, post(3))),  # the third post: due by count at once
        (1.0, (4, post(4))),
        (1.5, (5, b"oops")),
        (2.0, ScriptedLines.IDLE),
        (3.0, ScriptedLines.IDLE),  # 2 s after post 4 arrived: due by time
        (4.0, (6, b'{"delete": 2}')),
        (5.0, ingestion.END),  # the end of the input: what is held is flushed
    ]
    run = ingestion.Ingest(
        ingestion.Pending(3, 2.0), write, source="events.jsonl", clock=lambda: clock[0]
    )
    tally = run.run(ScriptedLines(clock, script), threading.Event())
    assert [(t, [p.post_id for p in b.posts], list(b.deletions)) for t, b in flushed] == [
        (0.6, [1, 2, 3], []),
        (3.0, [4], []),
        (5.0, [], [2]),
    ]
    assert (tally.lines, tally.bad_lines, tally.segments) == (6, 1, 2)


def test_a_bad_line_is_reported_with_its_number_and_skipped(capsys):
    written = []
    run = ingestion.Ingest(
        ingestion.Pending(10, 2.0), lambda batch, tally: written.append(batch), source="in.jsonl"
    )
    lines = queue.Queue()
    for item in [(1, b'{"post_id": 1, "author_id": 2}\n'), (2, b"{}\n"), (3, b"\n"), ingestion.END]:
        lines.put(item)
    tally = run.run(lines, threading.Event())
    err = capsys.readouterr().err
    assert "warning: in.jsonl:2: 'post_id' is missing" in err and "line skipped" in err
    assert (tally.lines, tally.bad_lines) == (3, 1)
    assert [p.post_id for b in written for p in b.posts] == [1]


# -- writing to a store -----------------------------------------------------------------------


def fake_embed(post_ids, author_ids):
    """Unit vectors that depend on the post only (no model: these tests are about the store)."""
    vectors = np.stack([np.random.default_rng(int(i)).normal(size=EMB) for i in post_ids])
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def test_deletions_reach_the_store(tmp_path):
    store = CorpusStore.create(tmp_path / "store", EMB)
    tally = ingestion.Tally()
    first = ingestion.Batch(tuple(ingestion.NewPost(i, 100 + i, 1000 + i) for i in (1, 2, 3)))
    ingestion.write_batch(store, fake_embed, first, tally)
    ingestion.write_batch(
        store, fake_embed, ingestion.Batch((ingestion.NewPost(4, 104, 1004),), (2, 99)), tally
    )
    snapshot = store.open()
    assert [s.entry.rows for s in snapshot.segments] == [3, 1]
    assert snapshot.tombstones.tolist() == [2, 99]
    _, _, found = snapshot.lookup(np.array([1, 2, 3, 4]))
    assert found.tolist() == [True, False, True, True]
    hits = snapshot.search(fake_embed([2], [0]), k=10)  # post 2's own vector: not returned
    assert sorted(hits.post_ids[0].tolist()) == [1, 3, 4]
    assert (tally.posts, tally.deletions, tally.segments) == (4, 2, 2)


def test_a_failed_embedding_names_what_was_not_written(tmp_path):
    store = CorpusStore.create(tmp_path / "store", EMB)

    def broken(post_ids, author_ids):
        raise ConnectionRefusedError("candidate_tower: connection refused")

    batch = ingestion.Batch((ingestion.NewPost(1, 2, 3),), (5,))
    with pytest.raises(
        ingestion.FlushError, match="1 posts and 1 deletions not written: .*refused"
    ):
        ingestion.write_batch(store, broken, batch, ingestion.Tally())


# -- the command, embedding with the trained demo's tower in this process ---------------------


@pytest.fixture(scope="module")
def tower():
    return CandidateTower.from_artifacts(TRAINED_DEMO)


@pytest.fixture
def cached_tower(tower, monkeypatch):
    """The command's in-process tower, loaded once for the module."""
    monkeypatch.setattr(CandidateTower, "from_artifacts", lambda *args, **options: tower)
    return tower


def post_line(post_id: int, author_id: int = 7, **more) -> str:
    return json.dumps({"post_id": post_id, "author_id": author_id, **more}) + "\n"


def test_in_process_vectors_are_the_towers_whatever_the_batch_size(tower):
    """Small batches are padded to the rows of the tower's one program: same vectors."""
    ids, authors = np.arange(1, 41), np.arange(40) % 5
    whole = tower(ids, authors)
    assert whole.shape == (40, 64)
    np.testing.assert_allclose(np.linalg.norm(whole, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(tower(ids[:3], authors[:3]), whole[:3], atol=1e-6)


def test_ingest_a_file_into_a_new_store(tmp_path, cached_tower, capsys):
    lines = tmp_path / "events.jsonl"
    now = int(time.time())
    lines.write_text(
        "".join(post_line(i, created_at=now - 10 * i) for i in range(1, 6))
        + "{broken\n"
        + '{"delete": 2}\n'
        + post_line(6)
    )
    store_dir = tmp_path / "store"
    argv = [str(lines), "--store", str(store_dir), "--artifacts", str(TRAINED_DEMO)]
    assert ingest.main(argv) == 3  # no store yet, and no --create
    assert "not a corpus store (pass --create to make one)" in capsys.readouterr().err

    assert ingest.main([*argv, "--create", "--flush-posts", "2"]) == 0
    out, err = capsys.readouterr()
    assert "events.jsonl:6: not valid JSON" in err
    assert out.strip() == (
        f"ingested 8 lines into {store_dir}: posts 6, deletions 1, segments written 3, "
        "bad lines skipped 1"
    )
    snapshot = CorpusStore(store_dir).open()
    assert snapshot.manifest.emb_size == 64
    assert [s.entry.rows for s in snapshot.segments] == [2, 2, 2]  # by count, then at the end
    assert snapshot.tombstones.tolist() == [2]
    query = cached_tower(np.array([3]), np.array([7]))
    hits = snapshot.search(query, k=10, now=time.time())
    assert hits.post_ids[0][0] == 3 and hits.scores[0][0] == pytest.approx(1.0, abs=1e-4)
    assert sorted(hits.post_ids[0].tolist()) == [1, 3, 4, 5, 6]
    assert hits.created_at[0][0] == now - 30


def test_a_store_of_another_width_is_refused(tmp_path, cached_tower, capsys):
    CorpusStore.create(tmp_path / "store", 32)
    (tmp_path / "in.jsonl").write_text(post_line(1))
    argv = [str(tmp_path / "in.jsonl"), "--store", str(tmp_path / "store")]
    assert ingest.main([*argv, "--artifacts", str(TRAINED_DEMO)]) == 3
    assert "emb_size 32, but" in capsys.readouterr().err


@pytest.mark.parametrize(
    "option, message",
    [("--flush-posts=0", "expected an integer >= 1"), ("--flush-seconds=-1", "a number > 0")],
)
def test_bad_options_exit_2(tmp_path, option, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        ingest.main(["in.jsonl", "--store", str(tmp_path), option])
    assert stopped.value.code == 2 and message in capsys.readouterr().err


def rows_in(store_dir: Path) -> int:
    try:
        return CorpusStore(store_dir).manifest().rows
    except Exception:
        return -1


def wait_for(condition, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_follow_reads_a_growing_file_until_signalled_and_flushes_what_it_holds(
    tmp_path, cached_tower, capsys
):
    """--follow on a file another thread appends to: count flushes while it grows, a line
    written in two halves read once whole, and on SIGINT the post still held is written."""
    path, store_dir = tmp_path / "growing.jsonl", tmp_path / "store"
    path.write_text(post_line(1) + post_line(2))
    CorpusStore.create(store_dir, 64, embedded_by=tower_of(TRAINED_DEMO))  # as made now
    stop = threading.Event()
    problems = []
    before = signal.getsignal(signal.SIGINT)

    def writer():
        try:
            wait_for(lambda: rows_in(store_dir) == 2)  # the first two: a flush by count
            with path.open("a") as out:
                out.write(post_line(3))
                half = post_line(4)
                out.write(half[:9])
                out.flush()
                time.sleep(0.5)  # the reader sees half a line and waits for the rest
                out.write(half[9:] + post_line(5))
            wait_for(lambda: rows_in(store_dir) == 4)
            time.sleep(0.3)
            assert rows_in(store_dir) == 4  # post 5 is held: one post, 60 s to go
            if signal.getsignal(signal.SIGINT) is not before:  # ingest's handler is in place
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl-C: stop, flush, exit 0
        except BaseException as error:  # reported by the test, not lost in the thread
            problems.append(error)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    argv = [str(path), "--store", str(store_dir), "--follow", "--flush-posts", "2"]
    args = ingest.parse_args([*argv, "--flush-seconds", "60", "--artifacts", str(TRAINED_DEMO)])
    status = ingest.ingest(args, stop=stop)
    thread.join()
    assert not problems, problems
    assert status == 0
    out, err = capsys.readouterr()
    assert "bad lines skipped 0" in out and "posts 5" in out and "warning" not in err
    snapshot = CorpusStore(store_dir).open()
    assert [s.entry.rows for s in snapshot.segments] == [2, 2, 1]
    ids = np.concatenate([s.post_ids for s in snapshot.segments])
    assert sorted(ids.tolist()) == [1, 2, 3, 4, 5]
    assert signal.getsignal(signal.SIGINT) is before  # restored
