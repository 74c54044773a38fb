"""phoenix.user_state.client.read_pipelined against a real redis-server: the same replies as
redis-py's own pipeline, replies larger than one socket read, an error reply, a timeout whose
late replies must not answer the next read, a server restarted between reads and a server
that is gone (fails at once), and a cluster's reads."""

import time

import pytest
import redis

from phoenix.user_state import connect
from phoenix.user_state.client import RECV_BYTES, read_pipelined
from phoenix.user_state.server import RedisClusterNodes, RedisServer

COMMANDS = [
    ("ZRANGE", "u:{1}:seq", 100.5, 0, "BYSCORE", "REV", "LIMIT", 0, 3),
    ("ZRANGE", "u:{1}:seq", 100, 0, "BYSCORE", "REV", "LIMIT", 0, 2, "WITHSCORES"),
    ("GETRANGE", "u:{1}:served", -32, -1),
    ("GETRANGE", "no-such-key", -32, -1),
    ("ZRANGE", "no-such-key", 0, -1, "REV"),
]
EXPECTED = [
    [b"c", b"b", b"a"],
    [[b"c", 3.0], [b"b", 2.5]],
    bytes(range(224, 256)),
    b"",
    [],
]


def filled(url: str) -> redis.Redis:
    client = connect(url)
    client.zadd("u:{1}:seq", {b"a": 1.0, b"b": 2.5, b"c": 3.0, b"d": 200.0})
    client.set("u:{1}:served", bytes(range(256)) * 4)
    return client


def pipeline_replies(client: redis.Redis, commands) -> list:
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return pipe.execute()


def test_the_replies_are_redis_pys_own(redis_server):
    client = filled(redis_server.url)
    replies = read_pipelined(client, COMMANDS)
    assert replies == pipeline_replies(client, COMMANDS) == EXPECTED


def test_replies_longer_than_one_socket_read(redis_server):
    client = connect(redis_server.url)
    values = [bytes([i]) * (RECV_BYTES + 1000 * i) for i in range(1, 4)]
    for i, value in enumerate(values):
        client.set(f"big{i}", value)
    commands = [("GETRANGE", f"big{i}", 0, -1) for i in range(3)] * 2
    assert read_pipelined(client, commands) == values * 2


def test_an_error_reply_raises_and_the_next_read_is_answered(redis_server):
    client = filled(redis_server.url)
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        read_pipelined(client, [COMMANDS[0], ("GETRANGE", "u:{1}:seq", 0, -1), COMMANDS[2]])
    assert read_pipelined(client, COMMANDS[:1]) == [[b"c", b"b", b"a"]]


def test_late_replies_after_a_timeout_never_answer_the_next_read():
    """A read that timed out closes its connection: the next read, on a new one, gets its
    own reply and not the late "OK" of the first."""
    with RedisServer(extra_args=("--enable-debug-command", "yes")) as server:
        client = connect(server.url, socket_timeout_s=0.3)
        client.set("k", b"value")
        with pytest.raises(redis.TimeoutError):
            read_pipelined(client, [("DEBUG", "SLEEP", "0.4"), ("GETRANGE", "k", 0, -1)])
        assert read_pipelined(client, [("GETRANGE", "k", 0, 2)]) == [b"val"]


def test_a_restarted_server_is_read_again_without_an_error():
    """The pooled connection died with the old server: the pool lends a new one."""
    with RedisServer() as server:
        client = filled(server.url)
        assert read_pipelined(client, COMMANDS[:1]) == [[b"c", b"b", b"a"]]
        port = server.port
    with RedisServer(port=port) as again:
        filled(again.url)
        assert read_pipelined(client, COMMANDS[:1]) == [[b"c", b"b", b"a"]]


def test_a_server_that_is_gone_fails_at_once():
    with RedisServer() as server:
        client = filled(server.url)
        read_pipelined(client, COMMANDS[:1])
    started = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        read_pipelined(client, COMMANDS)
    assert time.monotonic() - started < 1.0  # refused, not waited for


def test_a_clusters_reads_go_through_its_pipeline():
    with RedisClusterNodes() as cluster:
        client = connect(cluster.url, cluster=True)
        client.zadd("u:{1}:seq", {b"a": 1.0, b"b": 2.5, b"c": 3.0, b"d": 200.0})
        client.set("u:{1}:served", bytes(range(256)) * 4)
        assert read_pipelined(client, COMMANDS) == EXPECTED
