"""The feed policy: weighted score and offset, author diversity, filters, its parameters and
its service (no Triton)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.feed_policy import (
    FILTERS,
    FeedFilters,
    PolicySettings,
    apply_policy,
    diversity_multipliers,
    dropped_counts,
    filter_masks,
    in_network_share,
    keep_mask,
    occurrence_index,
    offset_negative_scores,
    weighted_scores,
)
from phoenix.schema.contracts import FEED_POLICY, FILTERED_COUNTS, POLICY_ACTION_WEIGHTS
from phoenix.schema.requests import InputError
from phoenix.stub.corpus import CorpusFile
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings
from phoenix.stub.services.feed_policy import FeedPolicyService, parse_settings

NAMES = ("favorite", "reply", "block_author", "report")
WEIGHTS = np.array([1.0, 10.0, -20.0, -50.0])  # positive sum 11, negative 70, total 81


def settings(
    decay=1.0, floor=1.0, offset=0.0, weights=WEIGHTS, own=False, factor=1.0
) -> PolicySettings:
    """decay = floor = 1: no diversity; offset 0: scores as they are when >= 0; factor 1:
    out-of-network posts as in-network ones."""
    return PolicySettings(np.asarray(weights, float), offset, decay, floor, own, factor)


# ----------------------------------------------------------------------------------------
# Weighted score and its offset
# ----------------------------------------------------------------------------------------


def test_weighted_score_sums_every_action_times_its_weight():
    probs = np.array([[0.5, 0.2, 0.0, 0.0], [0.5, 0.2, 0.1, 0.01], [0.0, 0.0, 1.0, 1.0]])
    np.testing.assert_allclose(weighted_scores(probs, WEIGHTS), [2.5, 0.0, -70.0], atol=1e-12)


def test_offset_moves_positive_scores_up_and_negative_ones_into_zero_to_offset():
    scores = np.array([2.5, 0.0, -0.5, -70.0])
    out = offset_negative_scores(scores, WEIGHTS, offset=0.1)
    # s >= 0: s + 0.1; s < 0: (s + 70) / 81 * 0.1
    np.testing.assert_allclose(out, [2.6, 0.1, 69.5 / 81 * 0.1, 0.0], atol=1e-12)
    assert np.all(out >= 0)


def test_offset_keeps_the_order_of_scores_across_zero():
    scores = np.linspace(-70, 11, 1001)
    out = offset_negative_scores(scores, WEIGHTS, offset=0.5)
    assert np.all(np.diff(out) > 0)


def test_offset_without_weights_clips_at_zero():
    out = offset_negative_scores(np.array([-1.0, 2.0]), np.zeros(4), offset=0.3)
    np.testing.assert_array_equal(out, [0.0, 2.0])


def test_higher_block_or_report_probability_ranks_lower():
    # the same positive probabilities; block 0.05 costs 1.0, report 0.01 costs 0.5
    probs = np.array([[0.5, 0.2, 0.00, 0.00], [0.5, 0.2, 0.05, 0.00], [0.5, 0.2, 0.0, 0.01]])
    posts, authors = np.array([1, 2, 3]), np.array([10, 20, 30])
    order, scores = apply_policy(posts, authors, probs, settings(offset=0.1), FeedFilters())
    assert order.tolist() == [0, 2, 1]
    np.testing.assert_allclose(scores, [2.6, 2.1, 1.6])


# ----------------------------------------------------------------------------------------
# Author diversity
# ----------------------------------------------------------------------------------------


def test_diversity_multipliers_of_an_authors_first_to_fifth_post():
    k = np.arange(5)
    np.testing.assert_allclose(
        diversity_multipliers(k, decay=0.5, floor=0.1),
        [1.0, 0.55, 0.325, 0.2125, 0.15625],  # 0.9 * 0.5**k + 0.1
    )
    np.testing.assert_array_equal(diversity_multipliers(k, decay=0.0, floor=0.0), [1, 0, 0, 0, 0])
    np.testing.assert_array_equal(diversity_multipliers(k, decay=0.3, floor=1.0), [1] * 5)


def test_occurrence_index_counts_each_value_in_order():
    assert occurrence_index(np.array([7, 3, 7, 7, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]
    assert occurrence_index(np.array([], np.int64)).tolist() == []


def test_diversity_lets_other_authors_past_an_authors_later_posts():
    # author 1 has the four best weighted scores; author 2's and 3's posts score a bit less
    probs = np.zeros((6, 4))
    probs[:, 0] = [1.0, 0.98, 0.96, 0.94, 0.9, 0.8]
    posts, authors = np.arange(1, 7), np.array([1, 1, 1, 1, 2, 3])
    order, scores = apply_policy(posts, authors, probs, settings(0.5, 0.1), FeedFilters())
    assert authors[order].tolist() == [1, 2, 3, 1, 1, 1]
    # final scores: 1.0, 0.9, 0.8, then 0.98 * 0.55, 0.96 * 0.325, 0.94 * 0.2125
    np.testing.assert_allclose(scores, [1.0, 0.9, 0.8, 0.539, 0.312, 0.19975])


# ----------------------------------------------------------------------------------------
# Filters
# ----------------------------------------------------------------------------------------

POSTS = np.array([11, 12, 13, 12, 14, 15])
AUTHORS = np.array([1, 2, 3, 2, 4, 5])


def kept(**filters) -> list[int]:
    return POSTS[keep_mask(POSTS, AUTHORS, FeedFilters(**filters))].tolist()


def test_duplicates_keep_their_best_ranked_copy():
    assert kept() == [11, 12, 13, 14, 15]
    mask = keep_mask(POSTS, AUTHORS, FeedFilters())
    assert mask.tolist() == [True, True, True, False, True, True]


def test_excluded_authors_and_seen_posts_are_dropped():
    assert kept(excluded_author_ids=np.array([2, 5, 99])) == [11, 13, 14]
    assert kept(seen_post_ids=np.array([11, 14])) == [12, 13, 15]
    assert kept(excluded_author_ids=np.array([], np.int64)) == [11, 12, 13, 14, 15]


def test_the_users_own_posts_are_dropped():
    assert kept(user_id=3) == [11, 12, 14, 15]


def test_posts_older_than_the_maximum_age_are_dropped_unknown_ages_stay():
    ages = np.array([10.0, 100.0, np.nan, 100.0, 50.0, 101.0])
    assert kept(max_age_seconds=100.0, post_ages_seconds=ages) == [11, 12, 13, 14]
    assert kept(post_ages_seconds=ages) == [11, 12, 13, 14, 15]  # no maximum: no filter


def test_each_dropped_post_is_counted_once_under_its_first_filter():
    ages = np.array([10.0, 500.0, 500.0, 500.0, 500.0, 500.0])
    filters = FeedFilters(
        user_id=5,  # author 5 writes post 15
        seen_post_ids=np.array([13, 14]),
        max_age_seconds=100.0,
        post_ages_seconds=ages,
    )
    counts = dropped_counts(filter_masks(POSTS, AUTHORS, filters))
    # 12 (second copy): duplicate; 15: own; 13, 14: seen (also too old); 12: too old
    assert dict(zip(FILTERS, counts.tolist())) == {
        "duplicate": 1, "own_post": 1, "excluded_author": 0, "seen": 2, "too_old": 1,
    }  # fmt: skip
    assert counts.sum() == len(POSTS) - keep_mask(POSTS, AUTHORS, filters).sum()
    assert dropped_counts(filter_masks(POSTS, AUTHORS, FeedFilters())).tolist() == [1, 0, 0, 0, 0]


def test_a_corpus_file_gives_ages_by_post_id():
    times = CorpusFile(np.array([30, 10, 20]), created_at=np.array([1_000, 900, 950]))
    ages = times.ages(np.array([[10, 20, 99]]), now=1_100.0)
    np.testing.assert_array_equal(ages[:, :2], [[200.0, 150.0]])
    assert np.isnan(ages[0, 2])  # not in the corpus
    assert CorpusFile(np.array([1])).ages(np.array([[1]]), 5.0) is None


def test_filtered_posts_take_no_diversity_slot():
    probs = np.zeros((3, 4))
    probs[:, 0] = [1.0, 0.9, 0.5]
    posts, authors = np.array([1, 2, 3]), np.array([7, 7, 8])
    filters = FeedFilters(seen_post_ids=np.array([1]))
    order, scores = apply_policy(posts, authors, probs, settings(0.5, 0.1), filters)
    assert posts[order].tolist() == [2, 3]  # post 2 is now author 7's first: multiplier 1
    np.testing.assert_allclose(scores, [0.9, 0.5])


# ----------------------------------------------------------------------------------------
# In-network and the out-of-network factor
# ----------------------------------------------------------------------------------------


def test_the_out_of_network_factor_multiplies_out_of_network_scores_after_diversity():
    probs = np.zeros((4, 4))
    probs[:, 0] = [1.0, 0.9, 0.8, 0.5]
    posts, authors = np.array([1, 2, 3, 4]), np.array([7, 7, 8, 9])
    in_network = np.array([False, False, False, True])
    order, scores = apply_policy(
        posts, authors, probs, settings(0.5, 0.0, factor=0.5), FeedFilters(), in_network
    )
    # 1: 1.0 * 0.5; 2: author 7's second, 0.9 * 0.5 (diversity) * 0.5; 3: 0.8 * 0.5; 4: 0.5
    assert posts[order].tolist() == [1, 4, 3, 2]
    np.testing.assert_allclose(scores, [0.5, 0.5, 0.4, 0.225])


def test_the_factor_never_raises_a_post_with_a_negative_weighted_score():
    probs = np.zeros((2, 4))
    probs[0, 3] = 0.9  # very likely reported: a negative weighted score
    probs[1, 3] = 0.1
    posts, authors = np.array([1, 2]), np.array([5, 6])
    for factor in (1.0, 0.5, 0.0):
        policy = settings(offset=0.1, factor=factor)
        order, scores = apply_policy(posts, authors, probs, policy, FeedFilters(), None)
        assert posts[order].tolist() == [2, 1]  # the less likely report stays ahead
        assert np.all(scores >= 0)
        plain = apply_policy(posts, authors, probs, settings(offset=0.1), FeedFilters())[1]
        assert np.all(scores <= plain)


def random_candidates(seed: int, count: int = 200):
    rng = np.random.default_rng(seed)
    probs = rng.uniform(0, 1, (count, 4)) * [1.0, 0.2, 0.02, 0.01]
    authors = rng.integers(1, 60, count)
    in_network = rng.random(count) < 0.2
    return np.arange(1, count + 1), authors, probs, in_network


def feed_share(factor: float, seed: int = 0, feed: int = 20) -> float:
    posts, authors, probs, in_network = random_candidates(seed)
    policy = settings(0.5, 0.1, offset=0.1, factor=factor)
    order, _ = apply_policy(posts, authors, probs, policy, FeedFilters(), in_network)
    return in_network_share(in_network[order[:feed]])


def test_a_smaller_out_of_network_factor_raises_the_in_network_share_of_a_feed():
    shares = [feed_share(factor) for factor in (1.0, 0.75, 0.3, 0.0)]
    assert shares[0] < 0.5  # about the candidates' 20% when both are treated alike
    assert shares == sorted(shares) and shares[0] < shares[2]
    assert shares[3] == 1.0  # factor 0: every in-network post first (40 of them > 20)


def test_in_network_share_of_an_empty_feed_is_zero():
    assert in_network_share(np.zeros(0, bool)) == 0.0
    assert in_network_share(np.array([1, 0, 0, 1], np.int8)) == 0.5


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------

GOOD = {
    "action_weights": json.dumps({"favorite": 1, "report": -50}),
    "negative_scores_offset": "0.1",
    "author_diversity_decay": "0.5",
    "author_diversity_floor": "0.1",
    "filter_own_posts": "true",
    "out_of_network_factor": "0.6",
}


def test_parameters_parse():
    parsed = parse_settings(GOOD, NAMES)
    np.testing.assert_array_equal(parsed.action_weights, [1, 0, 0, -50])
    assert (parsed.negative_scores_offset, parsed.author_diversity_floor) == (0.1, 0.1)
    assert parsed.filter_own_posts is True
    assert parsed.out_of_network_factor == 0.6


def test_the_default_weights_name_every_action_and_parse():
    assert set(POLICY_ACTION_WEIGHTS) == set(ACTION_NAMES)
    parsed = parse_settings(FEED_POLICY.parameter_texts({}), ACTION_NAMES)
    negative = [ACTION_NAMES[i] for i in np.flatnonzero(parsed.action_weights < 0)]
    assert negative == ["not_interested", "block_author", "mute_author", "report"]


# Per parameter: bad values and what the message says of each.
BAD_PARAMETERS = {
    "action_weights": [
        ('{"favourite": 1}', "unknown actions ['favourite']"),
        ("{}", "non-empty JSON object"),
        ("[1, 2]", "non-empty JSON object"),
        ('{"reply": "x"}', "must be a number"),
        ("{nope", "not valid JSON"),
    ],
    "author_diversity_floor": [("1.5", "must lie in [0, 1]"), ("-0.1", "must lie in [0, 1]")],
    "author_diversity_decay": [("nan", "must lie in [0, 1]"), ("half", "must be a number")],
    "negative_scores_offset": [("-1", "must lie in [0, inf]")],
    "filter_own_posts": [("yes", "must be 'true' or 'false'")],
    "out_of_network_factor": [("1.5", "must lie in [0, 1]"), ("-0.1", "must lie in [0, 1]")],
}


@pytest.mark.parametrize(
    "key, value, fragment",
    [(key, value, fragment) for key, cases in BAD_PARAMETERS.items() for value, fragment in cases],
)
def test_bad_parameters_are_named(key, value, fragment):
    with pytest.raises(ValueError) as error:
        parse_settings({**GOOD, key: value}, NAMES)
    assert str(error.value).startswith(f"parameter '{key}'")
    assert fragment in str(error.value)


def test_a_bad_parameter_stops_the_start_up(tmp_path):
    from phoenix.artifacts import generate

    generate("tiny", tmp_path, seed=1, corpus_size=50)
    parameters = {**FEED_POLICY.parameter_texts({}), "author_diversity_floor": "2"}
    with pytest.raises(ValueError, match="'author_diversity_floor' must lie in"):
        ServiceSettings.parsed("feed_policy", tmp_path, 8, parameters)
    defaults = FEED_POLICY.parameter_texts({})
    service = build_service(ServiceSettings.parsed("feed_policy", tmp_path, 8, defaults))
    assert isinstance(service, FeedPolicyService) and service.warm_up() == 0


# ----------------------------------------------------------------------------------------
# The service
# ----------------------------------------------------------------------------------------


class Config:
    num_actions = len(NAMES)
    action_names = NAMES


@pytest.fixture
def service():
    created = CorpusFile(np.array([11, 12, 13, 14]), created_at=np.array([1_000, 500, 990, 0]))
    return FeedPolicyService(
        Config(), settings(0.5, 0.1, offset=0.1, own=True), created, max_batch_size=4,
        clock=lambda: 1_010.0,
    )  # fmt: skip


def policy_request(**extra) -> dict[str, np.ndarray]:
    probs = np.zeros((1, 4, 4), np.float32)
    probs[0, :, 0] = [0.9, 0.8, 0.7, 0.6]
    return {
        "user_id": np.array([[3]]),
        "candidate_post_ids": np.array([[11, 12, 13, 14]]),
        "candidate_author_ids": np.array([[1, 2, 3, 1]]),
        "candidate_action_probs": probs,
        "candidate_retrieval_scores": np.array([[0.4, 0.3, 0.2, 0.1]], np.float32),
        **extra,
    }


def test_the_service_filters_scores_and_passes_columns_along(service):
    (out,) = service.handle([policy_request()])
    assert out["ranked_post_ids"].tolist() == [[11, 12, 14]]  # 13 is the user's own (author 3)
    assert out["ranked_author_ids"].tolist() == [[1, 2, 1]]
    np.testing.assert_allclose(out["scores"], [[1.0, 0.9, 0.7 * 0.55]], rtol=1e-6)
    np.testing.assert_allclose(out["ranked_retrieval_scores"], [[0.4, 0.3, 0.1]])
    assert out["action_probs"].shape == (1, 3, 4)
    np.testing.assert_allclose(out["action_probs"][0, :, 0], [0.9, 0.8, 0.6])
    assert out["filtered_counts"].tolist() == [[0, 1, 0, 0, 0]]  # one own post
    assert out["filtered_counts"].dtype == FILTERED_COUNTS.dtype
    assert out["in_network"].tolist() == [[0, 0, 0]]  # no in-network posts sent
    assert out["in_network"].dtype == np.int8


def test_the_service_flags_in_network_posts_and_favours_them(service):
    request = policy_request(in_network_post_ids=np.array([[14, 99, 0]]))
    (alike,) = service.handle([request])
    assert alike["ranked_post_ids"].tolist() == [[11, 12, 14]]  # factor 1: as before
    assert alike["in_network"].tolist() == [[0, 0, 1]]
    service.settings = settings(0.5, 0.1, offset=0.1, own=True, factor=0.3)
    (favoured,) = service.handle([request])
    assert favoured["ranked_post_ids"].tolist() == [[14, 11, 12]]  # 0.385 > 1.0 * 0.3
    assert favoured["in_network"].tolist() == [[1, 0, 0]]
    np.testing.assert_allclose(favoured["scores"], [[0.7 * 0.55, 0.3, 0.9 * 0.3]], rtol=1e-6)


def test_the_service_applies_the_requests_filters(service):
    request = policy_request(
        excluded_author_ids=np.array([[2]]),
        seen_post_ids=np.array([[11]]),
        max_age_seconds=np.array([[100.0]], np.float32),
    )
    (out,) = service.handle([request])
    assert out["ranked_post_ids"].tolist() == [[]]  # 12 excluded, 11 seen, 13 own, 14 too old
    # the empty feed says why: own, excluded author, seen, too old (12 is too old as well)
    assert out["filtered_counts"].tolist() == [[0, 1, 1, 1, 1]]


def test_ages_sent_with_the_candidates_are_read_instead_of_the_corpus(service):
    """recommend's chain hands the policy the retriever's ages (negative: unknown): the age
    filter reads those, not the corpus (which here dates 12 as 510 s old)."""
    ages = np.array([[5.0, 50.0, -1.0, 500.0]], np.float32)  # 13: unknown
    request = policy_request(
        candidate_post_age_seconds=ages, max_age_seconds=np.array([[100.0]], np.float32)
    )
    (out,) = service.handle([request])
    assert out["ranked_post_ids"].tolist() == [[11, 12]]  # 13 own, 14 too old by its age
    assert out["filtered_counts"].tolist() == [[0, 1, 0, 0, 1]]
    sent = np.array([[5.0, 50.0, -1.0, -1.0]], np.float32)  # 14's age unknown: it stays
    (out,) = service.handle([{**request, "candidate_post_age_seconds": sent}])
    assert out["ranked_post_ids"].tolist() == [[11, 12, 14]]


def test_rows_of_one_request_are_padded_with_post_id_zero(service):
    two = {name: np.concatenate([array, array]) for name, array in policy_request().items()}
    two["seen_post_ids"] = np.array([[11, 12], [0, 0]])
    (out,) = service.handle([two])
    assert out["ranked_post_ids"].tolist() == [[14, 0, 0], [11, 12, 14]]
    assert out["scores"][0, 1:].tolist() == [0.0, 0.0]
    assert out["filtered_counts"].tolist() == [[0, 1, 0, 2, 0], [0, 1, 0, 0, 0]]


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"max_age_seconds": np.array([[-1.0]], np.float32)}, "'max_age_seconds'"),
        ({"max_age_seconds": np.array([[np.nan]], np.float32)}, "'max_age_seconds'"),
        ({"seen_post_ids": np.array([[-5]])}, "'seen_post_ids': ids must be >= 0"),
        ({"excluded_author_ids": np.zeros((1, 5000), np.int64)}, "at most 4096"),
        ({"candidate_action_probs": np.full((1, 4, 4), 2.0, np.float32)}, "probabilities"),
        ({"candidate_action_probs": np.zeros((1, 4, 3), np.float32)}, "expected 4 actions"),
        ({"candidate_author_ids": np.array([[1, 2, 3]])}, "same length"),
        ({"seen_post_ids": np.zeros((2, 1), np.int64)}, "rows"),
    ],
)
def test_bad_requests_are_refused_alone(service, change, fragment):
    bad, good = service.handle([policy_request(**change), policy_request()])
    assert isinstance(bad, InputError) and fragment in str(bad)
    assert good["ranked_post_ids"].tolist() == [[11, 12, 14]]
