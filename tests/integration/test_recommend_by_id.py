"""``recommend`` by user id against a real tritonserver and a real redis-server: the history
comes from the user-state store, served posts are not recommended again (those marked in the
store, and those the server itself served: 20 requests in a row over HTTP and gRPC never repeat
a post, seen_post_ids still filtering beside it), every feed is in the request log under the
request id it returned, a user's next pages and the ranker alone find the user's prefix in the
prefix cache and an engagement makes the next page compute it, an unknown user is served, a
followed author's new post is in the follower's feed (flagged in-network, moved by the policy's
out_of_network_factor), a store that is down fails by-id requests fast while requests carrying
their own history are still served, and a poison event given to `phoenix-events apply` as a
user types it is refused by FILE:LINE, leaving the user's history as it was and their next feed
answered; the README's call example does what it says."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from phoenix.checkpoint import load_config, load_corpus
from phoenix.client.client import connect, infer
from phoenix.feed_policy import in_network_share
from phoenix.ops.profiles import CPU
from phoenix.ops.reload import reload_with_chains
from phoenix.schema.contracts import FEED_POLICY, RANKER, USER_STATE
from phoenix.stub.request_metrics import CACHE_HITS, CACHE_MISSES, METRICS_INTERVAL_ENV
from phoenix.user_state import Engagement, Follow, Post, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.user_state.request_log import read_request_log
from tests.deploy_checks import sample
from tests.integration.conftest import launch_with_store
from tests.rankings import assert_same_feed
from tests.readme_samples import fenced_lines, readme_block

pytestmark = pytest.mark.integration
USER = 7
TOP_K = 32
FAIL_FAST_S = 5.0  # the store client's bounded timeouts (about 2 s) plus the ensemble's hops
README_URL, README_USER = "127.0.0.1:8000", 42  # what the README's call example names


@pytest.fixture(scope="module")
def server(tiny_artifacts, redis_server, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("triton-by-id")
    # explicit model control: the feed policy is loaded again with other factors
    options = {"model_control_mode": "explicit", "load_model": "*"}
    env = {METRICS_INTERVAL_ENV: "0"}  # counts on /metrics after every batch: exact deltas
    triton = launch_with_store(tiny_artifacts, redis_server.url, log_dir, env, **options)
    yield triton
    triton.kill()  # not a stop under test: conftest, "killed"


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


def load_user(url: str, corpus, user: int = USER) -> UserStateStore:
    store = UserStateStore(connect_store(url))
    store.apply(user_events(corpus, user))
    return store


def by_id(user: int = USER) -> dict:
    return {"user_id": np.array([[user]], np.int64), "top_k": np.array([[TOP_K]], np.int32)}


def with_history(store: UserStateStore, seq_len: int, user: int = USER) -> dict:
    """The request carrying the history the store holds for ``user``."""
    (state,) = store.histories([user], time.time(), seq_len)
    arrays = {name: array[None] for name, array in state.ranking.inputs().items()}
    return {**by_id(user), **arrays}


def recommend(client, arrays: dict, protocol: str = "http") -> dict:
    return infer(client, protocol, "recommend", arrays)


def test_by_id_equals_the_explicit_history_and_skips_history_posts(
    client, redis_server, corpus, seq_len
):
    store = load_user(redis_server.url, corpus)
    by_user = recommend(client, by_id())
    explicit = recommend(client, with_history(store, seq_len))
    assert by_user["ranked_post_ids"].shape[1] > 0
    assert_same_feed(by_user, explicit, 1e-5)
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


def test_the_readmes_call_example_answers_a_feed_and_records_it(server, redis_server, capsys):
    """The README's tritonclient example, run as written against this server (its URL
    replaced): a feed by user id, logged under the request id it prints."""
    code = "\n".join(fenced_lines(readme_block("call-example")))
    assert code.count(README_URL) == 1, "the example names make serve's HTTP URL once"
    namespace: dict = {}
    exec(compile(code.replace(README_URL, server.http_url), "README.md", "exec"), namespace)
    feed = namespace["feed"]
    posts = feed.as_numpy("ranked_post_ids")[0]
    request_id = int(feed.as_numpy("request_id")[0, 0])
    assert len(posts) > 0 and request_id > 0
    assert f"request id {request_id}" in capsys.readouterr().out
    logged = [r for _, r in read_request_log(connect_store(redis_server.url))]
    [entry] = [r for r in logged if r.request_id == request_id]
    assert (entry.user_id, entry.own_history) == (README_USER, False)  # by id, as it says
    assert entry.ranked_post_ids.tolist() == posts.tolist()


def cache_counts(url: str, model: str) -> np.ndarray:
    """(hits, misses) of ``model``'s prefix cache, summed over its instances."""
    return np.array([sample(url, family, model=model) for family in (CACHE_HITS, CACHE_MISSES)])


def test_a_paged_feed_and_the_ranker_hit_the_prefix_cache_and_an_event_makes_a_miss(
    client, server, redis_server, corpus, seq_len
):
    """Three pages of one user's feed by id (each page new posts: the served ones are left
    out): one prefix computed per instance at most, the others found. The ranker alone, the
    user's history sent with other candidates: the same. An engagement changes the history:
    the next page is a miss on any instance."""
    url, user = server.metrics_url, 4_242
    store = load_user(redis_server.url, corpus, user)
    for model in ("recommend_chain", RANKER.name):
        assert CPU.models[model].instances == 2  # at most one miss each below
    before = cache_counts(url, "recommend_chain")
    pages = [recommend(client, by_id(user)) for _ in range(3)]
    posts = [set(page["ranked_post_ids"][0].tolist()) for page in pages]
    assert all(posts) and not posts[0] & posts[1] and not posts[1] & posts[2]
    hits, misses = cache_counts(url, "recommend_chain") - before
    assert hits + misses == 3 and 1 <= misses <= 2, (hits, misses)

    history = with_history(store, seq_len, user)
    before = cache_counts(url, RANKER.name)
    for page in pages:
        arrays = {name: history[name] for name in RANKER.input_names if name in history}
        arrays["candidate_post_ids"] = page["ranked_post_ids"]
        arrays["candidate_author_ids"] = page["ranked_author_ids"]
        ranked = infer(client, "http", RANKER.name, arrays)["ranked_post_ids"]
        assert sorted(ranked[0].tolist()) == sorted(page["ranked_post_ids"][0].tolist())
    hits, misses = cache_counts(url, RANKER.name) - before
    assert hits + misses == 3 and 1 <= misses <= 2, (hits, misses)

    post, author = int(corpus.post_ids[-1]), int(corpus.author_ids[-1])
    store.apply([Engagement.of(user, post, author, time.time(), ["favorite"])])
    before = cache_counts(url, "recommend_chain")
    recommend(client, by_id(user))
    assert (cache_counts(url, "recommend_chain") - before).tolist() == [0, 1]


FOLLOWER, AUTHOR = 11, 555_001
NEW_POST = 10**15 + 1  # in no corpus: a post made a moment ago


def test_a_followed_authors_new_post_is_in_the_followers_feed(client, redis_server):
    store = UserStateStore(connect_store(redis_server.url))
    now = time.time()
    store.apply([Follow(FOLLOWER, AUTHOR, now - 3600)])
    before = recommend(client, by_id(FOLLOWER))
    assert NEW_POST not in before["ranked_post_ids"][0].tolist()
    assert before["in_network"].tolist() == [[0] * before["in_network"].shape[1]]

    store.apply([Post(NEW_POST, AUTHOR, now - 1)])
    feed = recommend(client, by_id(FOLLOWER))
    posts = feed["ranked_post_ids"][0].tolist()
    assert NEW_POST in posts
    where = posts.index(NEW_POST)
    assert feed["in_network"][0, where] == 1 and feed["ranked_author_ids"][0, where] == AUTHOR
    assert feed["in_network"][0].sum() == 1  # no other post is in-network
    assert feed["in_network"].dtype == np.int8
    assert NEW_POST not in recommend(client, by_id(FOLLOWER + 1))["ranked_post_ids"][0].tolist()


def set_factor(client, value: str) -> None:
    reload_with_chains(client, "http", FEED_POLICY.name, {"out_of_network_factor": value}, None)


def test_the_out_of_network_factor_moves_the_in_network_share(client, redis_server):
    # One follower per factor, all following the same authors: a feed marks its posts served
    # (served_log), so one user's second feed would hold none of the in-network posts again.
    followers = {"1": FOLLOWER + 2, "0.3": FOLLOWER + 3, "0": FOLLOWER + 4}
    feed_top = 10
    store = UserStateStore(connect_store(redis_server.url))
    now = time.time()
    authors = [AUTHOR + 10 + a for a in range(8)]
    store.apply([Follow(user, a, now - 3600) for user in followers.values() for a in authors])
    store.apply(
        Post(NEW_POST + 100 + 10 * i + j, a, now - 60 * (10 * i + j))
        for i, a in enumerate(authors)
        for j in range(3)
    )  # 24 in-network posts beside top_k 32 retrieved
    shares = {}
    try:
        for factor in ("1", "0.3", "0"):
            set_factor(client, factor)
            feed = recommend(client, by_id(followers[factor]))
            shares[factor] = in_network_share(feed["in_network"][0, :feed_top])
    finally:
        set_factor(client, FEED_POLICY.parameter("out_of_network_factor").text(
            FEED_POLICY.parameter("out_of_network_factor").default
        ))  # fmt: skip
    assert shares["0"] == 1.0  # every in-network post first
    assert shares["1"] <= shares["0.3"] <= shares["0"]
    assert shares["1"] < 1.0, shares


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
        answered = recommend(client, explicit)  # served_log's write is lost, not the feed
        assert answered["ranked_post_ids"].shape[1] > 0 and answered["request_id"][0, 0] > 0
    finally:
        redis_server.requested_port = port
        redis_server.start()  # same port, empty: no persistence
    load_user(redis_server.url, corpus)
    assert recommend(client, by_id())["ranked_post_ids"].shape[1] > 0


def test_twenty_requests_in_a_row_never_repeat_a_post_and_are_all_logged(
    client, server, redis_server, corpus
):
    """The served posts written back by the served_log step keep every feed of a user new for
    20 consecutive requests (alternating HTTP and gRPC); the request's seen_post_ids still
    filters beside them; each feed is in the request log under its request id."""
    user, top_k = 8, 16  # 20 x 16 posts out of a 500-post corpus
    store = load_user(redis_server.url, corpus)
    store.apply([Engagement.of(user, e.post_id, e.author_id, e.ts, ["favorite"])
                 for e in user_events(corpus)])  # fmt: skip
    grpc = connect(server.grpc_url, "grpc")
    shown: list[int] = []
    request_ids = []
    seen = [int(p) for p in corpus.post_ids[100:400]]  # a third of them seen by the client
    for i in range(20):
        protocol, to = ("http", client) if i % 2 == 0 else ("grpc", grpc)
        arrays = {**by_id(user), "top_k": np.array([[top_k]], np.int32)}
        if i % 4 == 1:
            arrays["seen_post_ids"] = np.array([seen], np.int64)
        out = recommend(to, arrays, protocol)
        feed = out["ranked_post_ids"][0].tolist()
        assert len(feed) > 0, f"request {i}: empty feed"
        assert not set(feed) & set(shown), f"request {i} repeats {set(feed) & set(shown)}"
        if "seen_post_ids" in arrays:
            assert not set(feed) & set(seen), f"request {i} shows seen posts"
        shown += feed
        request_ids.append(int(out["request_id"][0, 0]))
    assert len(set(request_ids)) == 20 and min(request_ids) > 0

    logged = {r.request_id: r for _, r in read_request_log(connect_store(redis_server.url))}
    feeds = [logged[i] for i in request_ids]  # every request, under the id it returned
    assert [p for r in feeds for p in r.ranked_post_ids.tolist()] == shown
    assert all(r.user_id == user and not r.own_history for r in feeds)
    assert all(len(r.candidate_post_ids) >= len(r.ranked_post_ids) for r in feeds)
    assert all(len(r.history_post_ids) == len(user_events(corpus)) for r in feeds)


def test_phoenix_recommend_by_user_id_sends_only_the_id_and_says_the_history_read(
    server, redis_server, corpus, tiny_artifacts, seq_len, capsys
):
    """`phoenix-recommend --user-id`: the feed by id through the real server, its title
    naming the history items the server read from the store, the history posts left out."""
    from clients import recommend as recommend_cli

    # a user of its own: loading USER again a minute later would interleave two loads' events
    # (times are relative to now), and the newest 12 would no longer be the 12 posts
    user = USER + 100
    load_user(redis_server.url, corpus, user)
    argv = ["--user-id", str(user), "--top-k", "20", "--url", server.http_url.split("://")[-1],
            "--artifacts", str(tiny_artifacts), "--rows", "20"]  # fmt: skip
    assert recommend_cli.main(argv) == 0
    out = capsys.readouterr().out
    items = min(12, seq_len)
    assert f"Feed for user {user} by id ({items} history items read by the server" in out
    shown = {int(p) for p in re.findall(r"^\s*\d+\s+(\d+)\s", out, re.M)}
    assert shown, out
    assert not shown & {e.post_id for e in user_events(corpus, user)}
    # an unknown user: read from the store too, with nothing in it
    assert recommend_cli.main([*argv[:1], "123456", *argv[2:]]) == 0
    assert "by id (0 history items read by the server" in capsys.readouterr().out


REPO_ROOT = Path(__file__).resolve().parents[2]
POISONED = USER + 200  # the first of one user per bad kind: a case that fails spoils no other
POISON_KINDS = ("surface out of range", "unknown action", "negative id", "overflowing id",
                "ms timestamp", "us timestamp", "a day ahead", "NaN dwell",
                "malformed line")  # fmt: skip


def poison_line(kind: str, user: int, corpus, max_surface: int) -> tuple[str, str]:
    """(the line of a bad ``kind``, what its refusal says). Each is an engagement of ``user``
    with a corpus post, which would change their history were it applied."""
    now = time.time()
    good = {"type": "engagement", "user_id": user, "post_id": int(corpus.post_ids[200]),
            "author_id": int(corpus.author_ids[200]), "ts": now - 1,
            "actions": ["favorite"]}  # fmt: skip

    def line(**fields) -> str:
        return json.dumps(good | fields)

    return {
        "surface out of range": (
            line(surface=99),
            f"surface must lie in [0, {max_surface}] (the product surfaces of",
        ),
        "unknown action": (line(actions=["like"]), "unknown action 'like'"),
        "negative id": (line(user_id=-user), "user_id must be an integer in [0, 2**63 - 1]"),
        "overflowing id": (line(post_id=2**63), "post_id must be an integer in [1, 2**63 - 1]"),
        "ms timestamp": (line(ts=int(now * 1000)), "it looks like milliseconds"),
        "us timestamp": (line(ts=int(now * 1e6)), "it looks like microseconds"),
        "a day ahead": (line(ts=now + 86_400 + 600), "more than a day ahead of now"),
        "NaN dwell": (line(dwell_seconds=float("nan")), "dwell_seconds must be finite"),
        "malformed line": (line()[:-9], "not JSON"),
    }[kind]


def hydrated(client, user: int) -> dict:
    """The user's histories as the served user_state model reads them from the store."""
    out = infer(client, "http", USER_STATE.name, {"user_id": np.array([[user]], np.int64)})
    names = [s.name for s in USER_STATE.outputs if "history" in s.name and not s.optional]
    return {name: out[name].tolist() for name in names}


@pytest.mark.parametrize("kind", POISON_KINDS)
def test_a_poison_event_is_refused_by_file_and_line_and_the_users_feed_still_answers(
    kind, client, redis_server, corpus, tiny_artifacts, tmp_path
):
    """`python -m clients.events apply` (phoenix-events) run as a user types it, on a file
    whose second line is the bad kind: exit 1, the refusal names FILE:2, the good first line
    is applied, and the user's history and next feed are as if the bad line was never sent."""
    user = POISONED + POISON_KINDS.index(kind)
    load_user(redis_server.url, corpus, user)
    before = hydrated(client, user)
    assert len(before["history_post_ids"][0]) > 0
    max_surface = load_config(tiny_artifacts).product_surface_vocab_size - 1
    bad, refusal = poison_line(kind, user, corpus, max_surface)
    follow = {"type": "follow", "user_id": user, "author_id": 3, "ts": time.time() - 60}
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(follow) + "\n" + bad + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "clients.events", "apply", str(path),
         "--redis", redis_server.url, "--artifacts", str(tiny_artifacts)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    [refused] = [line for line in done.stderr.splitlines() if f"{path}:" in line]
    assert f"{path}:2: " in refused and refusal in refused, refused
    assert "2 lines: 1 events (0 engagements, 1 follows" in done.stdout
    assert "1 lines refused" in done.stdout
    assert hydrated(client, user) == before
    assert recommend(client, by_id(user))["ranked_post_ids"].shape[1] > 0
