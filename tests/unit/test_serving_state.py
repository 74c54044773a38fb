"""The state a running serve keeps in its build folder, as the operators' tools read it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from phoenix.ops.serving_state import (
    SERVING_FILE,
    ServingStateError,
    read_serving_state,
    remove_serving_state,
    update_serving_state,
    write_serving_state,
)

STATE = {"http": "127.0.0.1:8000", "grpc": "127.0.0.1:8001", "repository": "/r"}


def test_the_state_is_read_back_by_the_url_of_either_protocol_and_removed(tmp_path):
    write_serving_state(tmp_path, STATE)
    assert read_serving_state(tmp_path, "127.0.0.1:8001")["repository"] == "/r"
    assert read_serving_state(tmp_path, "http://127.0.0.1:8000")["repository"] == "/r"
    with pytest.raises(ServingStateError, match="not 127.0.0.1:9000: give its --build-dir"):
        read_serving_state(tmp_path, "127.0.0.1:9000")
    remove_serving_state(tmp_path)
    with pytest.raises(ServingStateError, match="no running server described in"):
        read_serving_state(tmp_path)


def test_a_state_left_by_a_process_that_died_is_not_trusted(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / SERVING_FILE).write_text(json.dumps({**STATE, "pid": int(gone.stdout)}))
    with pytest.raises(ServingStateError, match="is not running: start one with"):
        read_serving_state(tmp_path)


def test_another_process_state_is_left_in_place(tmp_path):
    (tmp_path / SERVING_FILE).write_text(json.dumps({**STATE, "pid": 1}))
    remove_serving_state(tmp_path)  # not ours: a second serve over the same build folder
    assert (tmp_path / SERVING_FILE).exists()


def test_an_update_changes_only_the_state_of_that_serve_process(tmp_path):
    write_serving_state(tmp_path, {**STATE, "artifacts": "/a/n", "artifact_version": "sha256-n"})
    ours = json.loads((tmp_path / SERVING_FILE).read_text())["pid"]
    assert not update_serving_state(tmp_path, ours + 1, {"artifacts": "/a/next"})
    assert read_serving_state(tmp_path)["artifacts"] == "/a/n"  # another serve's: untouched
    changes = {"artifacts": "/a/next", "artifact_version": "sha256-next"}
    assert update_serving_state(tmp_path, ours, changes)
    state = read_serving_state(tmp_path)
    assert (state["artifacts"], state["artifact_version"], state["repository"]) == (
        "/a/next", "sha256-next", "/r",
    )  # fmt: skip
    assert not update_serving_state(tmp_path / "none", ours, changes)  # no state: nothing made
    assert not (tmp_path / "none").exists()
