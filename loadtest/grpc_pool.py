"""Closing a tritonclient gRPC client from a Locust (gevent) user.

grpcio blocks gevent's loop, so the users' calls run on gevent's thread pool
(loadtest/locustfile.py, loadtest/reacting.py). Closing the channel takes a lock that grpcio's
threads share, and under gevent's patched locks the closing greenlet can miss the wake-up when
another thread releases it: the user's ``on_stop`` then never returned, and Locust's stop, which
waits for every user, hung until the runner's limit (about one run in twenty whose gRPC users
all failed). So the close runs on a pool thread too, and the user waits for it a bounded time.
"""

from __future__ import annotations

import sys

import gevent

CLOSE_TIMEOUT_S = 5.0


def close_client(client, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """``client.close()`` on gevent's thread pool, waiting at most ``timeout_s``; whether it
    finished (a close still blocked is left to its thread: the process ends without it)."""
    try:
        gevent.get_hub().threadpool.spawn(client.close).get(timeout=timeout_s)
    except gevent.Timeout:
        print(f"warning: a gRPC client did not close within {timeout_s:g} s", file=sys.stderr)
        return False
    return True
