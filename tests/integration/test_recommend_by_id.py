"""``recommend`` by user id against a real tritonserver and a real redis-server: the history
comes from the user-state store, served posts are not recommended again, an unknown user is
served, and a store that is down fails by-id requests fast while requests carrying their own
history are still served."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest

from phoenix.checkpoint import load_config, load_corpus
from phoenix.serving.client import connect, infer
from phoenix.serving.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import Engagement, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.server import RedisServer
from tests.integration.conftest import MODEL_REPOSITORY, launch_server
from tests.rankings import assert_same_ranking_up_to_ties

USER = 7
TOP_K = 32
FAIL_FAST_S = 5.0  # the store client's bounded timeouts (about 2 s) plus the ensemble's hops


@pytest.fixture(scope="module")
def redis_server():
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(tiny_artifacts, redis_server, tmp_path_factory):
    log = tmp_path_factory.mktemp("triton-by-id") / "tritonserver.log"
    triton = launch_server(
        MODEL_REPOSITORY,
        tiny_artifacts,
        log_path=log,
        exit_timeout_secs=5,
        env={USER_STATE_URL_ENV: redis_server.url},
    )
    yield triton
    triton.stop()


@pytest.fixture(scope="module")
def client(server):
    return connect(server.http_url)


@pytest.fixture(scope="module")
def seq_len(tiny_artifacts) -> int:
    return load_config(tiny_artifacts).history_seq_len


@pytest.fixture(scope="module")
def corpus(tiny_artifacts):
    return load_corpus(tiny_artifacts, load_config(tiny_artifacts))


def user_events(corpus, user: int = USER, count: int = 12) -> list[Engagement]:
    """Positive engagements with corpus posts (so the ranking and retrieval histories agree
    and the retriever has posts to exclude), one a minute up to a minute ago."""
    now = time.time()
    return [
        Engagement.of(
            user,
            int(corpus.post_ids[i]),
            int(corpus.author_ids[i]),
            now - 60 * (count - i),
            ["favorite"] if i % 2 else ["reply", "dwell"],
            surface=i % 2,
            dwell_seconds=float(i % 5),
        )  # fmt: skip
        for i in range(count)
    ]


def load_user(url: str, corpus) -> UserStateStore:
    store = UserStateStore(connect_store(url))
    store.apply(user_events(corpus))
    return store


def by_id(user: int = USER) -> dict:
    return {"user_id": np.array([[user]], np.int64), "top_k": np.array([[TOP_K]], np.int32)}


def with_history(store: UserStateStore, seq_len: int, user: int = USER) -> dict:
    """The request carrying the history the store holds for ``user``."""
    (state,) = store.histories([user], time.time(), seq_len)
    arrays = {name: array[None] for name, array in state.ranking.inputs().items()}
    return {**by_id(user), **arrays}


def recommend(client, arrays: dict) -> dict:
    return infer(client, "http", "recommend", arrays)


def test_by_id_equals_the_explicit_history_and_skips_history_posts(
    client, redis_server, corpus, seq_len
):
    store = load_user(redis_server.url, corpus)
    by_user = recommend(client, by_id())
    explicit = recommend(client, with_history(store, seq_len))
    assert by_user["ranked_post_ids"].shape[1] > 0
    assert_same_ranking_up_to_ties(
        by_user["ranked_post_ids"][0],
        by_user["scores"][0],
        explicit["ranked_post_ids"][0],
        explicit["scores"][0],
        tol=1e-5,
    )
    history = {e.post_id for e in user_events(corpus)}
    assert not history & set(by_user["ranked_post_ids"][0].tolist())


def test_an_unknown_user_is_served(client):
    out = recommend(client, by_id(987_654))
    assert out["ranked_post_ids"].shape[1] > 0


def test_posts_marked_served_are_not_recommended(client, redis_server, corpus):
    store = load_user(redis_server.url, corpus)
    before = recommend(client, by_id())["ranked_post_ids"][0].tolist()
    served = before[:5]
    store.mark_served(USER, served, time.time())
    after = recommend(client, by_id())["ranked_post_ids"][0].tolist()
    assert len(after) > 0 and not set(served) & set(after)


def test_store_down_fails_by_id_fast_serves_history_then_recovers(
    client, redis_server, corpus, seq_len
):
    explicit = with_history(load_user(redis_server.url, corpus), seq_len)
    port = redis_server.port
    redis_server.stop()
    try:
        started = time.monotonic()
        with pytest.raises(Exception, match=f"127.0.0.1:{port}") as refused:
            recommend(client, by_id())
        took = time.monotonic() - started
        assert "user state store" in str(refused.value)
        assert took < FAIL_FAST_S, f"a down store took {took:.1f} s to fail the request"
        assert recommend(client, explicit)["ranked_post_ids"].shape[1] > 0
    finally:
        redis_server.requested_port = port
        redis_server.start()  # same port, empty: no persistence
    load_user(redis_server.url, corpus)
    assert recommend(client, by_id())["ranked_post_ids"].shape[1] > 0


def test_phoenix_recommend_by_user_id_sends_only_the_id_and_says_the_history_read(
    server, redis_server, corpus, tiny_artifacts, seq_len, capsys
):
    """`phoenix-recommend --user-id`: the feed by id through the real server, its title
    naming the history items the server read from the store, the history posts left out."""
    from clients import recommend as recommend_cli

    load_user(redis_server.url, corpus)
    argv = ["--user-id", str(USER), "--top-k", "20", "--url", server.http_url.split("://")[-1],
            "--artifacts", str(tiny_artifacts), "--rows", "20"]  # fmt: skip
    assert recommend_cli.main(argv) == 0
    out = capsys.readouterr().out
    items = min(12, seq_len)
    assert f"Feed for user {USER} by id ({items} history items read by the server" in out
    shown = {int(p) for p in re.findall(r"^\s*\d+\s+(\d+)\s", out, re.M)}
    assert shown, out
    assert not shown & {e.post_id for e in user_events(corpus)}
    # an unknown user: read from the store too, with nothing in it
    assert recommend_cli.main([*argv[:1], "123456", *argv[2:]]) == 0
    assert "by id (0 history items read by the server" in capsys.readouterr().out
