"""The retriever joins the user's in-network posts to its top_k: each post once (as
in-network), none excluded, in-network first, within the ranker's candidate limit. The
service with these inputs: tests/unit/test_services.py (one retriever per process: a second
one compiled in the same process trips JAX's executable serialization) and through Triton in
tests/integration/test_recommend_by_id.py."""

import numpy as np

from phoenix.stub.corpus import RowHits
from phoenix.stub.services.retrieval import UNRETRIEVED_SCORE, with_in_network


def hits(posts, scores) -> RowHits:
    posts = np.array(posts, np.int64)
    return RowHits(posts, posts + 1000, np.array(scores, np.float32))


def ids(*values) -> np.ndarray:
    return np.array(values, np.int64)


def test_in_network_posts_come_first_once_and_keep_a_retrieval_score_when_retrieved():
    retrieved = hits([5, 6, 7], [0.9, 0.8, 0.7])
    row = with_in_network(retrieved, (ids(40, 6, 40), ids(4, 1006, 4)), excluded=ids())
    assert row.post_ids.tolist() == [40, 6, 5, 7]  # 6 once, as in-network; 40 once
    assert row.author_ids.tolist() == [4, 1006, 1005, 1007]
    np.testing.assert_allclose(row.scores, [UNRETRIEVED_SCORE, 0.8, 0.9, 0.7])


def test_excluded_in_network_posts_are_left_out():
    row = with_in_network(hits([5], [0.9]), (ids(40, 41), ids(4, 4)), excluded=ids(41, 99))
    assert row.post_ids.tolist() == [40, 5]


def test_the_candidate_limit_cuts_the_retrieved_posts_first():
    retrieved = hits([5, 6, 7], [0.9, 0.8, 0.7])
    row = with_in_network(retrieved, (ids(40, 41), ids(4, 4)), excluded=ids(), limit=3)
    assert row.post_ids.tolist() == [40, 41, 5]
    row = with_in_network(retrieved, (ids(40, 41), ids(4, 4)), excluded=ids(), limit=1)
    assert row.post_ids.tolist() == [40]


def test_excluded_posts_in_any_order_with_repeats_are_left_out():
    excluded = ids(99, 41, 7, 41, 3)  # history then served, unsorted, a post in both
    row = with_in_network(hits([5], [0.9]), (ids(3, 40, 41), ids(4, 4, 4)), excluded=excluded)
    assert row.post_ids.tolist() == [40, 5]


def test_without_in_network_posts_the_retrieved_pass_as_they_are_within_the_limit():
    retrieved = RowHits(ids(5, 6, 7), ids(1005, 1006, 1007), np.array([0.9, 0.8, 0.7]))
    row = with_in_network(retrieved, (ids(), ids()), excluded=ids(6), limit=2)
    assert row.post_ids.tolist() == [5, 6]  # the corpus search already left excluded out
    assert row.author_ids.tolist() == [1005, 1006]
    assert row.scores.dtype == np.float32
    np.testing.assert_allclose(row.scores, [0.9, 0.8])
