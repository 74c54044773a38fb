"""loadtest/grpc_pool.py: a Locust user's gRPC client is closed on a pool thread, and a close
that blocks holds the user for a bounded time only."""

from __future__ import annotations

import threading
import time

from loadtest.grpc_pool import close_client, threads_for


class Client:
    def __init__(self, blocks: threading.Event | None = None):
        self.blocks = blocks
        self.closed_on: int | None = None

    def close(self) -> None:
        self.closed_on = threading.get_ident()
        if self.blocks is not None:
            self.blocks.wait(30)


def test_the_close_runs_on_another_thread_and_is_waited_for():
    client = Client()
    assert close_client(client) is True
    assert client.closed_on is not None and client.closed_on != threading.get_ident()


def test_a_close_that_blocks_is_left_after_the_timeout(capsys):
    release = threading.Event()
    client = Client(blocks=release)
    started = time.monotonic()
    try:
        assert close_client(client, timeout_s=0.2) is False
        waited = time.monotonic() - started
    finally:
        release.set()
    assert 0.2 <= waited < 10, waited  # not the 30 s the close would block
    assert "did not close within 0.2 s" in capsys.readouterr().err


def test_a_close_queued_behind_busy_threads_is_bounded_too():
    """Locust's stop can leave every pool thread in a call: the bound covers getting a thread."""
    import gevent

    pool = gevent.get_hub().threadpool
    size = pool.maxsize
    pool.maxsize = 1
    release = threading.Event()
    try:
        busy = pool.spawn(release.wait, 30)
        started = time.monotonic()
        assert close_client(Client(), timeout_s=0.2) is False
        waited = time.monotonic() - started
    finally:
        release.set()
        busy.get()
        pool.maxsize = size
    assert waited < 10, waited


def test_the_pool_holds_a_call_and_a_close_per_user():
    assert threads_for(4) == 10  # never fewer than 10
    assert threads_for(64) == 128
