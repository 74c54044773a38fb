"""The Redis client of the user state: bounded timeouts, and errors that name the store.

``connect(url)`` gives a ``redis.Redis`` for a server's URL (``redis://``, ``rediss://`` with
TLS, ``unix://``) or a ``redis.cluster.RedisCluster`` for a cluster's (``redis+cluster://`` or
``rediss+cluster://`` and any one node, or a Service in front of them all: the client learns
the others from it). The scheme says which, so one string names the store everywhere
(serve's --redis, the models' ``user_state_url``, a Kubernetes Secret, phoenix-events); there
is no standard cluster URL, and ``+cluster`` follows the ``redis+sentinel://`` form some
clients use. ``cluster=True`` still makes a plain URL a cluster's. Connecting and every
command are bounded by ``CONNECT_TIMEOUT_S`` / ``SOCKET_TIMEOUT_S`` with one quick retry, so a
down or unreachable store raises ``UserStateUnavailable`` naming its URL within a few seconds
instead of hanging a request.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import NamedTuple, Union
from urllib.parse import urlsplit

import hiredis
import redis
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, RedisClusterException
from redis.retry import Retry

CONNECT_TIMEOUT_S = 0.5  # a Redis on the same network connects in well under a millisecond
SOCKET_TIMEOUT_S = 1.0  # a pipelined batch read takes milliseconds (docs/user-state.md)
RETRIES = 1  # one retry: a dropped idle connection is re-opened, a down server fails fast

Client = Union[redis.Redis, RedisCluster, "ClusterOnFirstUse"]


class UserStateError(RuntimeError):
    """A user-state operation failed (the message names the store)."""


class UserStateUnavailable(UserStateError):
    """The store could not be reached or did not answer in time."""


# The cluster schemes, and the server scheme redis-py reads for each.
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SERVER_SCHEMES = ("redis", "rediss", "unix")
URL_FORMS = (
    "redis://[:password@]host:port[/db] (one server; rediss:// with TLS), unix:///path.sock, or "
    "redis+cluster://[:password@]host:port (any node of a Redis Cluster; rediss+cluster:// "
    "with TLS)"
)


class StoreUrl(NamedTuple):
    """A store's URL read once: whether it names a cluster, and the URL redis-py reads."""

    url: str  # as given: what error messages name
    cluster: bool
    redis_url: str  # the server form (redis://, rediss://, unix://) of the same address


def parse_url(url: str, *, cluster: bool = False) -> StoreUrl:
    """``url`` read as a store's URL; ValueError naming the accepted forms when it is not one.
    A cluster URL names one node (the client discovers the rest), and a cluster has no db."""
    scheme = urlsplit(url).scheme.lower()
    if scheme in CLUSTER_SCHEMES:
        redis_url = CLUSTER_SCHEMES[scheme] + url[len(scheme) :]
        parts = urlsplit(redis_url)
        if not parts.hostname or "," in parts.netloc:
            raise ValueError(
                f"{url!r}: a cluster URL names one node as host:port, not {parts.netloc!r}"
            )
        if parts.path.strip("/") not in ("", "0"):
            raise ValueError(f"{url!r}: a Redis Cluster has database 0 only")
        return StoreUrl(url, True, redis_url)
    if scheme not in SERVER_SCHEMES:
        raise ValueError(f"{url!r} is not a Redis URL: expected {URL_FORMS}")
    if scheme != "unix" and not urlsplit(url).hostname:
        raise ValueError(f"{url!r} names no host: expected {URL_FORMS}")
    return StoreUrl(url, cluster, url)


def without_password(url: str) -> str:
    """``url`` with its password, if any, shown as ``***`` (for logs, banners, state files)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:" if parts.username else ":"
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}***@{host}").geturl()


def url_argument(text: str) -> str:
    """``text`` as a command line's store URL: unchanged, or the argparse error saying why not."""
    try:
        parse_url(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _retry() -> Retry:
    return Retry(ExponentialBackoff(cap=0.1, base=0.02), RETRIES)


def connect(
    url: str,
    *,
    cluster: bool = False,
    lazy: bool = False,
    connect_timeout_s: float = CONNECT_TIMEOUT_S,
    socket_timeout_s: float = SOCKET_TIMEOUT_S,
) -> Client:
    """A client of the store at ``url`` (``URL_FORMS``; ValueError for another). A server's
    client connects on its first command; a cluster's connects at once and raises
    UserStateUnavailable naming ``url`` if no node answers, unless ``lazy`` (a served model,
    which must load while the store is down): then on its first command, again until it
    succeeds."""
    store = parse_url(url, cluster=cluster)
    if store.cluster and lazy:
        return ClusterOnFirstUse(
            store.url, connect_timeout_s=connect_timeout_s, socket_timeout_s=socket_timeout_s
        )
    options = dict(
        socket_connect_timeout=connect_timeout_s,
        socket_timeout=socket_timeout_s,
        retry=_retry(),
    )
    if not store.cluster:
        return redis.Redis.from_url(store.redis_url, **options)
    try:
        return RedisCluster.from_url(store.redis_url, **options)
    except (RedisClusterException, redis.RedisError) as error:
        raise UserStateUnavailable(f"user state cluster {url} is unreachable: {error}") from error


class ClusterOnFirstUse:
    """A Redis Cluster client made on its first command, and on every command after a failed
    attempt; meanwhile each command raises UserStateUnavailable naming the cluster."""

    def __init__(self, url: str, **options):
        self.url = url
        self.options = options
        self.made: Client | None = None

    def client(self) -> Client:
        if self.made is None:
            self.made = connect(self.url, **self.options)
        return self.made

    def __getattr__(self, name: str):
        return getattr(self.client(), name)


Command = tuple  # a command's words as Redis reads them: ("ZRANGE", key, 0, -1)
RECV_BYTES = 1 << 18  # a read of a batch's replies: up to eight users' 64 KB of served posts


def read_pipelined(client: Client, commands: Sequence[Command]) -> list:
    """The replies of read-only ``commands``, sent in one round trip; redis-py's errors.

    A server's are written and read on a connection of its client's pool, the replies parsed
    by hiredis as they arrive: a round trip of four reads (two histories, 64 KB of served
    posts, follows) took 70-78 us of client CPU against redis-py's pipeline's 107-133 (4
    alternating passes of 3,000 on this machine; docs/user-state.md, "Reads are batched, and
    packed by hand"). A reply is taken as it comes (no redis-py callback): a sorted set's
    members as a list of bytes, a string as bytes. The commands must not answer a RESP3
    boolean, which hiredis's "no reply yet" (False) would hide. The pool re-opens a connection
    the server dropped while idle as it lends it (redis-py checks it for unread data). A
    cluster's reads go through its pipeline, which routes each to its slot's node."""
    if not isinstance(client, redis.Redis):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return pipe.execute()
    packed = b"".join(hiredis.pack_command(command) for command in commands)
    return _round_trip(client.connection_pool, packed, len(commands))


def _round_trip(pool: redis.ConnectionPool, packed: bytes, count: int) -> list:
    """Send ``packed`` on a pooled connection and read ``count`` replies. A connection that
    failed midway is closed (the pool opens a new one), never lent again half read: after a
    timeout the late replies would arrive after the next caller's commands went out, and be
    taken for their answers."""
    connection = pool.get_connection()
    try:
        connection.send_packed_command([packed])  # connects first when needed
        return _replies(connection, count)
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


def _replies(connection, count: int) -> list:
    reader = hiredis.Reader()
    replies: list = []
    while len(replies) < count:
        reply = reader.gets()
        if reply is False:
            reader.feed(_received(connection))
        elif isinstance(reply, hiredis.ReplyError):
            raise redis.ResponseError(str(reply))
        else:
            replies.append(reply)
    return replies


def _received(connection) -> bytes:
    """The next bytes from ``connection``'s socket (bounded by its socket timeout)."""
    try:
        data = connection._sock.recv(RECV_BYTES)  # redis==8.1.0's connected socket
    except TimeoutError as error:  # socket.timeout
        raise redis.TimeoutError(f"Timeout reading from {_where(connection)}") from error
    except OSError as error:
        raise redis.ConnectionError(f"Error reading from {_where(connection)}: {error}") from error
    if not data:
        raise redis.ConnectionError(f"Connection closed by server ({_where(connection)})")
    return data


def _where(connection) -> str:
    """host:port of a TCP connection, else "socket" (a Unix socket's)."""
    return f"{connection.host}:{connection.port}" if hasattr(connection, "port") else "socket"


def describe(client: Client) -> str:
    """A URL naming where ``client`` points, for error messages."""
    if isinstance(client, ClusterOnFirstUse):
        return client.url
    if isinstance(client, RedisCluster):
        nodes = ",".join(f"{n.host}:{n.port}" for n in client.get_nodes()[:3])
        return f"redis+cluster://{nodes}"
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
