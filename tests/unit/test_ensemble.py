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


HISTORY = ("history_post_ids", "history_author_ids", "history_actions", "history_product_surface")
# What the retriever is handed: the request's retrieval inputs and earlier steps' outputs.
RETRIEVER_STEP_INPUTS = [
    "excluded_post_ids",
    "history_post_ids",
    "in_network_author_ids",
    "in_network_post_ids",
    "top_k",
    "user_embedding",
]


def user_state(inputs: dict) -> dict:
    """The request's history as the ranking history, the retrieval history told apart from
    it (post ids + 100), one served post, one in-network post."""
    ranking = {name: inputs[name] for name in HISTORY}
    ranking["history_dwell_seconds"] = np.zeros(inputs["history_post_ids"].shape, np.float32)
    retrieval = {f"retrieval_{name}": array for name, array in ranking.items()}
    retrieval["retrieval_history_post_ids"] = ranking["history_post_ids"] + 100
    return {
        **ranking,
        **retrieval,
        "served_post_ids": np.array([[99]]),
        "in_network_post_ids": np.array([[77]]),
        "in_network_author_ids": np.array([[78]]),
    }


def answer(model: str, inputs: dict) -> dict:
    """Each model's outputs, made from its inputs so the test can see what flowed where."""
    if model == "user_state":
        return user_state(inputs)
    if model == "user_encoder":
        assert inputs["history_post_ids"].tolist() == [[105, 106]]  # the retrieval history
        return {"user_embedding": inputs["user_id"] * 10.0}
    if model == "retriever":
        assert inputs["in_network_post_ids"].tolist() == [[77]]
        assert inputs["in_network_author_ids"].tolist() == [[78]]
        base = inputs["user_embedding"].sum() + inputs["top_k"].sum()
        return {
            "post_ids": np.array([[base, base + 1]]),
            "author_ids": np.array([[base + 2, base + 3]]),
            "retrieval_scores": np.array([[0.9, 0.8]]),
        }
    if model == "ranker":
        assert inputs["history_post_ids"].tolist() == [[5, 6]]  # the ranking history
        assert "history_dwell_seconds" in inputs
        return {
            "ranked_post_ids": inputs["candidate_post_ids"][:, ::-1],
            "ranked_author_ids": inputs["candidate_author_ids"][:, ::-1],
            "scores": inputs["candidate_retrieval_scores"][:, ::-1],
            "action_probs": np.zeros((1, 2, 3)),
            "ranked_retrieval_scores": inputs["candidate_retrieval_scores"][:, ::-1],
        }
    # feed_policy: drops the seen posts, keeps the ranker's order
    assert inputs["in_network_post_ids"].tolist() == [[77]]
    keep = ~np.isin(inputs["candidate_post_ids"][0], inputs.get("seen_post_ids", []))
    return {
        "ranked_post_ids": inputs["candidate_post_ids"][:, keep],
        "ranked_author_ids": inputs["candidate_author_ids"][:, keep],
        "scores": np.ones((1, keep.sum())),
        "action_probs": inputs["candidate_action_probs"][:, keep],
        "ranked_retrieval_scores": inputs["candidate_retrieval_scores"][:, keep],
        "filtered_counts": np.array([[0, 0, 0, (~keep).sum(), 0]]),
        "in_network": np.zeros((1, keep.sum()), np.int8),
    }


def test_steps_run_in_order_once_per_step_with_mapped_tensors():
    calls = []

    def run_model(model, requests):
        calls.append((model, [sorted(r) for r in requests]))
        return [answer(model, r) for r in requests]

    (out,) = run_ensemble(run_model, [REQUEST])
    steps = ["user_state", "user_encoder", "retriever", "ranker", "feed_policy"]
    assert [model for model, _ in calls] == steps
    assert calls[2][1] == [RETRIEVER_STEP_INPUTS]
    assert "top_k" not in calls[3][1][0] and "candidate_post_ids" in calls[3][1][0]
    assert out["ranked_post_ids"].tolist() == [[13, 12]]  # 1 * 10 + 2, reversed by the ranker
    assert out["ranked_author_ids"].tolist() == [[15, 14]]
    assert out["retrieval_scores"].tolist() == [[0.8, 0.9]]  # ranked_retrieval_scores, renamed
    # served_log, a side effect, is not run in process: everything but its request id
    assert set(out) == set(RECOMMEND.output_names) - {"request_id"}
    # absent optional filters are not sent to the policy
    assert calls[4][1] == [
        [
            "candidate_action_probs",
            "candidate_author_ids",
            "candidate_post_ids",
            "candidate_retrieval_scores",
            "in_network_post_ids",
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
    assert calls == [2, 2, 2, 2, 2]
    assert [o["ranked_post_ids"][0, -1] for o in outs] == [12, 22]


def test_the_retriever_excludes_history_and_served_posts_from_the_user_state():
    state = user_state(REQUEST)
    inputs = next_step_inputs(REQUEST, {"user_state": state}, "retriever")
    assert inputs["history_post_ids"] is state["history_post_ids"]
    assert inputs["excluded_post_ids"].tolist() == [[99]]


def test_a_request_by_user_id_alone_reaches_only_the_user_state_with_its_id():
    (inputs,) = [next_step_inputs({"user_id": np.array([[1]]), "top_k": np.array([[2]])}, {},
                                  "user_state")]  # fmt: skip
    assert sorted(inputs) == ["user_id"]


def test_retriever_inputs_after_the_user_encoder():
    embedding = np.ones((1, 4), np.float32)
    done = {"user_state": user_state(REQUEST), "user_encoder": {"user_embedding": embedding}}
    inputs = next_step_inputs(REQUEST, done, "retriever")
    assert sorted(inputs) == RETRIEVER_STEP_INPUTS
    assert inputs["user_embedding"] is embedding
    assert inputs["history_post_ids"] is REQUEST["history_post_ids"]


def test_run_until_returns_the_rankers_outputs_before_the_policy():
    calls = []

    def run_model(model, requests):
        calls.append(model)
        return [answer(model, r) for r in requests]

    request = {**REQUEST, "seen_post_ids": np.array([[13]])}
    ranked = run_until(run_model, request, "ranker")
    assert calls == ["user_state", "user_encoder", "retriever", "ranker"]
    assert ranked["ranked_post_ids"].tolist() == [[13, 12]]  # nothing filtered yet


def test_only_served_log_is_a_side_effect_and_it_changes_no_other_output():
    """A reference run may leave out the side effect: no other step reads what it answers,
    and every output but the request id is one of its inputs passed through."""
    (side_effect,) = [step for step in RECOMMEND.steps if step.side_effect]
    assert side_effect.model == "served_log" and RECOMMEND.steps[-1] is side_effect
    read = {source for step in RECOMMEND.steps for source in step.input_map.values()}
    assert not read & set(side_effect.output_map.values())
    made = [name for name in side_effect.output_map if name not in side_effect.input_map]
    assert made == ["request_id"]


def test_the_last_step_answers_every_output_of_recommend():
    """Triton 2.51 answers an ensemble request when its last step updates a requested output,
    and refuses it ("unexpected deadlock") when that step updated none: the last step must
    update every output a client may ask for alone."""
    assert sorted(RECOMMEND.steps[-1].output_map.values()) == sorted(RECOMMEND.output_names)
