"""The user state `make serve` keeps across a kill -9, as a user meets it: `make serve` (its own
store, whose folder is STORE_DIR), `phoenix-events apply` with no --redis (the store found
through the server's serving.json), a recommend by user id (the feed marked served), then
SIGKILL of phoenix-serve and of its redis-server together, and `make serve` again on the same
folders: the user's history, follows and served posts are all there, read through the served
`user_state` model and from the store at the URL the new banner and serving.json give, and the
next feed repeats none of the posts served before the kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from harness.polling import wait_until
from harness.serve_process import ServePorts
from phoenix.checkpoint import load_config, load_corpus
from phoenix.client.client import connect, infer
from phoenix.ops.serving_state import SERVING_FILE
from phoenix.schema.contracts import USER_STATE
from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.embedded import STATE_FILE
from phoenix.util.processes import LoggedProcess, http_get_status, is_alive
from tests.integration.test_faults import remove, shared_memory_of

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH"),
]

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = float(os.environ.get("PHOENIX_TEST_READY_TIMEOUT", "300"))
USER, AUTHOR, NEW_POST = 4242, 987_654, 7_000_000_001  # the post is in no corpus
TOP_K = 16


def make_serve(work: Path, artifacts: Path, name: str) -> tuple[LoggedProcess, ServePorts]:
    """`make serve` as a user runs it, on free ports, its store in work/store and its build
    folder (serving.json) in work/build/serve; ready when its /ready answers 200."""
    ports = ServePorts.free()
    command = [
        "make", "--no-print-directory", "-C", str(REPO_ROOT), "serve",
        f"ARTIFACTS={artifacts}", f"HTTP_PORT={ports.http}", f"GRPC_PORT={ports.grpc}",
        f"METRICS_PORT={ports.metrics}", f"SUPERVISOR_PORT={ports.ready}",
        f"STORE_DIR={work / 'store'}", "STORE_PORT=0",
        f"SERVE_ARGS=--build-dir {work / 'build' / 'serve'} --quiet",
    ]  # fmt: skip
    skipped = ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "PHOENIX_USER_STATE_URL")
    env = {k: v for k, v in os.environ.items() if k not in skipped}
    process = LoggedProcess(command, work / f"{name}.out", env=env).start()
    ready = f"http://127.0.0.1:{ports.ready}/ready"
    up = wait_until(
        lambda: http_get_status(ready) == 200 or not process.is_running(), READY_TIMEOUT_S, 0.5
    )
    if not (up and process.is_running()):
        process.kill()
        pytest.fail(process.failure(f"{name} was not ready"))
    return process, ports


def serve_pid(make: LoggedProcess) -> int:
    for child in psutil.Process(make.pid).children(recursive=True):
        if "phoenix.ops.serve" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError("no phoenix-serve under make")


def events(corpus) -> list[dict]:
    """Six engagements with corpus posts, a follow and the followed author's new post."""
    now = time.time()
    lines = [
        {"type": "engagement", "user_id": USER, "post_id": int(corpus.post_ids[i]),
         "author_id": int(corpus.author_ids[i]), "ts": now - 600 + 60 * i,
         "actions": ["favorite"], "surface": 0}
        for i in range(6)
    ]  # fmt: skip
    lines.append({"type": "follow", "user_id": USER, "author_id": AUTHOR, "ts": now - 30})
    lines.append({"type": "post", "post_id": NEW_POST, "author_id": AUTHOR, "ts": now - 20})
    return lines


def read_back(ports: ServePorts) -> dict[str, list[int]]:
    """The user's history, served posts and in-network posts as the served user_state reads
    them from the store."""
    client = connect(f"127.0.0.1:{ports.http}")
    out = infer(client, "http", USER_STATE.name, {"user_id": np.array([[USER]], np.int64)})
    names = ("history_post_ids", "served_post_ids", "in_network_post_ids")
    return {name: [int(i) for i in out[name][0] if i] for name in names}


def recommend(ports: ServePorts) -> list[int]:
    client = connect(f"127.0.0.1:{ports.http}")
    arrays = {"user_id": np.array([[USER]], np.int64), "top_k": np.array([[TOP_K]], np.int32)}
    return [int(i) for i in infer(client, "http", "recommend", arrays)["ranked_post_ids"][0] if i]


def kill_9(make: LoggedProcess, store_folder: Path) -> float:
    """SIGKILL to phoenix-serve and to its redis-server at once; the seconds until they, make,
    tritonserver and its stubs are gone. The shared memory of the server's stubs, which nothing
    can remove after a SIGKILL, is removed here."""
    serve = serve_pid(make)
    store = json.loads((store_folder / STATE_FILE).read_text())["pid"]
    children = [p.pid for p in psutil.Process(serve).children(recursive=True)]
    assert store in children  # the store is serve's own
    regions = shared_memory_of([serve, *children])
    killed = time.monotonic()
    try:
        os.kill(serve, signal.SIGKILL)
        os.kill(store, signal.SIGKILL)
        assert make.wait_exit(30) is not None  # make reports serve's death
        gone = wait_until(lambda: not any(is_alive(p) for p in (serve, *children)), 30)
        assert gone is not None, "serve's processes outlived its SIGKILL"
    finally:
        make.kill()
        remove(regions)
    return gone - killed


def test_history_follows_and_served_posts_survive_a_kill_9_of_serve_and_its_store(
    tiny_artifacts, tmp_path
):
    began = time.monotonic()
    corpus = load_corpus(tiny_artifacts, load_config(tiny_artifacts))
    lines = events(corpus)
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    state_file = tmp_path / "build" / "serve" / SERVING_FILE
    first, ports = make_serve(tmp_path, tiny_artifacts, "serve")
    started = time.monotonic()
    try:
        state = json.loads(state_file.read_text())
        url = state["user_state"]["url"]
        assert state["user_state"]["dir"] == str((tmp_path / "store").resolve())
        assert f"  store    {url}  (data in {tmp_path / 'store'}" in first.log.read_text()
        # as a user types it, from the folder whose build/serve holds serving.json
        applied = subprocess.run(
            [str(Path(sys.executable).parent / "phoenix-events"), "apply", "events.jsonl"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert applied.returncode == 0, applied.stdout + applied.stderr
        assert f"in 1 batches to the store {url}" in applied.stdout, applied.stdout
        feed = recommend(ports)  # marks the feed served
        assert feed and NEW_POST in feed  # the followed author's post, in no corpus
        before = read_back(ports)
        assert before["history_post_ids"] == [e["post_id"] for e in lines[:6]]
        assert sorted(before["served_post_ids"]) == sorted(feed)
    finally:
        gone_s = kill_9(first, tmp_path / "store")
    restarted = time.monotonic()
    second, ports = make_serve(tmp_path, tiny_artifacts, "serve-2")
    try:
        state = json.loads(state_file.read_text())
        assert state["user_state"]["url"] == url  # the folder's port, free again: the same URL
        after = read_back(ports)
        assert after["history_post_ids"] == before["history_post_ids"]
        assert sorted(after["served_post_ids"]) == sorted(feed)
        assert after["in_network_post_ids"] == [NEW_POST]  # the follow and the author's post
        store = UserStateStore(connect_store(url))
        assert store.follows([USER])[0].tolist() == [AUTHOR]
        assert not set(recommend(ports)) & set(feed)  # served before the kill: not again
    finally:
        kill_9(second, tmp_path / "store")
    print(
        f"STORE_RESTART first start {started - began:.1f} s, killed and gone {gone_s:.1f} s, "
        f"second start {restarted and time.monotonic() - restarted:.1f} s with checks and kill"
    )
