"""recommend's chain: its stages run in process in order, wired as the contracts wire them
(``RECOMMEND_CHAIN.stages``), and the recommend ensemble is that chain's one step.

The stages' services are stand-ins here that compute their outputs from their inputs, so the
tests see what flowed where; the real services are tested on their own and together against a
real server (tests/integration)."""

import numpy as np
import pytest

from phoenix.schema.contracts import UNKNOWN_AGE
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN
from phoenix.schema.request_types import REQUEST_TYPES
from phoenix.schema.requests import InputError, from_arrays
from phoenix.schema.wiring import next_step_inputs, run_ensemble, run_until
from phoenix.stub.services.recommend import RecommendChainService

REQUEST = {
    "user_id": np.array([[1]]),
    "history_post_ids": np.array([[5, 6]]),
    "history_author_ids": np.array([[7, 8]]),
    "history_actions": np.zeros((1, 2, 3), np.float32),
    "history_product_surface": np.array([[0, 1]], np.int32),
    "top_k": np.array([[2]], np.int32),
}
HISTORY = ("history_post_ids", "history_author_ids", "history_actions", "history_product_surface")
# What the retriever is handed: the request's retrieval inputs and earlier stages' outputs.
RETRIEVER_STAGE_INPUTS = [
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
    """Each stage's outputs, made from its inputs."""
    if model == "user_state":
        return user_state(inputs)
    if model == "user_encoder":
        assert inputs["history_post_ids"].tolist() == [[105, 106]]  # the retrieval history
        return {"user_embedding": inputs["user_id"] * np.ones((1, 4), np.float32)}
    if model == "retriever":
        assert inputs["in_network_post_ids"].tolist() == [[77]]
        assert inputs["in_network_author_ids"].tolist() == [[78]]
        base = int(inputs["user_embedding"][0, 0] * 10 + inputs["top_k"].sum())
        return {
            "post_ids": np.array([[base, base + 1]]),
            "author_ids": np.array([[base + 2, base + 3]]),
            "retrieval_scores": np.array([[0.9, 0.8]], np.float32),
            "post_age_seconds": np.array([[60.0, UNKNOWN_AGE]], np.float32),
        }
    if model == "ranker":
        assert inputs["history_post_ids"].tolist() == [[5, 6]]  # the ranking history
        assert "history_dwell_seconds" in inputs
        reverse = lambda name: inputs[name][:, ::-1]  # noqa: E731
        return {
            "ranked_post_ids": reverse("candidate_post_ids"),
            "ranked_author_ids": reverse("candidate_author_ids"),
            "scores": reverse("candidate_retrieval_scores"),
            "action_probs": np.zeros((1, 2, 3), np.float32),
            "ranked_retrieval_scores": reverse("candidate_retrieval_scores"),
            "ranked_post_age_seconds": reverse("candidate_post_age_seconds"),
        }
    if model == "feed_policy":  # drops the seen posts, keeps the ranker's order
        assert inputs["in_network_post_ids"].tolist() == [[77]]
        keep = ~np.isin(inputs["candidate_post_ids"][0], inputs.get("seen_post_ids", []))
        return {
            "ranked_post_ids": inputs["candidate_post_ids"][:, keep],
            "ranked_author_ids": inputs["candidate_author_ids"][:, keep],
            "scores": np.ones((1, keep.sum()), np.float32),
            "action_probs": inputs["candidate_action_probs"][:, keep],
            "ranked_retrieval_scores": inputs["candidate_retrieval_scores"][:, keep],
            "filtered_counts": np.array([[0, 0, 0, (~keep).sum(), 0]], np.int32),
            "in_network": np.zeros((1, keep.sum()), np.int8),
        }
    assert model == "served_log"
    return {"request_id": inputs["user_id"] + 1000}


def who(request) -> int:
    """The user a stage's request is for (the retriever knows the user by its vector, which
    the stand-in user tower makes of the id)."""
    ids = getattr(request, "user_id", None)
    return int(ids[0, 0] if ids is not None else request.user_embedding[0, 0])


class Stage:
    """A stand-in stage service: the real request type, outputs from ``answer``; every batch
    it was handed is kept in ``calls``."""

    def __init__(self, model: str, calls: list, fail_user: int = -1):
        self.model, self.calls, self.fail_user = model, calls, fail_user
        self.request_type = REQUEST_TYPES[model]
        self.config = None

    def admit(self, request):
        return request

    def run(self, requests):
        self.calls.append((self.model, [sorted(r.arrays()) for r in requests]))
        return [
            InputError(f"{self.model} refused user {self.fail_user}")
            if who(r) == self.fail_user
            else answer(self.model, r.arrays())
            for r in requests
        ]


def chain(calls: list, fail: tuple[str, int] = ("", -1)) -> RecommendChainService:
    services = {
        stage.model: Stage(stage.model, calls, fail[1] if stage.model == fail[0] else -1)
        for stage in RECOMMEND_CHAIN.stages
    }
    return RecommendChainService(services, max_batch_size=8)


def run(service, requests):
    typed = [from_arrays(service.request_type, r) for r in requests]
    return service.run(typed)


def test_stages_run_in_order_once_per_stage_with_mapped_tensors():
    calls = []
    (out,) = run(chain(calls), [REQUEST])
    stages = ["user_state", "user_encoder", "retriever", "ranker", "feed_policy", "served_log"]
    assert [model for model, _ in calls] == stages
    assert calls[2][1] == [RETRIEVER_STAGE_INPUTS]
    assert "top_k" not in calls[3][1][0] and "candidate_post_ids" in calls[3][1][0]
    assert out["ranked_post_ids"].tolist() == [[13, 12]]  # 1 * 10 + 2, reversed by the ranker
    assert out["ranked_author_ids"].tolist() == [[15, 14]]
    assert out["retrieval_scores"].tolist() == [[np.float32(0.8), np.float32(0.9)]]
    assert out["request_id"].tolist() == [[1001]]
    assert sorted(out) == sorted(RECOMMEND_CHAIN.output_names)
    # absent optional filters are not sent to the policy; the ages are
    assert calls[4][1] == [
        [
            "candidate_action_probs",
            "candidate_author_ids",
            "candidate_post_age_seconds",
            "candidate_post_ids",
            "candidate_retrieval_scores",
            "in_network_post_ids",
            "user_id",
        ]
    ]


def test_the_retrievers_ages_reach_the_ranker_and_the_policy_in_ranked_order():
    seen = {}

    class Spy(Stage):
        def run(self, requests):
            seen[self.model] = requests[0]
            return super().run(requests)

    calls = []
    services = {stage.model: Spy(stage.model, calls) for stage in RECOMMEND_CHAIN.stages}
    run(RecommendChainService(services, max_batch_size=8), [REQUEST])
    assert seen["ranker"].candidate_post_age_seconds.tolist() == [[60.0, UNKNOWN_AGE]]
    assert seen["feed_policy"].candidate_post_age_seconds.tolist() == [[UNKNOWN_AGE, 60.0]]


def test_the_requests_filters_reach_the_feed_policy():
    (out,) = run(chain([]), [{**REQUEST, "seen_post_ids": np.array([[13]])}])
    assert out["ranked_post_ids"].tolist() == [[12]]


def test_many_requests_share_one_call_per_stage():
    calls = []
    second = {**REQUEST, "user_id": np.array([[2]])}
    outs = run(chain(calls), [REQUEST, second])
    assert [len(batch) for _, batch in calls] == [2] * 6
    assert [o["ranked_post_ids"][0, -1] for o in outs] == [12, 22]


def test_a_request_a_stage_refuses_gets_its_error_and_the_others_go_on():
    calls = []
    second = {**REQUEST, "user_id": np.array([[2]])}
    first, other = run(chain(calls, fail=("retriever", 1)), [REQUEST, second])
    assert isinstance(first, InputError) and "retriever refused user 1" in str(first)
    assert other["ranked_post_ids"].tolist() == [[23, 22]]
    assert [len(batch) for _, batch in calls] == [2, 2, 2, 1, 1, 1]  # dropped after retrieval


def test_a_request_not_recorded_skips_the_side_effect_and_gets_request_id_0():
    calls = []
    quiet = {**REQUEST, "user_id": np.array([[2]]), "record": np.array([[0]], np.int8)}
    recorded, unrecorded = run(chain(calls), [REQUEST, quiet])
    assert recorded["request_id"].tolist() == [[1001]]
    assert unrecorded["request_id"].tolist() == [[0]]
    assert unrecorded["ranked_post_ids"].tolist() == [[23, 22]]  # the same feed
    assert calls[-1] == ("served_log", [calls[-1][1][0]])  # only the recorded request


def test_the_chain_checks_a_request_once_by_the_first_stages_rules():
    class Strict(Stage):
        def admit(self, request):
            raise InputError("user_state: a history needs every one of its inputs")

    services = {stage.model: Stage(stage.model, []) for stage in RECOMMEND_CHAIN.stages}
    services["user_state"] = Strict("user_state", [])
    service = RecommendChainService(services, max_batch_size=8)
    with pytest.raises(InputError, match="every one of its inputs"):
        service.admit(from_arrays(service.request_type, REQUEST))


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
    assert sorted(inputs) == RETRIEVER_STAGE_INPUTS
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


def test_only_served_log_is_a_side_effect_and_no_stage_reads_what_it_makes():
    (side_effect,) = [stage for stage in RECOMMEND_CHAIN.stages if stage.side_effect]
    assert side_effect.model == "served_log" and RECOMMEND_CHAIN.stages[-1] is side_effect
    read = {source for stage in RECOMMEND_CHAIN.stages for source in stage.input_map.values()}
    assert not read & set(side_effect.output_map.values())
    assert list(side_effect.output_map) == ["request_id"]


def test_recommend_is_one_step_answering_every_output_the_chain_makes():
    """Triton 2.51 answers an ensemble request when its last step updates a requested output,
    and refuses it ("unexpected deadlock") when that step updated none: the one step maps
    every output of recommend, and every input of recommend reaches the chain."""
    (step,) = RECOMMEND.steps
    assert step.model == RECOMMEND_CHAIN.name
    assert sorted(step.output_map.values()) == sorted(RECOMMEND.output_names)
    assert sorted(step.input_map) == sorted(RECOMMEND.input_names)
    assert set(RECOMMEND.input_names) < set(RECOMMEND_CHAIN.input_names)  # and the record flag


def test_an_ensemble_runs_its_steps_in_process():
    calls = []

    def run_model(model, requests):
        calls.append(model)
        return run(chain([]), requests)

    (out,) = run_ensemble(run_model, [REQUEST])
    assert calls == [RECOMMEND_CHAIN.name]
    assert out["ranked_post_ids"].tolist() == [[13, 12]]
