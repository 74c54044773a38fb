"""phoenix-compact (clients/compact.py) on real stores in tmp dirs, and the duration option
the store commands share (clients/cli.py)."""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import pytest

from clients import cli, compact
from phoenix.corpus_store import SEALED, CorpusStore, Posts

EMB = 8
HOUR, DAY = 3600, 86400


def posts(ids, created_at) -> Posts:
    ids = np.asarray(ids, np.int64)
    vectors = np.random.default_rng(ids[0]).normal(size=(len(ids), EMB))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return Posts(ids, ids % 7, np.asarray(created_at, np.int64), vectors.astype(np.float32))


@pytest.mark.parametrize(
    "text, seconds",
    [("48h", 48 * HOUR), ("3600s", 3600), ("3600", 3600), ("2d", 2 * DAY), ("30m", 1800)]
    + [(" 2D ", 2 * DAY), ("none", None), ("None", None)],
)
def test_durations(text, seconds):
    assert cli.parse_duration(text) == seconds
    if seconds is not None:
        assert cli.parse_duration(cli.format_duration(seconds)) == seconds
    assert cli.format_duration(172800) == "2d" and cli.format_duration(5400) == "90m"


@pytest.mark.parametrize("text", ["0h", "-5s", "2w", "h", "", "1.5h", "forever"])
def test_bad_durations_say_what_is_expected(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a positive count of seconds"):
        cli.parse_duration(text)


def test_a_window_drops_an_expired_segment_and_purges_old_fresh_posts(tmp_path, capsys):
    now = int(time.time())
    store = CorpusStore.create(tmp_path / "store", EMB)
    store.add(posts([1, 2, 3], [now - 5 * DAY, now - 4 * DAY, now - 3 * DAY]), state=SEALED)
    store.add(posts([4, 5], [now - 3 * DAY, now - HOUR]), state=SEALED)  # half expired, small
    store.add(posts([6, 7, 8], [now - 3 * DAY, now - 2 * HOUR, now - 60]))  # fresh
    store.add(posts([9], [now - 10]))  # fresh
    store.delete([8])

    assert compact.main(["--store", str(tmp_path / "store"), "--window", "48h"]) == 0
    out = capsys.readouterr().out
    assert "window set to 2d" in out
    # the small sealed segment (no index) is merged with the fresh ones
    assert "segments merged 3 (posts 3), expired segments dropped 1" in out
    assert "posts left out 3 (deleted, expired or repeated)" in out  # 4, 6 expired, 8 deleted
    assert "window 2d" in out.splitlines()[-1]

    snapshot = store.open()
    assert snapshot.manifest.window_seconds == 2 * DAY
    assert [s.entry.state for s in snapshot.segments] == [SEALED]
    assert snapshot.segments[0].post_ids.tolist() == [7, 5, 9]  # in creation order
    assert snapshot.tombstones.tolist() == []  # no segment holds post 8 any more
    assert snapshot.manifest.retired  # the old files wait out their grace period
    everyone = np.ones((1, EMB), np.float32) / np.sqrt(EMB)
    served = snapshot.search(everyone, k=10, now=time.time()).post_ids[0]
    assert sorted(served.tolist()) == [5, 7, 9]


def test_window_none_serves_everything_and_an_unchanged_window_is_left_alone(tmp_path, capsys):
    store = CorpusStore.create(tmp_path / "store", EMB, window_seconds=HOUR)
    store.add(posts([1], [int(time.time()) - 3 * DAY]))
    generation = store.manifest().generation
    assert compact.main(["--store", str(tmp_path / "store"), "--window", "1h"]) == 0
    assert "window set" not in capsys.readouterr().out
    assert store.manifest().generation == generation + 1  # the compaction's only
    assert store.manifest().rows == 0  # the old post left out: the window was an hour

    store.add(posts([2], [int(time.time()) - 3 * DAY]))
    assert compact.main(["--store", str(tmp_path / "store"), "--window", "none"]) == 0
    assert "window set to none" in capsys.readouterr().out
    assert store.manifest().window_seconds is None and store.manifest().rows == 1


def test_every_repeats_until_stopped(tmp_path, capsys):
    store = CorpusStore.create(tmp_path / "store", EMB)
    stop = threading.Event()

    def feed():  # a post between runs: the runs that follow seal it
        for post_id in (1, 2, 3):
            store.add(posts([post_id], [int(time.time())]))
            time.sleep(0.15)
        stop.set()

    thread = threading.Thread(target=feed)
    thread.start()
    args = compact.parse_args(["--store", str(tmp_path / "store"), "--every", "0.05"])
    assert compact.compact(args, stop=stop) == 0
    thread.join()
    runs = [line for line in capsys.readouterr().out.splitlines() if line.startswith("compacted")]
    assert len(runs) >= 3
    assert sorted(np.concatenate([s.post_ids for s in store.open().segments]).tolist()) == [1, 2, 3]


def test_a_missing_store_exits_3_naming_the_manifest(tmp_path, capsys):
    assert compact.main(["--store", str(tmp_path / "nothing")]) == 3
    err = capsys.readouterr().err
    assert f"{tmp_path / 'nothing' / 'manifest.json'}: not found" in err


@pytest.mark.parametrize(
    "argv, message",
    [(["--window", "2w"], "'2w' is not a duration"), (["--every", "0"], "a number > 0")],
)
def test_bad_options_exit_2(tmp_path, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        compact.main(["--store", str(tmp_path), *argv])
    assert stopped.value.code == 2 and message in capsys.readouterr().err
