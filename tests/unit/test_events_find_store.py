"""`phoenix-events` without --redis: the store of the running server its serving.json names
(and the artifacts it serves), else $PHOENIX_USER_STATE_URL's, else exit 3 saying what to give;
against a real redis-server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from clients import events as events_cli
from phoenix.ops.serving_state import SERVING_FILE, write_serving_state
from phoenix.user_state import UserStateStore, connect

pytestmark = pytest.mark.timeout(60)

NOW = time.time()
TRAINED_DEMO = Path(events_cli.DEFAULT_ARTIFACTS).resolve()
FOLLOW = {"type": "follow", "user_id": 7, "author_id": 3, "ts": NOW - 100}


def events_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(FOLLOW) + "\n")
    return path


def serving(build_dir: Path, url: str, artifacts: Path = TRAINED_DEMO, **store) -> None:
    """A serving.json as a running serve (this process) writes it."""
    user_state = {"url": url, "password_left_out": False, "dir": None, **store}
    state = {"http": "127.0.0.1:1", "grpc": "127.0.0.1:2", "artifacts": str(artifacts)}
    write_serving_state(build_dir, {**state, "user_state": user_state})


@pytest.fixture(autouse=True)
def no_store_in_the_environment(monkeypatch):
    monkeypatch.delenv("PHOENIX_USER_STATE_URL", raising=False)


def test_apply_finds_the_store_of_the_running_server(redis_server, tmp_path, capsys):
    serving(tmp_path / "serve", redis_server.url)
    argv = ["apply", str(events_file(tmp_path)), "--serve-dir", str(tmp_path / "serve")]
    assert events_cli.main(argv) == 0
    assert UserStateStore(connect(redis_server.url)).follows([7])[0].tolist() == [3]
    said = capsys.readouterr()
    where = f"the store of the server in {tmp_path / 'serve' / SERVING_FILE}: {redis_server.url}"
    assert where in said.err
    assert (
        f"1 follows, 0 unfollows, 0 posts) in 1 batches to the store {redis_server.url}" in said.out
    )


def test_the_served_artifacts_check_the_events_unless_artifacts_is_given(
    redis_server, tmp_path, capsys
):
    missing = tmp_path / "served-artifacts"  # what the server says it serves: checked, not found
    serving(tmp_path / "serve", redis_server.url, missing)
    argv = ["apply", str(events_file(tmp_path)), "--serve-dir", str(tmp_path / "serve")]
    assert events_cli.main(argv) == 3
    assert str(missing) in capsys.readouterr().err
    assert events_cli.main([*argv, "--artifacts", str(TRAINED_DEMO)]) == 0


def test_no_running_server_exits_3_saying_what_to_give(tmp_path, capsys):
    argv = ["apply", str(events_file(tmp_path)), "--serve-dir", str(tmp_path / "none")]
    assert events_cli.main(argv) == 3
    err = capsys.readouterr().err
    assert "no store named, and no running server described in" in err
    assert "give --redis URL or set $PHOENIX_USER_STATE_URL" in err


def test_a_store_with_a_password_the_state_does_not_record_exits_3(tmp_path, capsys):
    serving(tmp_path / "serve", "redis://:***@10.0.0.5:6379/0", password_left_out=True)
    argv = ["consume", "--serve-dir", str(tmp_path / "serve")]
    assert events_cli.main(argv) == 3
    err = capsys.readouterr().err
    assert "redis://:***@10.0.0.5:6379/0, takes a password that the file does not record" in err


def test_the_environment_names_the_store_before_the_server_does(
    redis_server, tmp_path, monkeypatch
):
    serving(tmp_path / "serve", "redis://127.0.0.1:1/0")  # a store that is not there
    monkeypatch.setenv("PHOENIX_USER_STATE_URL", redis_server.url)
    argv = ["apply", str(events_file(tmp_path)), "--serve-dir", str(tmp_path / "serve")]
    assert events_cli.main(argv) == 0
    assert UserStateStore(connect(redis_server.url)).follows([7])[0].tolist() == [3]
