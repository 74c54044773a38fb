"""Closing a tritonclient gRPC client from a Locust (gevent) user.

grpcio blocks gevent's loop, so the users' calls run on gevent's thread pool
(loadtest/locustfile.py, loadtest/reacting.py). Closing the channel takes a lock that grpcio's
threads share, and under gevent's patched locks the closing greenlet can miss the wake-up when
another thread releases it: the user's ``on_stop`` then never returned, and Locust's stop, which
waits for every user, hung until the runner's limit (about one run in ten whose gRPC users all
failed). So the close runs on a pool thread too, and the user waits for it a bounded time,
a free pool thread included: the pool holds two threads a user (``threads_for``), one for a call
that Locust's stop may have left running and one for the close.
"""

from __future__ import annotations

import sys

import gevent

CLOSE_TIMEOUT_S = 5.0


def threads_for(users: int) -> int:
    """Threads for ``users`` gRPC users: a call and a close each (10 at least)."""
    return max(10, 2 * int(users))


def close_client(client, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """``client.close()`` on gevent's thread pool, waiting at most ``timeout_s`` for a thread
    and the close together; whether it finished (a close still queued or blocked is left to
    the pool: the process ends without it)."""
    timer = gevent.Timeout(timeout_s)
    timer.start()
    try:
        gevent.get_hub().threadpool.spawn(client.close).get()
    except gevent.Timeout as expired:
        if expired is not timer:  # another's deadline: not ours to swallow
            raise
        print(f"warning: a gRPC client did not close within {timeout_s:g} s", file=sys.stderr)
        return False
    finally:
        timer.close()
    return True
