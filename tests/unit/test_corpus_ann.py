"""The IVF search's own steps (phoenix/corpus_store/ann.py): which lists each user probes, and
the exact re-scoring of the index's candidates, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.corpus_store.ann import (
    PARALLEL_SCORES,
    best_lists,
    centroid_columns,
    centroids_of,
    scores_of_rows,
)


def test_each_user_keeps_exactly_its_count_of_best_lists():
    rng = np.random.default_rng(3)
    every = rng.normal(size=(6, 300)).astype(np.float32)  # centroid scores [B, nlist]
    probes = np.array([5, 40, 5, 17, 1, 40])
    lists, scores = best_lists(every, probes)
    assert lists.shape == scores.shape == (6, 40) and lists.dtype == np.int64
    for b, count in enumerate(probes):
        kept = lists[b][lists[b] >= 0]
        expected = np.argsort(-every[b])[:count]
        assert sorted(kept) == sorted(expected)
        held = lists[b] >= 0
        assert np.array_equal(scores[b][held], every[b][lists[b][held]])


def test_a_tie_at_a_users_cut_adds_a_list_and_the_rest_are_marked_minus_one():
    every = np.array(
        [[0.9, 0.5, 0.7, 0.7, 0.1], [0.2, 0.3, 0.4, 0.5, 0.6], [0.1, 0.2, 0.3, 0.4, 0.5]],
        np.float32,
    )
    lists, scores = best_lists(every, np.array([2, 1, 3]))  # user 0: 0.9, then 0.7 twice
    assert lists.shape == (3, 3)
    assert sorted(lists[0][lists[0] >= 0]) == [0, 2, 3]
    assert sorted(lists[2][lists[2] >= 0]) == [2, 3, 4]
    assert list(lists[1][lists[1] >= 0]) == [4] and np.sum(lists[1] < 0) == lists.shape[1] - 1
    np.testing.assert_array_equal(
        scores[0][lists[0] >= 0], every[0][np.sort(lists[0][lists[0] >= 0])]
    )
    # Faiss quantizes a user's list scores over all its slots: the unused ones carry its cut
    assert np.all(scores[1][lists[1] < 0] == np.float32(0.6))


def test_a_constant_user_probes_no_more_than_the_largest_count():
    every = np.zeros((3, 64), np.float32)  # a zero user vector: every centroid ties
    every[1] = np.linspace(0, 1, 64, dtype=np.float32)
    every[2, :40] = 0.5  # ties past the largest count, at the cut
    lists, scores = best_lists(every, np.array([3, 5, 2]))
    assert lists.shape[1] == 5  # the largest count: no user took every tied list
    assert np.sum(lists[0] >= 0) == 5 and np.sum(lists[2] >= 0) == 5  # ties: up to 5
    assert sorted(lists[1][lists[1] >= 0]) == [59, 60, 61, 62, 63]
    held = lists >= 0
    np.testing.assert_array_equal(
        scores[held], np.take_along_axis(every, np.maximum(lists, 0), 1)[held]
    )


def test_centroid_columns_score_users_as_the_centroids_do():
    import faiss

    rng = np.random.default_rng(5)
    posts = rng.normal(size=(2_000, 16)).astype(np.float32)
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(16), 16, 32, faiss.METRIC_INNER_PRODUCT)
    index.train(posts)
    columns = centroid_columns(index)  # [D, nlist]
    assert columns.shape == (16, 32) and columns.flags.c_contiguous
    users = rng.normal(size=(5, 16)).astype(np.float32)
    np.testing.assert_allclose(users @ columns, users @ centroids_of(index).T, rtol=1e-6)


@pytest.mark.parametrize("width", [40, PARALLEL_SCORES // 3 + 1])  # numpy, then Faiss' way
def test_scores_of_rows_are_the_exact_inner_products_and_minus_inf_for_no_row(width):
    rng = np.random.default_rng(4)
    embeddings = rng.normal(size=(500, 16)).astype(np.float32)  # [n, D]
    users = rng.normal(size=(3, 16)).astype(np.float32)  # [B, D]
    rows = rng.integers(0, 500, size=(3, width))  # [B, c]
    rows[1, 30:] = -1  # fewer candidates than asked
    scores = scores_of_rows(embeddings, users, rows)
    expected = np.einsum("bcd,bd->bc", embeddings[np.maximum(rows, 0)], users)
    held = rows >= 0
    np.testing.assert_allclose(scores[held], expected[held], rtol=1e-5, atol=1e-5)
    assert np.all(scores[~held] == -np.inf)


def clustered(rng, posts: int, clusters: int, dim: int = 16) -> np.ndarray:
    """Unit vectors [posts, dim] around ``clusters`` random directions."""
    centres = rng.normal(size=(clusters, dim))
    vectors = centres[rng.integers(0, clusters, posts)] + 0.6 * rng.normal(size=(posts, dim))
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def test_spill_lists_pick_the_best_centroid_then_the_least_loss_among_the_nearest():
    from phoenix.corpus_store.ann import spill_lists

    rng = np.random.default_rng(5)
    posts, centroids = clustered(rng, 3000, 12), clustered(rng, 40, 12)
    first, second = spill_lists(posts, centroids, candidates=6, weight=1.0)
    scores = posts @ centroids.T  # [n, nlist]
    np.testing.assert_array_equal(first, scores.argmax(axis=1))
    assert np.all(first != second)
    for i in range(0, 3000, 97):  # the loss, by brute force over the 5 next-best centroids
        near = np.argsort(-scores[i])[1:6]
        r = posts[i] - centroids[first[i]]
        loss = [
            np.sum((posts[i] - centroids[c]) ** 2)
            + (np.dot(posts[i] - centroids[c], r) / np.linalg.norm(r)) ** 2
            for c in near
        ]
        assert second[i] == near[int(np.argmin(loss))]
    with pytest.raises(ValueError, match=">= 2 lists"):
        spill_lists(posts, centroids[:1])


def test_a_spilled_index_holds_each_post_in_two_lists_and_finds_more_at_the_same_probes():
    import faiss

    from phoenix.corpus_store.ann import fill_spilled, spill_lists
    from phoenix.corpus_store.snapshot import first_of_each

    rng = np.random.default_rng(6)
    posts, users = clustered(rng, 20_000, 24), clustered(rng, 64, 24)
    kmeans = faiss.Kmeans(16, 64, niter=10, seed=1, spherical=True)
    kmeans.train(posts)
    centroids = kmeans.centroids
    quantizer = faiss.IndexFlatIP(16)
    quantizer.add(centroids)
    plain = faiss.IndexIVFPQ(quantizer, 16, 64, 16, 4, faiss.METRIC_INNER_PRODUCT)
    plain.train(posts)  # the codes; the lists are given
    spilled = fill_spilled(plain, posts)
    assert spilled.ntotal == 2 * len(posts) and isinstance(spilled, faiss.IndexIVFPQFastScan)
    held = {}
    for lst in range(spilled.nlist):
        for post in faiss.rev_swig_ptr(
            spilled.invlists.get_ids(lst), spilled.invlists.list_size(lst)
        ).tolist():
            held.setdefault(post, []).append(lst)
    first, second = spill_lists(posts, centroids)
    assert len(held) == len(posts)
    assert all(sorted(held[p]) == sorted((first[p], second[p])) for p in range(0, 20_000, 7))

    single = faiss.IndexIVFPQFastScan(
        faiss.IndexFlatIP(16), 16, 64, 16, 4, faiss.METRIC_INNER_PRODUCT
    )
    single.quantizer.add(centroids)
    single.train(posts)
    single.add(posts)
    exact = np.argsort(-(users @ posts.T), axis=1)[:, :50]

    def recall(index) -> float:
        index.nprobe = 4
        _, rows = index.search(users, 500)
        scores = scores_of_rows(posts, users, rows)  # [B, 500], -inf at -1
        scores[~first_of_each(rows + 1)] = -np.inf  # a post found in both its lists: once
        best = np.take_along_axis(rows, np.argsort(-scores, axis=1)[:, :50], 1)
        return np.mean([len(np.intersect1d(b, e)) / 50 for b, e in zip(best, exact)])

    assert recall(spilled) > recall(single) + 0.05  # measured 0.856 against 0.780
