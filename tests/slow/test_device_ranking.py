"""The whole-request device ranker against the host path and the plain model's invariants."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.artifacts import generate
from phoenix.engine import DeviceRanker
from phoenix.engine.device_ranking import hash_on_device
from phoenix.hashing import entity_hashes, hash_ids
from phoenix.stub.services.ranker import RankerService, empty_request_batch, request_batch
from phoenix.stub.services.resources import PhoenixResources
from tests.plain_models import ranker_features

WEIGHTS = {"favorite": 1.0, "reply": 13.5, "repost": 1.0}
TOL = 1e-5


@pytest.fixture(scope="module")
def resources(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=3, corpus_size=64)
    return PhoenixResources(out)


@pytest.fixture(scope="module")
def ranker(resources):
    return RankerService(resources, WEIGHTS, batch_buckets=(1, 2, 4), candidate_buckets=(8, 32))


def request(config, rng, history: int, candidates: int, with_age: bool = True) -> dict:
    ids = lambda *shape: rng.integers(1, 2**63 - 1, shape, dtype=np.int64)  # noqa: E731
    out = {
        "user_id": ids(1, 1),
        "history_post_ids": ids(1, history),
        "history_author_ids": ids(1, history),
        "history_actions": (rng.random((1, history, config.num_actions)) > 0.7).astype(np.float32),
        "history_product_surface": rng.integers(0, 4, (1, history), dtype=np.int32),
        "history_dwell_seconds": rng.exponential(10, (1, history)).astype(np.float32),
        "candidate_post_ids": ids(1, candidates),
        "candidate_author_ids": ids(1, candidates),
        "candidate_product_surface": rng.integers(0, 4, (1, candidates), dtype=np.int32),
    }
    if with_age:
        out["candidate_post_age_seconds"] = rng.uniform(0, 4e5, (1, candidates)).astype(np.float32)
    return out


@pytest.mark.parametrize("entity", ["user", "item", "author"])
def test_device_hashing_equals_numpy_hashing_at_the_edges(resources, entity):
    config = resources.config
    ids = np.array(
        [0, 1, -1, 2**63 - 1, -(2**63), 2**62 + 7, 12_345_678_901_234, 2**53 + 1], np.int64
    )
    spec = entity_hashes(config)[entity]
    with jax.enable_x64(True):
        hashes, rows = hash_on_device(jnp.asarray(ids), spec)
    expected = hash_ids(ids, config.hash_params.for_entity(entity), config.vocab_size(entity))
    np.testing.assert_array_equal(np.asarray(hashes), expected)
    np.testing.assert_array_equal(
        np.asarray(rows), np.where(expected == 0, 0, expected + spec.table_offset)
    )
    assert np.asarray(hashes).dtype == np.int32


def host_path_ranking(resources, ranker, requests):
    """Host hashing + ``DeviceRanker.score`` of the hashed features + numpy blend and sort
    (the path served before)."""
    engine = DeviceRanker(
        resources.config.ranker_config(),
        resources.artifacts.ranker_params,
        compute_dtype=jnp.float32,
        batch_buckets=(1, 2, 4),
        candidate_buckets=(8, 32),
    )
    out = []
    for request in requests:
        probs = np.asarray(
            jax.nn.sigmoid(engine.score(*ranker_features(resources, request)).logits)
        )
        blended = probs[0] @ ranker.weights  # [C]
        order = np.argsort(-blended, kind="stable")
        out.append((request.candidate_post_ids[0, order], blended[order], probs[0, order]))
    return out


def test_device_ranking_equals_the_host_path(resources, ranker):
    rng = np.random.default_rng(0)
    config = resources.config
    sizes = [(5, 20), (0, 3), (config.history_seq_len + 9, 32), (2, 70)]  # 70: 3 chunks
    requests = [
        ranker.parse(request(config, rng, h, c, with_age=i % 2 == 0))
        for i, (h, c) in enumerate(sizes)
    ]
    served = ranker.run(requests)  # one batch of four users
    for got, (ids, scores, probs) in zip(served, host_path_ranking(resources, ranker, requests)):
        np.testing.assert_array_equal(got["ranked_post_ids"][0], ids)
        np.testing.assert_allclose(got["scores"][0], scores, rtol=TOL, atol=TOL)
        np.testing.assert_allclose(got["action_probs"][0], probs, rtol=TOL, atol=TOL)


def test_scores_sorted_and_padding_never_returned(resources, ranker):
    rng = np.random.default_rng(1)
    requests = [ranker.parse(request(resources.config, rng, 4, n)) for n in (1, 5, 9)]
    for sent, out in zip(requests, ranker.run(requests)):
        ids = sent.candidate_post_ids[0]
        assert out["ranked_post_ids"].shape == (1, len(ids))
        assert sorted(out["ranked_post_ids"][0].tolist()) == sorted(ids.tolist())
        assert np.all(np.diff(out["scores"][0]) <= 0)
        assert np.all(np.isfinite(out["scores"]))


def test_candidate_isolation_a_score_ignores_the_other_candidates(resources, ranker):
    """Replacing every other candidate leaves candidate 3's score unchanged."""
    rng = np.random.default_rng(2)
    first = request(resources.config, rng, 6, 12)
    second = {k: v.copy() for k, v in first.items()}
    others = np.arange(12) != 3
    for key in ("candidate_post_ids", "candidate_author_ids"):
        second[key][0, others] = rng.integers(1, 2**62, others.sum())
    second["candidate_product_surface"][0, others] = (
        3 - second["candidate_product_surface"][0, others]
    )
    kept = int(first["candidate_post_ids"][0, 3])

    def score_of_kept(inputs):
        (out,) = ranker.handle([inputs])
        return out["scores"][0, list(out["ranked_post_ids"][0]).index(kept)]

    np.testing.assert_allclose(score_of_kept(first), score_of_kept(second), rtol=TOL, atol=TOL)


def test_an_engine_built_without_table_scores_but_refuses_to_rank(resources):
    config = resources.config.ranker_config()
    params = resources.artifacts.ranker_params
    engine = DeviceRanker(config, params, candidate_buckets=(8,))
    with pytest.raises(ValueError, match="cannot rank raw ids"):
        engine.rank(empty_request_batch(resources.config, 1, 8))
    with pytest.raises(ValueError, match="go together"):
        DeviceRanker(config, params, resources.embedder.table, candidate_buckets=(8,))


def test_the_joint_pass_ranks_as_the_cached_passes(resources, ranker):
    """Context and candidates as one sequence (small batches on a GPU) rank every request as
    the cached-context passes do, with the same scores."""
    joint = DeviceRanker(
        resources.config.ranker_config(),
        resources.artifacts.ranker_params,
        resources.embedder.table,
        entity_hashes(resources.config),
        ranker.weights,
        compute_dtype=jnp.float32,
        batch_buckets=(1, 2, 4),
        candidate_buckets=(8, 32),
        joint_rows=4 * 32,
    )
    assert joint.runs_joint(4, 32) and not ranker.ranker.runs_joint(4, 32)
    rng = np.random.default_rng(2)
    sizes = [(5, 20), (0, 3), (resources.config.history_seq_len + 9, 32)]
    requests = [
        ranker.parse(request(resources.config, rng, h, c, with_age=i != 1))
        for i, (h, c) in enumerate(sizes)
    ]
    batch = request_batch(requests, resources.config, 4, 32)  # 3 users padded to 4
    cached, together = ranker.ranker.rank(batch), joint.rank(batch)
    real = slice(0, len(requests))  # the padding user's probabilities are of no one
    np.testing.assert_array_equal(together.order[real], cached.order[real])
    np.testing.assert_allclose(together.scores, cached.scores, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(
        together.action_probs[real], cached.action_probs[real], rtol=TOL, atol=TOL
    )


def test_an_unknown_age_ranks_as_a_request_without_ages_and_ages_pass_through(resources, ranker):
    """UNKNOWN_AGE (any negative age) is the model's unknown-age bucket, what training used for
    candidates without timestamps: a row of unknown ages scores as a row that sent none. Known
    ages change the scores; each row's ages come back in ranked order."""
    from phoenix.schema.contracts import UNKNOWN_AGE

    rng = np.random.default_rng(5)
    sent = request(resources.config, rng, 6, 12, with_age=False)
    candidates = sent["candidate_post_ids"].shape[1]
    unknown = {
        **sent,
        "candidate_post_age_seconds": np.full((1, candidates), UNKNOWN_AGE, np.float32),
    }
    ages = np.linspace(0, 36 * 3600, candidates, dtype=np.float32)[None]
    dated = {**sent, "candidate_post_age_seconds": ages}
    without, with_unknown, with_ages = ranker.run([ranker.parse(r) for r in (sent, unknown, dated)])
    np.testing.assert_array_equal(without["ranked_post_ids"], with_unknown["ranked_post_ids"])
    np.testing.assert_allclose(without["scores"], with_unknown["scores"], rtol=TOL, atol=TOL)
    assert not np.allclose(without["scores"], with_ages["scores"], atol=1e-4)
    assert (without["ranked_post_age_seconds"] == UNKNOWN_AGE).all()
    by_post = dict(zip(sent["candidate_post_ids"][0].tolist(), ages[0].tolist()))
    expected = [by_post[p] for p in with_ages["ranked_post_ids"][0].tolist()]
    np.testing.assert_array_equal(with_ages["ranked_post_age_seconds"][0], expected)
