"""One store URL names a server or a cluster (phoenix.user_state.client): the forms read,
the ones refused, and a cluster client a served model can make while the cluster is down."""

import re
import time

import pytest
import redis

from phoenix.ops.triton_server import pick_free_ports
from phoenix.user_state import UserStateStore, UserStateUnavailable, connect
from phoenix.user_state.client import ClusterOnFirstUse, describe, parse_url


@pytest.mark.parametrize(
    "url, cluster, redis_url",
    [
        ("redis://h:1/0", False, "redis://h:1/0"),
        ("rediss://:secret@h:1/2", False, "rediss://:secret@h:1/2"),
        ("unix:///run/redis.sock", False, "unix:///run/redis.sock"),
        ("redis+cluster://h:7000", True, "redis://h:7000"),
        ("redis+cluster://user:pw@h:7000/0", True, "redis://user:pw@h:7000/0"),
        ("rediss+cluster://h:7000", True, "rediss://h:7000"),
        ("REDIS+CLUSTER://h:7000", True, "redis://h:7000"),
    ],
)
def test_the_scheme_says_server_or_cluster(url, cluster, redis_url):
    assert parse_url(url) == (url, cluster, redis_url)


def test_the_cluster_flag_still_makes_a_plain_url_a_clusters():
    assert parse_url("redis://h:7000", cluster=True).cluster is True


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://h:1", "is not a Redis URL: expected redis://"),
        ("h:6379", "is not a Redis URL"),
        ("redis://", "names no host"),
        ("redis+cluster://h:1/3", "database 0 only"),
        ("redis+cluster://h:1,g:2", "names one node"),
        ("redis+cluster:///path", "names one node"),
    ],
)
def test_other_urls_are_refused_saying_what_is_expected(url, why):
    with pytest.raises(ValueError, match=why):
        parse_url(url)
    with pytest.raises(ValueError, match=why):
        connect(url)


def test_a_server_url_gives_a_server_client(redis_server):
    client = connect(redis_server.url)
    assert isinstance(client, redis.Redis) and client.ping()


def test_a_lazy_cluster_client_fails_each_call_naming_the_cluster_while_it_is_down():
    """A model loads with the cluster down (nothing is raised), and each command meanwhile
    fails fast naming the cluster; connecting at once raises the same error."""
    (port,) = pick_free_ports(1)
    url = f"redis+cluster://127.0.0.1:{port}"
    client = connect(url, lazy=True)
    assert isinstance(client, ClusterOnFirstUse) and describe(client) == url
    store = UserStateStore(client, name=url)
    for _ in range(2):  # not a remembered failure: it tries again
        started = time.monotonic()
        with pytest.raises(UserStateUnavailable, match=f"127.0.0.1:{port}"):
            store.ping()
        assert time.monotonic() - started < 3.0
    assert client.made is None
    with pytest.raises(UserStateUnavailable, match=re.escape(f"cluster {url}")):
        connect(url)
