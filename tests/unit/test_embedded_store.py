"""The store serve starts (phoenix/user_state/embedded.py) with real redis-servers: what a client
was told is written survives a SIGKILL of redis-server and comes back on the same folder and
port; a second owner of the folder is refused naming the first; a store left running by an
owner that died is shut down cleanly and taken over, its data kept; a taken port and an
unreadable file fail with a message and change nothing; serve's store options."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from phoenix.user_state import Engagement, Follow, UserStateStore, connect
from phoenix.user_state.embedded import (
    STATE_FILE,
    EmbeddedStore,
    StoreChoice,
    StoreFolderBusy,
    StoreState,
    serve_store,
)
from phoenix.user_state.server import RedisServerError
from phoenix.util.processes import LOOPBACK, is_alive

pytestmark = pytest.mark.timeout(60)

NOW = time.time()


def fill(url: str, user: int = 7) -> None:
    store = UserStateStore(connect(url))
    store.apply([Engagement.of(user, 91, 3, NOW - 60, ["favorite"]), Follow(user, 3, NOW - 30)])
    store.mark_served(user, [101, 102], NOW - 5)


def assert_filled(url: str, user: int = 7) -> None:
    store = UserStateStore(connect(url))
    [history] = store.histories([user], NOW, 16)
    assert history.ranking.post_ids.tolist() == [91]
    assert store.follows([user])[0].tolist() == [3]
    assert sorted(store.served([user], NOW)[0].tolist()) == [101, 102]


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_writes_survive_a_sigkill_of_redis_and_come_back_on_the_same_port(tmp_path):
    folder = tmp_path / "store"
    first = EmbeddedStore(folder).start()
    try:
        fill(first.url)
        port, pid = first.server.port, first.pid
        os.kill(pid, signal.SIGKILL)  # right after the replies: nothing had time to be synced
        first.server.process.wait(5)
    finally:
        first.stop()
    assert {"appendonlydir", "redis.log", STATE_FILE} <= {p.name for p in folder.iterdir()}
    with EmbeddedStore(folder) as again:
        assert again.url == f"redis://{LOOPBACK}:{port}/0"  # the folder's last port, free again
        assert_filled(again.url)
        assert StoreState.read(folder).pid == again.pid != pid


def test_a_second_owner_is_refused_naming_the_first_and_changes_nothing(tmp_path):
    folder = tmp_path / "store"
    with EmbeddedStore(folder) as first:
        fill(first.url)
        with pytest.raises(StoreFolderBusy) as refused:
            EmbeddedStore(folder, port=0).start()
        message = str(refused.value)
        assert f"pid {os.getpid()}" in message and first.url in message, message
        assert "--store-dir" in message and "--redis URL" in message
        assert_filled(first.url)  # the running store untouched


def test_a_store_left_running_by_a_dead_owner_is_stopped_cleanly_and_taken_over(tmp_path):
    folder = tmp_path / "store"
    said: list[str] = []
    orphan = EmbeddedStore(folder).start()
    fill(orphan.url)
    os.close(orphan._owner_fd)  # what the owner's death does: its lock goes, its store runs on
    orphan._owner_fd = None
    with EmbeddedStore(folder, say=said.append) as heir:
        assert not is_alive(orphan.pid)  # shut down (SIGTERM), not left beside the new one
        orphan.server.process.wait(5)
        assert_filled(heir.url)
        [line] = said
        assert f"pid {orphan.pid}" in line and "shut down cleanly, its data kept" in line
    orphan.stop()


def test_a_taken_port_fails_naming_it_and_leaves_the_folder_as_it_was(tmp_path):
    folder = tmp_path / "store"
    with EmbeddedStore(folder) as store:
        fill(store.url)
    before = files_of(folder)
    with EmbeddedStore(tmp_path / "other") as other:  # holds a port
        with pytest.raises(RedisServerError, match=f"--store-port {other.server.port} .* not free"):
            EmbeddedStore(folder, port=other.server.port).start()
    assert files_of(folder) == before
    with EmbeddedStore(folder) as store:  # the folder is free again
        assert_filled(store.url)


def test_a_file_redis_cannot_read_fails_with_its_log_and_is_not_erased(tmp_path):
    folder = tmp_path / "store"
    with EmbeddedStore(folder) as store:
        fill(store.url)
    [increment] = (folder / "appendonlydir").glob("*.incr.aof")
    increment.write_bytes(b"*3\r\n$3\r\nSET\r\nnot a command\r\n" + increment.read_bytes())
    before = files_of(folder)
    with pytest.raises(RedisServerError) as failed:
        EmbeddedStore(folder).start()
    assert "redis-server exited" in str(failed.value) and "appendonly" in str(failed.value)
    assert files_of(folder) == {**before, "redis.log": files_of(folder)["redis.log"]}


def test_serve_store_uses_a_named_url_or_starts_the_kept_or_the_throwaway_store(tmp_path):
    with serve_store("redis://elsewhere:6379/0", tmp_path / "kept") as named:
        assert named.named and named.url == "redis://elsewhere:6379/0" and named.folder is None
    assert not (tmp_path / "kept").exists()  # nothing started for a named store
    with serve_store(None, tmp_path / "kept", appendfsync="always") as kept:
        assert kept.folder == (tmp_path / "kept").resolve() and kept.appendfsync == "always"
        assert connect(kept.url).config_get("appendfsync") == {"appendfsync": "always"}
        fill(kept.url)
    with serve_store(None, None, ephemeral_work_dir=tmp_path) as throwaway:
        assert throwaway.folder is None
        assert connect(throwaway.url).config_get("appendonly") == {"appendonly": "no"}
        assert connect(throwaway.url).dbsize() == 0
    with serve_store(None, tmp_path / "kept") as kept:
        assert_filled(kept.url)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]  # the throwaway folder gone


def test_a_cluster_the_user_names_is_used_as_it_is(tmp_path):
    """No store started, no folder made, nothing about the cluster's persistence changed; what
    serve writes of it leaves a password out."""
    from phoenix.ops.serve_store import store_line, store_state
    from phoenix.user_state.server import RedisClusterNodes

    with RedisClusterNodes(3) as cluster:
        with serve_store(cluster.url, tmp_path / "store") as store:
            assert store.named and store.url == cluster.url and store.folder is None
            fill(store.url)
            assert_filled(store.url)
        for node in cluster.nodes:
            assert connect(node.url).config_get("appendonly") == {"appendonly": "no"}
    assert not (tmp_path / "store").exists()
    secret = StoreChoice("rediss+cluster://:s3cret@redis-cluster:6379", named=True)
    state = store_state(secret)
    assert state["url"] == "rediss+cluster://:***@redis-cluster:6379"
    assert state["password_left_out"] and state["dir"] is None and not state["started_by_serve"]
    assert "s3cret" not in store_line(secret)


@pytest.mark.parametrize(
    "argv, why",
    [
        (["--redis", "redis://h:1/0", "--store-dir", "x"], "--store-dir: options of the store"),
        (["--redis", "redis://h:1/0", "--ephemeral-store"], "--ephemeral-store: options of"),
        (["--ephemeral-store", "--store-fsync", "always"], "takes no --store-dir or --store-fsync"),
        (["--store-fsync", "sometimes"], "invalid choice: 'sometimes'"),
    ],
)
def test_serve_refuses_store_options_that_contradict(argv, why, capsys, monkeypatch):
    from phoenix.ops import serve

    monkeypatch.delenv("PHOENIX_USER_STATE_URL", raising=False)
    with pytest.raises(SystemExit) as refused:
        serve.main(argv)
    assert refused.value.code == 2
    assert why in capsys.readouterr().err


def test_serve_store_options_with_the_url_from_the_environment_are_refused(capsys, monkeypatch):
    from phoenix.ops import serve

    monkeypatch.setenv("PHOENIX_USER_STATE_URL", "redis://h:1/0")
    with pytest.raises(SystemExit) as refused:
        serve.main(["--store-port", "8004"])
    assert refused.value.code == 2
    assert "$PHOENIX_USER_STATE_URL) names another store" in capsys.readouterr().err
