"""Request tensors from the contracts, and the one place that turns them into InferInputs."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from phoenix.client.client import (
    feed_table,
    infer_inputs,
    model_inputs,
    ranker_inputs,
    recommend_inputs,
)
from phoenix.schema.served import contract

USER = {
    "user_id": 7,
    "history_post_ids": [11, 12],
    "history_author_ids": [21, 22],
    "history_actions": [[0, 1, 0], [1, 0, 0]],
    "history_product_surface": [0, 2],
    "history_dwell_seconds": [1.5, 3.0],
    "candidate_post_ids": [31, 32, 33],
    "candidate_author_ids": [41, 42, 43],
    "candidate_product_surface": None,
    "top_k": 9,
}


@pytest.mark.parametrize("model", ["user_encoder", "ranker", "recommend"])
def test_every_tensor_has_the_contract_dtype_and_rank(model):
    arrays = model_inputs(model, USER)
    for name, array in arrays.items():
        spec = contract(model).input(name)
        assert array.dtype == spec.dtype and array.ndim == spec.ndim and array.shape[0] == 1
    assert set(contract(model).required_inputs) <= set(arrays)


def test_optional_inputs_are_sent_only_when_given():
    arrays = ranker_inputs(USER)
    assert "history_dwell_seconds" in arrays  # given
    assert "candidate_product_surface" not in arrays  # None
    assert "candidate_retrieval_scores" not in arrays  # absent
    assert "top_k" not in arrays  # no ranker input
    assert arrays["history_actions"].shape == (1, 2, 3)
    assert arrays["user_id"].tolist() == [[7]]


def test_recommend_top_k_defaults_to_the_sequence_and_can_be_overridden():
    assert recommend_inputs(USER)["top_k"].tolist() == [[9]]
    assert recommend_inputs(USER, top_k=4)["top_k"].tolist() == [[4]]


def test_missing_required_input_and_unsized_empty_history_are_refused():
    with pytest.raises(KeyError, match="candidate_post_ids"):
        model_inputs("ranker", {k: v for k, v in USER.items() if k != "candidate_post_ids"})
    empty = {**USER, "history_post_ids": [], "history_author_ids": [], "history_actions": []}
    empty["history_product_surface"] = []
    with pytest.raises(ValueError, match="num_actions"):
        model_inputs("user_encoder", empty)
    assert model_inputs("user_encoder", empty, num_actions=3)["history_actions"].shape == (1, 0, 3)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_infer_inputs_send_each_array_with_its_own_dtype(module):
    arrays = {
        "a": np.zeros((1, 2), np.int64),
        "b": np.zeros((1, 2, 3), np.float32)[:, :, ::2],  # not contiguous
        "c": np.zeros((1, 1), np.float64),  # a wrong dtype still goes out as it is
        "d": np.array(5, np.int32),  # 0-d stays 0-d
    }
    tensors = infer_inputs(module, arrays)
    described = [(t.name(), t.datatype(), list(t.shape())) for t in tensors]
    assert described == [
        ("a", "INT64", [1, 2]),
        ("b", "FP32", [1, 2, 2]),
        ("c", "FP64", [1, 1]),
        ("d", "INT32", []),
    ]


def feed(post_ids: list, counts: list) -> dict[str, np.ndarray]:
    """A recommend result of one user: ``post_ids`` kept, ``counts`` dropped per filter."""
    n = len(post_ids)
    return {
        "ranked_post_ids": np.array([post_ids], np.int64).reshape(1, n),
        "scores": np.ones((1, n), np.float32),
        "retrieval_scores": np.ones((1, n), np.float32),
        "action_probs": np.zeros((1, n, 2), np.float32),
        "filtered_counts": np.array([counts], np.int32),
    }


def test_an_empty_feed_says_which_filters_dropped_its_candidates():
    names = ("favorite", "reply")
    assert feed_table(feed([], [0, 0, 0, 2, 18]), names).endswith(
        "no posts: all 20 candidates filtered (seen 2, too_old 18)"
    )
    assert feed_table(feed([], [0, 0, 0, 0, 0]), names).endswith(
        "no posts: no candidates to filter"
    )
    assert feed_table(feed([0, 0], [0, 0, 0, 0, 3]), names).endswith("(too_old 3)")  # padding
    assert "no posts" not in feed_table(feed([5], [0, 0, 0, 0, 3]), names)
