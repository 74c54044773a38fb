"""The recommend chain runs from the ensemble's contract, as recommend/config.pbtxt wires it."""

import numpy as np

from phoenix.serving.contracts import RECOMMEND
from phoenix.serving.ensemble import next_step_inputs, run_ensemble, run_until

REQUEST = {
    "user_id": np.array([[1]]),
    "history_post_ids": np.array([[5, 6]]),
    "history_author_ids": np.array([[7, 8]]),
    "history_actions": np.zeros((1, 2, 3), np.float32),
    "history_product_surface": np.array([[0, 1]], np.int32),
    "top_k": np.array([[2]], np.int32),
}


def answer(model: str, inputs: dict) -> dict:
    """Each model's outputs, made from its inputs so the test can see what flowed where."""
    if model == "user_encoder":
        return {"user_embedding": inputs["user_id"] * 10.0}
    if model == "retriever":
        base = inputs["user_embedding"].sum() + inputs["top_k"].sum()
        return {
            "post_ids": np.array([[base, base + 1]]),
            "author_ids": np.array([[base + 2, base + 3]]),
            "retrieval_scores": np.array([[0.9, 0.8]]),
        }
    if model == "ranker":
        return {
            "ranked_post_ids": inputs["candidate_post_ids"][:, ::-1],
            "ranked_author_ids": inputs["candidate_author_ids"][:, ::-1],
            "scores": inputs["candidate_retrieval_scores"][:, ::-1],
            "action_probs": np.zeros((1, 2, 3)),
            "ranked_retrieval_scores": inputs["candidate_retrieval_scores"][:, ::-1],
        }
    # feed_policy: drops the seen posts, keeps the ranker's order
    keep = ~np.isin(inputs["candidate_post_ids"][0], inputs.get("seen_post_ids", []))
    return {
        "ranked_post_ids": inputs["candidate_post_ids"][:, keep],
        "ranked_author_ids": inputs["candidate_author_ids"][:, keep],
        "scores": np.ones((1, keep.sum())),
        "action_probs": inputs["candidate_action_probs"][:, keep],
        "ranked_retrieval_scores": inputs["candidate_retrieval_scores"][:, keep],
        "filtered_counts": np.array([[0, 0, 0, (~keep).sum(), 0]]),
    }


def test_steps_run_in_order_once_per_step_with_mapped_tensors():
    calls = []

    def run_model(model, requests):
        calls.append((model, [sorted(r) for r in requests]))
        return [answer(model, r) for r in requests]

    (out,) = run_ensemble(run_model, [REQUEST])
    assert [model for model, _ in calls] == ["user_encoder", "retriever", "ranker", "feed_policy"]
    assert calls[1][1] == [["history_post_ids", "top_k", "user_embedding"]]
    assert "top_k" not in calls[2][1][0] and "candidate_post_ids" in calls[2][1][0]
    assert out["ranked_post_ids"].tolist() == [[13, 12]]  # 1 * 10 + 2, reversed by the ranker
    assert out["ranked_author_ids"].tolist() == [[15, 14]]
    assert out["retrieval_scores"].tolist() == [[0.8, 0.9]]  # ranked_retrieval_scores, renamed
    assert set(out) == set(RECOMMEND.output_names)
    # absent optional filters are not sent to the policy
    assert calls[3][1] == [
        [
            "candidate_action_probs",
            "candidate_author_ids",
            "candidate_post_ids",
            "candidate_retrieval_scores",
            "user_id",
        ]
    ]


def test_the_requests_filters_reach_the_feed_policy():
    def run_model(model, requests):
        return [answer(model, r) for r in requests]

    (out,) = run_ensemble(run_model, [{**REQUEST, "seen_post_ids": np.array([[13]])}])
    assert out["ranked_post_ids"].tolist() == [[12]]


def test_many_requests_share_one_call_per_step():
    calls = []

    def run_model(model, requests):
        calls.append(len(requests))
        return [answer(model, r) for r in requests]

    second = {**REQUEST, "user_id": np.array([[2]])}
    outs = run_ensemble(run_model, [REQUEST, second])
    assert calls == [2, 2, 2, 2]
    assert [o["ranked_post_ids"][0, -1] for o in outs] == [12, 22]


def test_retriever_inputs_after_the_user_encoder():
    embedding = np.ones((1, 4), np.float32)
    inputs = next_step_inputs(REQUEST, {"user_encoder": {"user_embedding": embedding}}, "retriever")
    assert sorted(inputs) == ["history_post_ids", "top_k", "user_embedding"]
    assert inputs["user_embedding"] is embedding
    assert inputs["history_post_ids"] is REQUEST["history_post_ids"]


def test_run_until_returns_the_rankers_outputs_before_the_policy():
    calls = []

    def run_model(model, requests):
        calls.append(model)
        return [answer(model, r) for r in requests]

    request = {**REQUEST, "seen_post_ids": np.array([[13]])}
    ranked = run_until(run_model, request, "ranker")
    assert calls == ["user_encoder", "retriever", "ranker"]
    assert ranked["ranked_post_ids"].tolist() == [[13, 12]]  # nothing filtered yet
