"""The Redis client of the user state: bounded timeouts, and errors that name the store.

``connect(url)`` gives a ``redis.Redis`` (one server) or, with ``cluster=True``, a
``redis.cluster.RedisCluster`` (any node of the cluster as the URL). Connecting and every
command are bounded by ``CONNECT_TIMEOUT_S`` / ``SOCKET_TIMEOUT_S`` with one quick retry, so a
down or unreachable store raises ``UserStateUnavailable`` naming its URL within a few seconds
instead of hanging a request.
"""

from __future__ import annotations

from typing import Union

import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, RedisClusterException
from redis.retry import Retry

CONNECT_TIMEOUT_S = 0.5  # a Redis on the same network connects in well under a millisecond
SOCKET_TIMEOUT_S = 1.0  # a pipelined batch read takes milliseconds (docs/user-state.md)
RETRIES = 1  # one retry: a dropped idle connection is re-opened, a down server fails fast

Client = Union[redis.Redis, RedisCluster]


class UserStateError(RuntimeError):
    """A user-state operation failed (the message names the store)."""


class UserStateUnavailable(UserStateError):
    """The store could not be reached or did not answer in time."""


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.1, base=0.02), RETRIES)


def connect(
    url: str,
    *,
    cluster: bool = False,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
) -> Client:
    """A client of the store at ``url`` (redis://host:port[/db]); a cluster client connects at
    once and raises UserStateUnavailable naming ``url`` if no node answers."""
    options = dict(
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        retry=_retry(),
    )
    if not cluster:
        return redis.Redis.from_url(url, **options)
    try:
        return RedisCluster.from_url(url, **options)
    except (RedisClusterException, redis.RedisError) as error:
        raise UserStateUnavailable(f"user state cluster {url} is unreachable: {error}") from error


def describe(client: Client) -> str:
    """A URL naming where ``client`` points, for error messages."""
    if isinstance(client, RedisCluster):
        nodes = ",".join(f"{n.host}:{n.port}" for n in client.get_nodes()[:3])
        return f"redis-cluster://{nodes}"
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}"
    host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
    return f"redis://{host}:{port}/{kwargs.get('db', 0)}"


def unavailable_or_failed(store: str, what: str, error: Exception) -> UserStateError:
    """The error to raise for a RedisError of ``what`` against ``store``."""
    lost = (redis.ConnectionError, redis.TimeoutError, RedisClusterException, ClusterDownError)
    if isinstance(error, lost):
        return UserStateUnavailable(f"user state store {store} unavailable during {what}: {error}")
    return UserStateError(f"user state store {store}: {what} failed: {error}")
