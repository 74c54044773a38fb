"""A real tritonserver serving a corpus store (phoenix/corpus_store) through `recommend`:
the retriever answers as it does from the same posts in a corpus file, follows the store while
serving (a post added is recommended, a deleted one disappears, both within seconds), and keeps
serving through a compaction. A corpus switch on a running server moves the feed policy with
the retriever: the age filter then dates posts from the store, and an empty feed says why."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest

from phoenix.checkpoint import load_config, load_corpus, load_example_sequence
from phoenix.client.client import connect, infer, recommend_inputs, served_models, user_inputs
from phoenix.client.inprocess import server_parameters
from phoenix.corpus_store import SEALED, CorpusStore, Posts
from phoenix.corpus_store.follow import POLL_SECONDS
from phoenix.corpus_store.towers import tower_of
from phoenix.ops.configs import write_repository
from phoenix.ops.profiles import profile
from phoenix.ops.reload import switch_corpus
from phoenix.schema.contracts import POLICY_FILTERS
from phoenix.schema.served import CORPUS_READERS, PRODUCTION_CORPUS_READERS
from phoenix.schema.wiring import next_step_inputs, run_until
from phoenix.stub.request_metrics import GENERATION, LAG, SKIPPED
from tests.deploy_checks import series_values

pytestmark = pytest.mark.integration
FOLLOW_DEADLINE_S = 10.0  # the bound: a change is served within 10 s
SETTLE_S = 2 * POLL_SECONDS + 0.5  # every instance checks the manifest at least this often


def spread_creation_times(count: int, now: int, granularity_mins: int) -> np.ndarray:
    """Posts made over the last day and a half, each in the middle of one of the model's
    post-age buckets (so a second more or less never moves a post to the next bucket)."""
    bucket_s = 60 * granularity_mins
    ages = (np.arange(count) % 36) * bucket_s + bucket_s // 2
    return (now - ages).astype(np.int64)


@pytest.fixture(scope="module")
def store_server(tiny_artifacts, tmp_path_factory):
    """A server whose retriever and feed policy read ``store/``: the tiny corpus, sealed, its
    posts made over the last day and a half."""
    from tests.integration.conftest import launch_server

    root = tmp_path_factory.mktemp("store-serving")
    artifacts = root / "artifacts"
    shutil.copytree(tiny_artifacts, artifacts)
    corpus = load_corpus(artifacts / "corpus.npz")
    granularity = load_config(artifacts).post_age_granularity_mins
    created = spread_creation_times(len(corpus), int(time.time()), granularity)
    width = corpus.embeddings.shape[1]  # the store records the tower that embedded the corpus
    store = CorpusStore.create(artifacts / "store", width, embedded_by=tower_of(artifacts))
    store.add(Posts(corpus.post_ids, corpus.author_ids, created, corpus.embeddings), SEALED)
    repository = write_repository(root / "repository", profile("cpu").with_corpus("store"))
    server = launch_server(repository, artifacts, log_path=root / "tritonserver.log")
    yield server, artifacts, store
    server.kill()  # not a stop under test: conftest, "killed"


def recommended(server, user: dict, top_k: int = 20) -> np.ndarray:
    client = connect(server.http_url, "http")
    out = infer(client, "http", "recommend", recommend_inputs(user, top_k=top_k))
    return out["ranked_post_ids"][0]


def retrieved(server, vector: np.ndarray, top_k: int) -> np.ndarray:
    client = connect(server.http_url, "http")
    arrays = {"user_embedding": vector[None], "top_k": np.array([[top_k]], np.int32)}
    return infer(client, "http", "retriever", arrays)["post_ids"][0]


def wait_for(check, deadline_s: float) -> float:
    """Seconds until ``check()`` holds; fails after ``deadline_s``."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > deadline_s:
            pytest.fail(f"not within {deadline_s} s")
        time.sleep(0.1)
    return time.monotonic() - started


def test_the_store_answers_as_the_corpus_file_does(store_server):
    server, artifacts, _ = store_server
    corpus = load_corpus(artifacts / "corpus.npz")
    vector = corpus.embeddings[7]
    expected = corpus.post_ids[np.argsort(-(corpus.embeddings @ vector), kind="stable")[:25]]
    np.testing.assert_array_equal(retrieved(server, vector, 25), expected)


def test_an_added_post_is_recommended_and_a_deleted_one_disappears(store_server):
    server, artifacts, store = store_server
    user = load_example_sequence(artifacts).to_dict()
    client = connect(server.http_url, "http")
    encoded = infer(client, "http", "user_encoder", user_inputs(user))["user_embedding"][0]
    new_id = int(load_corpus(artifacts / "corpus.npz").post_ids.max()) + 12345
    # the user's own direction: the best post there is for this user
    store.add(Posts(np.array([new_id]), np.array([7]), np.array([int(time.time())]), encoded[None]))
    seconds = wait_for(lambda: new_id in recommended(server, user), FOLLOW_DEADLINE_S)
    print(f"STORE added post recommended after {seconds:.2f} s")
    time.sleep(SETTLE_S)  # one instance answered from the new generation; now every one does
    for _ in range(4):
        assert retrieved(server, encoded, 5)[0] == new_id
    store.delete([new_id])
    time.sleep(SETTLE_S)
    for _ in range(10):  # whichever instance answers, the post is gone
        assert new_id not in retrieved(server, encoded, 20)
    report = store.compact()
    assert report.purged_rows == 1  # the deleted post is left out of the sealed segment
    time.sleep(SETTLE_S)
    for _ in range(10):  # the compacted generation serves the same, without the post
        assert new_id not in retrieved(server, encoded, 20)
        assert new_id not in recommended(server, user)


def test_metrics_show_the_generation_each_corpus_reader_serves(store_server):
    """phoenix_corpus_* gauges (request_metrics): an instance sets them after each batch, so
    after requests the newest of a model's instances shows the store's generation."""
    server, artifacts, store = store_server
    user = load_example_sequence(artifacts).to_dict()
    store.add(Posts(np.array([10**9]), np.array([3]), np.array([int(time.time())]), np.eye(
        store.manifest().emb_size, dtype=np.float32)[:1]))  # fmt: skip
    generation = store.manifest().generation
    url = server.metrics_url

    def newest(metric: str, model: str) -> float:
        return max(series_values(url, metric, model=model), default=-1.0)

    client = connect(server.http_url, "http")
    models = served_models(client, "http")

    def all_serve_it() -> bool:
        recommended(server, user)  # a batch through recommend's chain
        ranked = run_until(models, recommend_inputs(user, top_k=20), "ranker")  # the retriever
        policy_inputs = {
            "user_id": np.array([[user["user_id"]]], np.int64),
            "candidate_post_ids": ranked["ranked_post_ids"],
            "candidate_author_ids": ranked["ranked_author_ids"],
            "candidate_action_probs": ranked["action_probs"],
        }
        infer(client, "http", "feed_policy", policy_inputs)  # and the policy by name
        return all(newest(GENERATION, model) == generation for model in followers)

    followers = [m for m in CORPUS_READERS if m not in PRODUCTION_CORPUS_READERS]  # original
    wait_for(all_serve_it, FOLLOW_DEADLINE_S)
    for model in followers:
        assert newest(LAG, model) == 0 and newest(SKIPPED, model) == 0, model


# -- each post's age reaches the ranker and the policy -----------------------------------------


def by_hand(client, request: dict, ages) -> tuple[dict, dict]:
    """The stages up to the retriever through the served models, then the ranker and the
    policy called by name, the candidates dated by ``ages(post_ids)`` (None: no ages sent)."""
    models = served_models(client, "http")
    done = {stage: run_until(models, request, stage) for stage in ("user_state", "retriever")}
    ranker_inputs = next_step_inputs(request, done, "ranker")
    del ranker_inputs["candidate_post_age_seconds"]  # the retriever's: sent here as given
    if ages is not None:
        ranker_inputs["candidate_post_age_seconds"] = ages(done["retriever"]["post_ids"])
    done["ranker"] = infer(client, "http", "ranker", ranker_inputs)
    policy_inputs = next_step_inputs(request, done, "feed_policy")
    return done["retriever"], infer(client, "http", "feed_policy", policy_inputs)


def test_recommend_ranks_each_post_by_its_true_age_in_the_store(store_server):
    """recommend answers what the ranker and the policy answer when called by hand with each
    candidate's age as the store dates it, and not what they answer without ages: the
    retriever's dates reach the ranker inside recommend."""
    server, artifacts, store = store_server
    client = connect(server.http_url, "http")
    request = recommend_inputs(load_example_sequence(artifacts).to_dict(), top_k=40)
    served = infer(client, "http", "recommend", request)
    snapshot = store.open(searchable=False)

    def true_ages(post_ids: np.ndarray) -> np.ndarray:
        _, created, found = snapshot.lookup(post_ids)
        assert found.all()
        return (time.time() - created).astype(np.float32)

    retrieved, aged = by_hand(client, request, true_ages)
    # the retriever dates each candidate as the store does (seconds apart at most), and the
    # candidates are of many ages
    ages = retrieved["post_age_seconds"]
    np.testing.assert_allclose(ages, true_ages(retrieved["post_ids"]), atol=30)
    assert len(np.unique(ages // 3600)) > 5
    np.testing.assert_array_equal(served["ranked_post_ids"], aged["ranked_post_ids"])
    np.testing.assert_allclose(served["scores"], aged["scores"], rtol=1e-5, atol=1e-5)

    _, ageless = by_hand(client, request, None)
    assert not np.allclose(ageless["scores"], aged["scores"], atol=1e-3)  # ages matter here


# -- a corpus switch on a running server -----------------------------------------------------

OLD_S, FRESH_S = 7200, 60  # the dated store's posts: half two hours old, half a minute


@pytest.fixture(scope="module")
def switchable_server(tiny_artifacts, tmp_path_factory):
    """A server on the tiny corpus file (no creation times) with the model load API, and a
    dated store ``dated/`` of the same posts beside it, not yet served."""
    from tests.integration.conftest import launch_server

    root = tmp_path_factory.mktemp("corpus-switch")
    artifacts = root / "artifacts"
    shutil.copytree(tiny_artifacts, artifacts)
    corpus = load_corpus(artifacts / "corpus.npz")
    assert corpus.created_at is None  # before the switch, no post has an age
    now = int(time.time())
    created = np.where(np.arange(len(corpus)) % 2 == 0, now - OLD_S, now - FRESH_S)
    store = CorpusStore.create(artifacts / "dated", corpus.embeddings.shape[1])
    store.add(Posts(corpus.post_ids, corpus.author_ids, created, corpus.embeddings), SEALED)
    fresh = set(corpus.post_ids[created == now - FRESH_S].tolist())
    repository = write_repository(root / "repository", profile("cpu"))
    server = launch_server(
        repository,
        artifacts,
        log_path=root / "tritonserver.log",
        model_control_mode="explicit",
        load_model="*",
    )
    yield server, artifacts, fresh
    server.kill()  # not a stop under test: conftest, "killed"


def feed_of(server, user: dict, top_k: int, max_age: float) -> dict[str, np.ndarray]:
    arrays = {
        **recommend_inputs(user, top_k=top_k),
        "max_age_seconds": np.array([[max_age]], np.float32),
    }
    return infer(connect(server.http_url, "http"), "http", "recommend", arrays)


def test_after_a_switch_to_a_store_the_age_filter_dates_posts_from_it(switchable_server, capsys):
    from clients import recommend

    server, artifacts, fresh = switchable_server
    user, top_k = load_example_sequence(artifacts).to_dict(), 30
    too_old = list(POLICY_FILTERS).index("too_old")
    before = feed_of(server, user, top_k, max_age=1800)
    assert before["filtered_counts"][0, too_old] == 0  # the file dates nothing: nothing too old
    assert len(before["ranked_post_ids"][0]) > 0

    client = connect(server.http_url, "http")
    assert list(switch_corpus(client, "http", "dated", None)) == list(CORPUS_READERS)
    for model in CORPUS_READERS:  # the policy moved with the retriever
        assert server_parameters(client, "http", model)["corpus_file"] == "dated"

    after = feed_of(server, user, top_k, max_age=1800)
    kept, counts = after["ranked_post_ids"][0], after["filtered_counts"][0]
    assert len(kept) > 0 and set(kept.tolist()) <= fresh  # only the store's young posts stay
    assert counts[too_old] > 0 and len(kept) + counts.sum() == top_k

    empty = feed_of(server, user, top_k, max_age=FRESH_S / 2)  # every post is older
    counts = empty["filtered_counts"][0]
    assert len(empty["ranked_post_ids"][0]) == 0
    assert counts.sum() == top_k and counts[too_old] > 0  # why: too old (or the user's own)
    argv = ["--url", server.http_url, "--artifacts", str(artifacts), "--top-k", str(top_k)]
    assert recommend.main([*argv, "--max-age", str(FRESH_S / 2)]) == 0
    assert f"no posts: all {top_k} candidates filtered (" in capsys.readouterr().out
