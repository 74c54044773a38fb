"""`phoenix-events` (clients/events.py over phoenix/user_state/lines.py) against a real
redis-server: apply, publish + consume, refused lines (exit 1, the rest applied), --follow, a
failed batch, artifacts that cannot be read."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clients import events as events_cli
from phoenix.user_state import UserStateStore, connect
from phoenix.user_state.stream import STREAM
from phoenix.util.processes import pick_free_ports

pytestmark = pytest.mark.timeout(60)
REPO_ROOT = Path(__file__).resolve().parents[2]

NOW = time.time()
LINES = [
    {"type": "engagement", "user_id": 7, "post_id": 91, "author_id": 3, "ts": NOW - 60,
     "actions": ["favorite"], "surface": 1, "dwell_seconds": 12.5},
    {"type": "engagement", "user_id": 7, "post_id": 92, "author_id": 4, "ts": NOW - 30,
     "actions": ["not_interested"]},
    {"type": "follow", "user_id": 7, "author_id": 3, "ts": NOW - 100},
    {"type": "follow", "user_id": 7, "author_id": 5, "ts": NOW - 90},
    {"type": "unfollow", "user_id": 7, "author_id": 5, "ts": NOW - 80},
    {"type": "post", "post_id": 93, "author_id": 3, "ts": NOW - 10},
]  # fmt: skip


def write_events(path, bad_after: int | None = None):
    lines = [json.dumps(e) for e in LINES]
    if bad_after is not None:
        lines.insert(bad_after, '{"type": "engagement", "user_id": 7}')
        lines.insert(bad_after, "not json")
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_state(url: str) -> None:
    store = UserStateStore(connect(url))
    [hist] = store.histories([7], NOW, 16)
    assert hist.ranking.post_ids.tolist() == [91, 92]
    assert hist.retrieval.post_ids.tolist() == [91]  # not_interested is negative feedback
    assert hist.ranking.dwell_seconds.tolist() == [12.5, 0.0]
    assert hist.ranking.product_surface.tolist() == [1, 0]
    assert store.follows([7])[0].tolist() == [3]  # 5 was unfollowed
    assert store.author_posts([3], NOW, 8) == [[(93, pytest.approx(NOW - 10, abs=1e-3))]]


def test_apply_refuses_bad_lines_by_file_and_line_exits_1_and_applies_the_rest(
    redis_server, tmp_path, capsys, caplog
):
    path = write_events(tmp_path / "events.jsonl", bad_after=2)
    status = events_cli.main(["apply", str(path), "--redis", redis_server.url, "--batch-size", "2"])
    assert status == events_cli.EXIT_REFUSED == 1
    assert_state(redis_server.url)
    out = capsys.readouterr().out
    assert "8 lines: 6 events (2 engagements, 2 follows, 1 unfollows, 1 posts) in 3 batches" in out
    assert "2 lines refused" in out
    warnings = [r.getMessage() for r in caplog.records]
    assert any(m.startswith(f"{path}:3: not JSON") for m in warnings), warnings
    assert any(m.startswith(f"{path}:4: engagement event: missing") for m in warnings), warnings


def test_apply_of_good_lines_only_exits_0(redis_server, tmp_path, capsys):
    path = write_events(tmp_path / "events.jsonl")
    assert events_cli.main(["apply", str(path), "--redis", redis_server.url]) == 0
    assert "0 lines refused" in capsys.readouterr().out


def test_a_surface_past_the_artifacts_is_refused_and_unreadable_artifacts_exit_3(
    redis_server, tmp_path, capsys, caplog
):
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(LINES[0] | {"user_id": 70, "surface": 16}) + "\n")
    argv = ["apply", str(path), "--redis", redis_server.url]
    assert events_cli.main(argv) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}:1: surface must lie in [0, 15] (the product surfaces of "
        "artifacts/trained-demo), got 16; line refused"
    ]
    store = UserStateStore(connect(redis_server.url))
    assert len(store.histories([70], NOW, 16)[0].ranking) == 0
    assert events_cli.main([*argv, "--artifacts", str(tmp_path / "none")]) == 3
    err = capsys.readouterr().err
    assert str(tmp_path / "none") in err and "--artifacts names the served artifacts" in err


def test_refusals_name_the_line_and_column_in_the_file_and_the_artifacts_surfaces(
    redis_server, tmp_path
):
    """`phoenix-events apply FILE` as a user types it: a line that leaves an object open (json
    alone would say "line 2 column 1" of it), a comma missing mid-line, a negative surface;
    each refusal names FILE:LINE and, for JSON, the column in that line."""
    good = json.dumps(LINES[2])
    path = tmp_path / "events.jsonl"
    path.write_text(
        "\n".join([good, good[:-1], good.replace(", ", " ", 1),
                   json.dumps(LINES[0] | {"user_id": 71, "surface": -1})]) + "\n"
    )  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).with_name("phoenix-events")), "apply", str(path),
         "--redis", redis_server.url],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    refused = [ln for ln in done.stderr.splitlines() if ln.startswith(f"warning: {path}:")]
    column = good.index(", ") + 2  # 1-based: the next member's quote, where a comma was due
    assert [line.removeprefix("warning: ") for line in refused] == [
        f"{path}:2: not JSON: Expecting ',' delimiter at the end of the line; line refused",
        f"{path}:3: not JSON: Expecting ',' delimiter at column {column}; line refused",
        f"{path}:4: surface must lie in [0, 15] (the product surfaces of artifacts/trained-demo), "
        "got -1; line refused",
    ], done.stderr
    assert "4 lines: 1 events" in done.stdout and "3 lines refused" in done.stdout


def test_publish_then_consume_applies_the_stream(redis_server, tmp_path, capsys):
    path = write_events(tmp_path / "events.jsonl")
    assert events_cli.main(["publish", str(path), "--redis", redis_server.url]) == 0
    client = connect(redis_server.url)
    assert client.xlen(STREAM) == len(LINES)
    assert UserStateStore(client).follows([7])[0].tolist() == []  # published, not applied yet

    stop = threading.Event()
    args = events_cli.parse_args(["consume", "--redis", redis_server.url, "--consumer", "t"])
    client.xadd(STREAM, {"event": json.dumps(LINES[0] | {"ts": NOW * 1000})})  # refused
    result = {}
    thread = threading.Thread(target=lambda: result.update(status=events_cli.consume(args, stop)))
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not UserStateStore(client).author_posts([3], NOW, 8)[0]:
        time.sleep(0.05)
    stop.set()
    thread.join(10)
    assert result == {"status": 0}
    assert_state(redis_server.url)
    assert client.xpending(STREAM, "user-state")["pending"] == 0  # all acknowledged
    assert f"{len(LINES)} events applied in 1 batches, 1 entries refused" in capsys.readouterr().out


def test_follow_applies_lines_appended_later(redis_server, tmp_path):
    path = tmp_path / "growing.jsonl"
    path.write_text(json.dumps(LINES[2]) + "\n")
    args = events_cli.parse_args(["apply", str(path), "--redis", redis_server.url, "--follow"])
    stop, result = threading.Event(), {}
    thread = threading.Thread(target=lambda: result.update(status=events_cli.send(args, stop)))
    thread.start()
    store = UserStateStore(connect(redis_server.url))
    with path.open("a") as out:
        out.write(json.dumps(LINES[5]) + "\n")
    deadline = time.monotonic() + 10  # applied while following, before the stop
    while time.monotonic() < deadline and not store.author_posts([3], NOW, 8)[0]:
        time.sleep(0.05)
    assert store.follows([7])[0].tolist() == [3]
    assert store.author_posts([3], NOW, 8)[0], "an appended line was not applied while following"
    stop.set()
    thread.join(10)
    assert result == {"status": 0}


def test_a_store_that_is_down_fails_with_exit_3_naming_it(tmp_path, capsys):
    path = write_events(tmp_path / "events.jsonl")
    [port] = pick_free_ports(1)
    url = f"redis://127.0.0.1:{port}"
    assert events_cli.main(["apply", str(path), "--redis", url]) == 3
    assert f"127.0.0.1:{port}" in capsys.readouterr().err


def test_a_down_cluster_fails_with_exit_3_and_a_url_of_no_store_with_exit_2(tmp_path, capsys):
    path = write_events(tmp_path / "events.jsonl")
    [port] = pick_free_ports(1)
    url = f"redis+cluster://127.0.0.1:{port}"  # the scheme alone says cluster
    assert events_cli.main(["apply", str(path), "--redis", url]) == 3
    assert f"cluster {url} is unreachable" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        events_cli.main(["apply", str(path), "--redis", f"127.0.0.1:{port}"])
    assert refused.value.code == 2
    assert "is not a Redis URL: expected redis://" in capsys.readouterr().err


def test_a_batch_the_store_refuses_exits_3_naming_its_lines(redis_server, tmp_path, capsys):
    path = write_events(tmp_path / "events.jsonl")
    client = connect(redis_server.url)
    client.set("u:{7}:follows", "not a sorted set")  # the follow batch fails (WRONGTYPE)
    status = events_cli.main(["apply", str(path), "--redis", redis_server.url, "--batch-size", "2"])
    assert status == 3
    err = capsys.readouterr().err
    assert f"{path}: the batch of lines 3..4 (2 events) was not sent" in err
    # the batch before it was applied
    assert UserStateStore(client).histories([7], NOW, 16)[0].ranking.post_ids.tolist() == [91, 92]


def test_profiles_and_the_production_context_are_applied_and_bad_ones_refused(
    redis_server, tmp_path, capsys, caplog
):
    lines = [
        {"type": "profile", "user_id": 71, "ts": NOW - 5, "country": 1, "language": 1,
         "installed_apps": [3, 40], "age_years": 30, "age_bracket": 3, "timezone": 1},
        {"type": "profile", "user_id": 71, "ts": NOW - 5, "country": 250},
        LINES[0] | {"user_id": 71, "timezone": 1, "hour_of_day": 9, "post_created_at": NOW - 99},
        LINES[0] | {"user_id": 71, "post_id": 94, "timezone": 40},
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert events_cli.main(["apply", str(path), "--redis", redis_server.url]) == 1
    out = capsys.readouterr().out
    assert "4 lines: 2 events (1 engagements, 0 follows, 0 unfollows, 0 posts, 1 profiles)" in out
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings[0].startswith(f"{path}:2: country must be an integer in [0, 249]")
    assert warnings[1].startswith(f"{path}:4: timezone must be an integer in [0, 31]")
    store = UserStateStore(connect(redis_server.url))
    (profile,) = store.profiles([71])
    assert (profile.country, profile.installed_apps, profile.timezone) == (1, (3, 40), 1)
    [hist] = store.histories([71], NOW, 16)
    assert hist.ranking.post_ids.tolist() == [91]
    assert (hist.ranking.timezone.tolist(), hist.ranking.hour_of_day.tolist()) == ([1], [9])
    assert hist.ranking.creation_time.tolist() == [int(NOW - 99)]
