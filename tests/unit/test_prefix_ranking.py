"""The original ranker with its prefix cache (phoenix/engine/prefix_ranking.py) against the
same ranker without it: equal answers within the engine's own float rounding for ragged
batches that mix hits and misses, a history changed between two requests is a miss, a prefix
two rows share is computed once, a hit computes no prefix even where the uncached engine runs
the joint pass, the budget holds with more users than fit, another version drops every entry.

The same service ranks with the cache (prefix_cache_mib > 0) and without (0): what a served
ranker, alone or as recommend's stage, runs."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.client.client import ranker_inputs
from phoenix.engine import device_ranking
from phoenix.engine.prefix_ranking import entry_bytes
from phoenix.stub.services.ranker import RankerService
from phoenix.stub.services.resources import PhoenixResources
from tests.rankings import assert_same_ranking_up_to_ties

WEIGHTS = {"favorite": 1.0, "reply": 2.0, "repost": 0.5}
# one bucket of each: every call is one program of each kind (compiling is this file's time)
BUCKETS = dict(batch_buckets=(4,), candidate_buckets=(8,))
TOL = 1e-5  # float32; programs of other shapes round differently (tests/rankings.py)


@pytest.fixture(scope="module")
def resources(tiny_artifacts):
    return PhoenixResources(tiny_artifacts)


@pytest.fixture(scope="module")
def plain(resources):
    return RankerService(resources, WEIGHTS, prefix_cache_mib=0, **BUCKETS)


def cached_service(resources, mib: float = 1.0, **kwargs) -> RankerService:
    return RankerService(resources, WEIGHTS, prefix_cache_mib=mib, **BUCKETS, **kwargs)


@pytest.fixture
def cached(resources):
    return cached_service(resources)


def user(rng, user_id: int, history: int, *, dwell: bool = True) -> dict:
    """A user and their history (ragged: any length up to history_seq_len and past it)."""
    values = {
        "user_id": user_id,
        "history_post_ids": rng.integers(1, 10**12, history).tolist(),
        "history_author_ids": rng.integers(1, 10**12, history).tolist(),
        "history_actions": (rng.random((history, 19)) > 0.7).astype(int).tolist(),
        "history_product_surface": rng.integers(0, 4, history).tolist(),
    }
    if dwell:
        values["history_dwell_seconds"] = rng.exponential(5.0, history).round(2).tolist()
    return values


def page(rng, person: dict, candidates: int, *, ages: bool = False) -> dict:
    """A ranker request: ``person`` with ``candidates`` new candidates."""
    values = {
        **person,
        "candidate_post_ids": rng.integers(1, 10**12, candidates).tolist(),
        "candidate_author_ids": rng.integers(1, 10**12, candidates).tolist(),
        "candidate_product_surface": rng.integers(0, 4, candidates).tolist(),
    }
    if ages:
        values["candidate_post_age_seconds"] = rng.uniform(0, 3e5, candidates).tolist()
    return ranker_inputs(values)


def assert_same_answers(got: list, expected: list) -> None:
    for answer, reference in zip(got, expected, strict=True):
        assert not isinstance(answer, Exception), answer
        assert_same_ranking_up_to_ties(
            answer["ranked_post_ids"][0],
            answer["scores"][0],
            reference["ranked_post_ids"][0],
            reference["scores"][0],
            TOL,
        )
        by_id = dict(zip(reference["ranked_post_ids"][0].tolist(), reference["action_probs"][0]))
        for post, probs in zip(answer["ranked_post_ids"][0].tolist(), answer["action_probs"][0]):
            np.testing.assert_allclose(probs, by_id[post], rtol=TOL, atol=TOL)


def counts(service: RankerService) -> tuple[int, int]:
    stats = service.prefix_cache.stats()
    return stats.hits, stats.misses


def test_hits_and_misses_in_ragged_batches_answer_as_the_uncached_ranker(plain, cached):
    rng = np.random.default_rng(0)
    seq_len = cached.config.history_seq_len
    people = [
        user(rng, 11, 3),
        user(rng, 12, seq_len + 5),  # longer than history_seq_len: the newest are kept
        user(rng, 13, 1, dwell=False),
        user(rng, 14, seq_len),
    ]
    first = [page(rng, people[0], 5), page(rng, people[1], 8, ages=True), page(rng, people[2], 2)]
    assert_same_answers(cached.handle(first), plain.handle(first))
    assert counts(cached) == (0, 3)
    # the next pages: two users again, with other candidates, around a new one, in a new order
    second = [page(rng, people[2], 7), page(rng, people[3], 3, ages=True), page(rng, people[0], 1)]
    assert_same_answers(cached.handle(second), plain.handle(second))
    assert counts(cached) == (2, 4)
    alone = [page(rng, people[1], 6)]
    assert_same_answers(cached.handle(alone), plain.handle(alone))
    assert counts(cached) == (3, 4)
    assert cached.ranker.prefix.prefixes_computed == 4


def test_a_changed_history_is_a_miss_and_answers_for_the_new_history(plain, cached):
    rng = np.random.default_rng(1)
    person = user(rng, 21, 6)
    candidates = {
        "candidate_post_ids": rng.integers(1, 10**12, 8).tolist(),
        "candidate_author_ids": rng.integers(1, 10**12, 8).tolist(),
    }
    before = ranker_inputs({**person, **candidates})
    cached.handle([before])
    changed_action = {**person, "history_actions": [row[:] for row in person["history_actions"]]}
    changed_action["history_actions"][0][3] = 1 - changed_action["history_actions"][0][3]
    one_more = {k: v + v[-1:] if isinstance(v, list) else v for k, v in person.items()}
    other_dwell = {**person, "history_dwell_seconds": [0.0] * 6}
    for changed in (changed_action, one_more, other_dwell):
        request = ranker_inputs({**changed, **candidates})
        hits, misses = counts(cached)
        (answer,) = cached.handle([request])
        assert counts(cached) == (hits, misses + 1)
        assert_same_answers([answer], plain.handle([request]))
    (again,) = cached.handle([before])  # the first history is still held
    assert counts(cached)[0] == 1
    assert_same_answers([again], plain.handle([before]))


def test_a_prefix_two_rows_share_is_computed_once(plain, cached):
    rng = np.random.default_rng(2)
    person = user(rng, 31, 5)
    both = [page(rng, person, 4), page(rng, user(rng, 32, 2), 3), page(rng, person, 6)]
    assert_same_answers(cached.handle(both), plain.handle(both))
    assert cached.ranker.prefix.prefixes_computed == 2
    assert cached.prefix_cache.stats().entries == 2


def test_a_hit_computes_no_prefix_where_the_uncached_engine_runs_the_joint_pass(
    resources, monkeypatch
):
    """With joint_rows above every bucket the uncached engine ranks in one joint pass; the
    cached engine never does, and its answers still equal the joint pass's."""
    rng = np.random.default_rng(3)
    monkeypatch.setattr(device_ranking, "default_joint_rows", lambda: 1_000)
    joint = RankerService(resources, WEIGHTS, prefix_cache_mib=0, **BUCKETS)
    assert joint.ranker.runs_joint(4, 8)
    cached = cached_service(resources)
    people = [user(rng, 41, 4), user(rng, 42, 9)]
    for _ in range(3):  # misses, then hits only
        pages = [page(rng, person, 5) for person in people]
        assert_same_answers(cached.handle(pages), joint.handle(pages))
    assert counts(cached) == (4, 2)
    assert cached.ranker.prefix.prefixes_computed == 2


def test_more_users_than_fit_keep_the_cache_within_its_budget(resources, plain):
    rng = np.random.default_rng(4)
    probe = cached_service(resources)
    probe.handle([page(rng, user(rng, 1, 2), 2)])
    (entry,) = (probe.prefix_cache.peek(key) for key in probe.prefix_cache.keys())
    size = entry_bytes(entry)
    budget_mib = 2.5 * size / 2**20  # two and a half entries
    cached = cached_service(resources, mib=budget_mib)
    people = [user(rng, 50 + i, 3) for i in range(6)]
    for person in people:
        request = [page(rng, person, 3)]
        assert_same_answers(cached.handle(request), plain.handle(request))
        stats = cached.prefix_cache.stats()
        assert stats.bytes <= cached.prefix_cache.budget
    stats = cached.prefix_cache.stats()
    assert (stats.entries, stats.bytes, stats.evicted["budget"]) == (2, 2 * size, 4)
    cached.handle([page(rng, people[0], 3)])  # the oldest was evicted: a miss
    cached.handle([page(rng, people[-1], 3)])  # the newest is held: a hit
    assert counts(cached) == (1, 7)


def test_another_version_drops_every_entry(resources):
    rng = np.random.default_rng(5)
    cached = cached_service(resources)
    request = [page(rng, user(rng, 61, 4), 4)]
    cached.handle(request)
    cached.handle(request)
    assert counts(cached) == (1, 1)
    cached.prefix_cache.bind("another-version")
    assert cached.prefix_cache.stats().evicted["version"] == 1
    cached.handle(request)
    assert counts(cached) == (1, 2)
