"""``recommend`` by user id against a real tritonserver whose store is a real three-node Redis
Cluster, named by its ``redis+cluster://`` URL alone: the feed by id equals the feed with the
history the cluster holds sent explicitly, a followed author's new post kept on another node
than the follower's keys is in the feed, and the served_log step's writes land on the cluster
(the next feed shows none of the served posts; the request log holds the feed under its
request id). One server start for the module."""

from __future__ import annotations

import time

import numpy as np
import pytest

from phoenix.checkpoint import load_config, load_corpus
from phoenix.client.client import connect, infer
from phoenix.user_state import Engagement, Follow, Post, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.keys import SEQUENCE, author_posts_key, user_key
from phoenix.user_state.request_log import read_request_log
from phoenix.user_state.server import RedisClusterNodes
from tests.integration.conftest import launch_with_store
from tests.rankings import assert_same_feed

USER = 21
TOP_K = 24
NEW_POST = 10**15 + 7  # in no corpus: a post made a moment ago


@pytest.fixture(scope="module")
def cluster():
    with RedisClusterNodes(3) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def server(tiny_artifacts, cluster, tmp_path_factory):
    assert cluster.url.startswith("redis+cluster://")  # the URL alone says cluster
    # recommend alone (its ensemble loads the chain): the tests call nothing else
    options = {"model_control_mode": "explicit", "load_model": ["recommend"]}
    triton = launch_with_store(
        tiny_artifacts, cluster.url, tmp_path_factory.mktemp("triton"), **options
    )
    yield triton
    triton.kill()  # not a stop under test: conftest, "killed"


@pytest.fixture(scope="module")
def store(cluster) -> UserStateStore:
    return UserStateStore(connect_store(cluster.url))


def engagements(corpus, count: int = 10) -> list[Engagement]:
    now = time.time()
    return [
        Engagement.of(USER, int(corpus.post_ids[i]), int(corpus.author_ids[i]),
                      now - 60 * (count - i), ["favorite", "dwell"], dwell_seconds=float(i))
        for i in range(count)
    ]  # fmt: skip


def author_on_another_node(client) -> int:
    """An author whose posts live on another node than USER's keys (the second read of the
    in-network source crosses nodes)."""
    users_node = client.get_node_from_key(user_key(USER, SEQUENCE)).name
    return next(a for a in range(900_000, 900_100)
                if client.get_node_from_key(author_posts_key(a)).name != users_node)  # fmt: skip


def by_id(**more) -> dict:
    return {"user_id": np.array([[USER]], np.int64), "top_k": np.array([[TOP_K]], np.int32),
            **more}  # fmt: skip


def test_by_id_on_a_cluster_equals_the_explicit_history_and_its_writes_land(
    server, store, tiny_artifacts
):
    corpus = load_corpus(tiny_artifacts, load_config(tiny_artifacts))
    seq_len = load_config(tiny_artifacts).history_seq_len
    store.apply(engagements(corpus))
    client = connect(server.http_url)
    [held] = store.histories([USER], time.time(), seq_len)
    explicit = {name: array[None] for name, array in held.ranking.inputs().items()}
    with_history = infer(client, "http", "recommend", by_id(**explicit))  # marks nothing served

    first = infer(client, "http", "recommend", by_id())
    feed = first["ranked_post_ids"][0].tolist()
    assert len(feed) > 0
    assert_same_feed(first, with_history, 1e-5)
    assert not {e.post_id for e in engagements(corpus)} & set(feed)

    [served] = store.served([USER], time.time())  # served_log wrote to the user's node
    assert set(feed) <= set(served.tolist())
    second = infer(client, "http", "recommend", by_id())["ranked_post_ids"][0].tolist()
    assert len(second) > 0 and not set(feed) & set(second)
    request_id = int(first["request_id"][0, 0])
    logged = {r.request_id: r for _, r in read_request_log(store.client)}
    assert logged[request_id].ranked_post_ids.tolist() == feed
    assert logged[request_id].user_id == USER and not logged[request_id].own_history

    author = author_on_another_node(store.client)
    store.apply([Follow(USER, author, time.time() - 3600), Post(NEW_POST, author, time.time())])
    third = infer(client, "http", "recommend", by_id())
    posts = third["ranked_post_ids"][0].tolist()
    assert NEW_POST in posts and third["in_network"][0, posts.index(NEW_POST)] == 1
