"""The corpus the serving models read (phoenix/stub/corpus.py): a corpus file or a store,
opened in one place; the retriever searches it and the feed policy dates posts from it, the
same way for both kinds."""

from __future__ import annotations

import time
import zipfile

import numpy as np
import pytest

from phoenix.checkpoint import Corpus, load_corpus, save_corpus
from phoenix.config import ArtifactError
from phoenix.corpus_store import SEALED, CorpusStore, IndexSpec, Posts, StoreError
from phoenix.corpus_store.manifest import IVF_SQ8
from phoenix.corpus_store.towers import tower_of
from phoenix.schema.contracts import FEED_POLICY
from phoenix.stub.corpus import CorpusFile, FollowedStore, open_corpus
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings
from phoenix.stub.services.resources import PhoenixResources
from phoenix.stub.services.retrieval import RetrieverService

NOW = 1_000_000


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """Tiny artifacts whose corpus file is dated, and a store of the same posts."""
    from phoenix.artifacts import generate

    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=2, corpus_size=120)
    corpus = load_corpus(out / "corpus.npz")
    created = NOW - 10 * np.arange(len(corpus), dtype=np.int64)  # post i is 10 i seconds old
    dated = Corpus(corpus.post_ids, corpus.embeddings, corpus.author_ids, None, created)
    save_corpus(out / "corpus.npz", dated)
    store = CorpusStore.create(out / "store", corpus.embeddings.shape[1], embedded_by=tower_of(out))
    store.add(Posts(corpus.post_ids, corpus.author_ids, created, corpus.embeddings), SEALED)
    return out


@pytest.fixture(scope="module")
def resources(artifacts):
    return PhoenixResources(artifacts, ("retrieval",))


def without_vectors(source, target) -> None:
    """A copy of a corpus file whose vectors cannot be read (garbage bytes)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for name in old.namelist():
            data = old.read(name)
            new.writestr(name, b"not an array" if name.startswith("candidate_") else data)


def test_the_feed_policy_reads_only_post_ids_and_creation_times_of_a_file(artifacts, resources):
    without_vectors(artifacts / "corpus.npz", artifacts / "no-vectors.npz")
    with pytest.raises(ArtifactError, match="candidate_representations"):  # the retriever reads
        load_corpus(artifacts / "no-vectors.npz")
    corpus = open_corpus(artifacts, "no-vectors.npz", resources.config)  # the policy never does
    assert isinstance(corpus, CorpusFile) and corpus.engine is None
    ids = load_corpus(artifacts / "corpus.npz").post_ids
    ages = corpus.ages(np.array([[ids[3], ids[0], 987_654_321]]), now=NOW + 5)
    np.testing.assert_array_equal(ages[0, :2], [35.0, 5.0])
    assert np.isnan(ages[0, 2])
    with pytest.raises(RuntimeError, match="without its vectors"):
        corpus.search(np.zeros((1, resources.config.emb_size), np.float32), 3, [ids[:0]])


def test_a_file_and_a_store_of_the_same_posts_answer_alike(artifacts, resources):
    file = open_corpus(artifacts, "corpus.npz", resources.config)
    store = open_corpus(artifacts, "store", resources.config)
    try:
        assert isinstance(store, FollowedStore)
        ids = load_corpus(artifacts / "corpus.npz").post_ids
        asked = np.array([ids[[5, 50, 119]], [ids[0], 424242, ids[7]]])
        np.testing.assert_array_equal(file.ages(asked, NOW), store.ages(asked, NOW))
    finally:
        store.close()


def test_a_store_answers_semantic_ids_by_post_id_and_a_file_none(artifacts, resources):
    corpus = load_corpus(artifacts / "corpus.npz")
    codes = np.random.default_rng(0).integers(1, 257, (len(corpus), 6))
    sids = CorpusStore.create(artifacts / "sids", corpus.embeddings.shape[1])
    sids.add(Posts(corpus.post_ids, corpus.author_ids, corpus.post_ids, corpus.embeddings, codes))
    store = open_corpus(artifacts, "sids", resources.config)  # looked up, as the ranker would
    file = open_corpus(artifacts, "corpus.npz", resources.config)
    try:
        asked = np.array([corpus.post_ids[[4, 0]], [424242, corpus.post_ids[9]]])
        expected = np.stack([codes[[4, 0]], [np.zeros(6), codes[9]]])
        np.testing.assert_array_equal(store.semantic_ids(asked), expected)
        assert store.semantic_ids(asked).dtype == np.int32
        np.testing.assert_array_equal(file.semantic_ids(asked), np.zeros((2, 2, 6)))
    finally:
        store.close()


def test_the_retriever_searches_a_file_and_a_store_alike(artifacts, resources):
    clock = lambda: NOW + 5.0  # noqa: E731
    file = RetrieverService(resources, "corpus.npz", batch_buckets=(2,), clock=clock)
    store = RetrieverService(resources, "store", batch_buckets=(2,), clock=clock)
    corpus = load_corpus(artifacts / "corpus.npz")
    request = {
        "user_embedding": corpus.embeddings[[3, 40]],
        "top_k": np.array([[9], [9]], np.int32),
        "history_post_ids": corpus.post_ids[None, [3, 8]].repeat(2, 0),
    }
    try:
        (from_file,) = file.handle([request])
        (from_store,) = store.handle([request])
    finally:
        store.corpus.close()
    np.testing.assert_array_equal(from_file["post_ids"], from_store["post_ids"])
    np.testing.assert_array_equal(from_file["author_ids"], from_store["author_ids"])
    np.testing.assert_allclose(from_file["retrieval_scores"], from_store["retrieval_scores"], 1e-5)
    assert not np.isin(from_file["post_ids"], corpus.post_ids[[3, 8]]).any()
    # each candidate dated by either corpus: post i was made 10 i seconds before NOW
    position = {int(p): i for i, p in enumerate(corpus.post_ids)}
    expected = [[5.0 + 10 * position[int(p)] for p in row] for row in from_file["post_ids"]]
    np.testing.assert_allclose(from_file["post_age_seconds"], expected)
    np.testing.assert_allclose(from_store["post_age_seconds"], expected)
    assert from_file["post_age_seconds"].dtype == np.float32


def test_the_retriever_marks_posts_its_corpus_does_not_date_unknown(artifacts):
    from types import SimpleNamespace

    from phoenix.schema.contracts import UNKNOWN_AGE

    undated = SimpleNamespace(corpus=CorpusFile(np.array([4, 5])))  # no creation times
    ages = RetrieverService.ages(undated, np.array([[4, 5]]), NOW)
    assert ages.tolist() == [[UNKNOWN_AGE, UNKNOWN_AGE]] and ages.dtype == np.float32
    dated = SimpleNamespace(corpus=CorpusFile(np.array([4, 5]), created_at=np.array([NOW, 9])))
    ages = RetrieverService.ages(dated, np.array([[5, 7, 4]]), NOW + 1.0)
    assert ages.tolist() == [[NOW + 1.0 - 9, UNKNOWN_AGE, 1.0]]  # 7: not in the corpus


def test_the_feed_policy_dates_posts_from_the_store_it_is_given(artifacts, resources):
    """Posts added to the store are dated by the policy from the next generation on."""
    texts = FEED_POLICY.parameter_texts({"corpus_file": "store"})
    policy = build_service(ServiceSettings.parsed("feed_policy", artifacts, 8, texts))
    try:
        new_id = 10**15
        vector = np.zeros((1, resources.config.emb_size), np.float32)
        vector[0, 0] = 1.0
        assert np.isnan(policy.corpus.ages(np.array([new_id]), NOW)[0])
        CorpusStore(artifacts / "store").add(
            Posts(np.array([new_id]), np.array([1]), np.array([int(time.time())]), vector)
        )
        assert policy.corpus.follower.refresh()
        assert policy.corpus.ages(np.array([new_id]), time.time())[0] < 60
    finally:
        policy.corpus.close()


def test_the_feed_policy_loads_no_index_of_a_store(artifacts, resources):
    """A sealed IVF segment: the retriever loads its Faiss index, the policy never does."""
    rng = np.random.default_rng(0)
    rows, width = 2_000, resources.config.emb_size
    vectors = rng.normal(size=(rows, width)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = np.arange(1, rows + 1)
    store = CorpusStore.create(artifacts / "ivf", width, embedded_by=tower_of(artifacts))
    posts = Posts(ids, ids % 7, np.full(rows, NOW - 100), vectors)
    store.add(posts, SEALED, index=IndexSpec(IVF_SQ8, nlist=8, nprobe=8))
    searched = open_corpus(artifacts, "ivf", resources.config, engine_for=lambda rows: None)
    looked_up = open_corpus(artifacts, "ivf", resources.config)
    try:
        assert searched.follower.current().segments[0].index is not None
        assert looked_up.follower.current().segments[0].index is None
        np.testing.assert_array_equal(looked_up.ages(ids[:3], NOW), [100.0] * 3)
        with pytest.raises(StoreError, match="look-ups only"):
            looked_up.search(vectors[:1], 3, [ids[:0]])
    finally:
        searched.close()
        looked_up.close()
