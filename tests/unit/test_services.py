"""Serving logic without Triton: validation, padding, blending, per-request isolation."""

import subprocess
import sys

import numpy as np
import pytest

from phoenix.client.client import ranker_inputs
from phoenix.engine.device_ranking import RankedBatch
from phoenix.schema.batches import pad_batch
from phoenix.schema.contracts import RANKER
from phoenix.schema.recommend import RECOMMEND
from phoenix.schema.request_types import RankerRequest, UserEncoderRequest
from phoenix.schema.requests import InputError, parse
from phoenix.schema.served import CONTRACTS, contract
from phoenix.schema.spec import Parameter, powers_of_two_up_to
from phoenix.stub.services import retrieval
from phoenix.stub.services.catalog import SERVED_BY_SERVICES, build_service, service_class
from phoenix.stub.services.common import ServiceSettings
from phoenix.stub.services.ranker import RankerService, score_weight_vector, split_ranked
from phoenix.stub.services.ranker import request_batch as ranker_batch
from phoenix.stub.services.resources import PhoenixResources
from phoenix.stub.services.retrieval import RetrieverService, UserEncoderService


@pytest.fixture(scope="module")
def resources(tiny_artifacts):
    return PhoenixResources(tiny_artifacts)


@pytest.fixture(scope="module")
def ranker(resources):
    return RankerService(
        resources,
        {"favorite": 1.0, "reply": 2.0},
        candidate_buckets=(8, 32),
        batch_buckets=(1, 4),
    )


def request(config, rng, history=5, candidates=4):
    return ranker_inputs(
        {
            "user_id": 7,
            "history_post_ids": rng.integers(1, 10**9, history).tolist(),
            "history_author_ids": rng.integers(1, 10**9, history).tolist(),
            "history_actions": (rng.random((history, config.num_actions)) > 0.5)
            .astype(int)
            .tolist(),
            "history_product_surface": rng.integers(0, 4, history).tolist(),
            "history_dwell_seconds": rng.random(history).tolist(),
            "candidate_post_ids": rng.integers(1, 10**9, candidates).tolist(),
            "candidate_author_ids": rng.integers(1, 10**9, candidates).tolist(),
            "candidate_product_surface": rng.integers(0, 4, candidates).tolist(),
        }
    )


def test_score_weights_parse_and_reject_unknown_actions():
    names = ("action_0", "favorite", "reply")
    parse = RANKER.parameter("score_weights").parse
    np.testing.assert_array_equal(
        score_weight_vector(parse('{"favorite": 2, "reply": 0.5}'), names), [0, 2, 0.5]
    )
    with pytest.raises(ValueError, match="unknown actions \\['like'\\]"):
        score_weight_vector(parse('{"like": 1}'), names)
    with pytest.raises(ValueError, match="'score_weights' is not valid JSON"):
        parse("{favorite: 1}")


def user_request(user_id, posts, actions=3):
    """A typed one-row user request whose history is ``posts`` (authors equal the posts)."""
    posts = np.asarray([posts], np.int64)
    return UserEncoderRequest(
        user_id=np.array([[user_id]], np.int64),
        history_post_ids=posts,
        history_author_ids=posts,
        history_actions=np.ones(posts.shape + (actions,), np.float32),
        history_product_surface=np.zeros(posts.shape, np.int32),
    )


def test_pad_batch_keeps_newest_pads_right_and_pads_rows():
    long = user_request(1, np.arange(1, 8))
    short = user_request(2, [5])
    users = pad_batch([long, short], rows=4, widths={"L": 4})
    np.testing.assert_array_equal(users.user_id, [1, 2, 0, 0])
    np.testing.assert_array_equal(
        users.history_post_ids, [[4, 5, 6, 7], [5, 0, 0, 0], *[[0] * 4] * 2]
    )
    assert users.history_actions.shape == (4, 4, 3)
    assert users.sent == {}  # the user tower's inputs are all required


def test_pad_batch_fills_absent_optional_inputs_with_zeros_and_says_which(ranker, resources):
    """A request without dwell times or ages and one with them share one batch."""
    rng = np.random.default_rng(4)
    full = request(resources.config, rng, history=2)
    full["candidate_post_age_seconds"] = np.full((1, 4), 60.0, np.float32)
    with_all = parse(RankerRequest, full, resources.config)
    arrays = request(resources.config, rng, history=3, candidates=5)
    arrays.pop("history_dwell_seconds")

    without = parse(RankerRequest, arrays, resources.config)
    batch = pad_batch([without, with_all], rows=4, widths={"L": 4, "C": 8})
    np.testing.assert_array_equal(batch.history_dwell_seconds[0], np.zeros(4))
    dwell = with_all.history_dwell_seconds[0]
    np.testing.assert_allclose(batch.history_dwell_seconds[1, :2], dwell)
    assert batch.candidate_post_age_seconds.shape == (4, 8)
    np.testing.assert_array_equal(batch.candidate_post_age_seconds[0], np.zeros(8))
    np.testing.assert_array_equal(batch.sent["history_dwell_seconds"], [False, True, False, False])
    np.testing.assert_array_equal(
        batch.sent["candidate_post_age_seconds"], [False, True, False, False]
    )
    np.testing.assert_array_equal(batch.candidate_post_ids[0, 5:], np.zeros(3))


def test_ranker_outputs_are_sorted_blends(ranker, resources):
    rng = np.random.default_rng(0)
    (out,) = ranker.handle([request(resources.config, rng, candidates=9)])
    scores = out["scores"][0]
    assert out["ranked_post_ids"].shape == (1, 9) and (np.diff(scores) <= 0).all()
    weights = score_weight_vector({"favorite": 1.0, "reply": 2.0}, resources.config.action_names)
    np.testing.assert_allclose(out["action_probs"][0] @ weights, scores, rtol=1e-6)


def test_one_bad_request_does_not_change_the_others(ranker, resources):
    rng = np.random.default_rng(1)
    good = [request(resources.config, rng, candidates=n) for n in (3, 12, 1)]
    bad = dict(good[0], history_product_surface=np.full((1, 5), 99, np.int32))
    alone = [ranker.handle([g])[0] for g in good]
    mixed = ranker.handle([good[0], bad, good[1], good[2]])
    assert isinstance(mixed[1], InputError) and "history_product_surface" in str(mixed[1])
    for a, m in zip(alone, [mixed[0], mixed[2], mixed[3]]):
        np.testing.assert_array_equal(a["ranked_post_ids"], m["ranked_post_ids"])
        np.testing.assert_allclose(a["scores"], m["scores"], atol=1e-5)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"history_author_ids": np.ones((1, 2), np.int64)}, "same length"),
        ({"candidate_author_ids": np.ones((2, 4), np.int64)}, "the request has 1"),
        ({"history_post_ids": -np.ones((1, 5), np.int64)}, ">= 0"),
        ({"history_actions": np.full((1, 5, 19), 2.0, np.float32)}, "action flags"),
        ({"history_actions": np.zeros((1, 5, 4), np.float32)}, "expected 19 actions"),
        ({"history_dwell_seconds": np.full((1, 5), np.nan, np.float32)}, "NaN"),
        ({"candidate_post_ids": np.zeros((1, 4), np.int64)}, ">= 1"),
        (
            {
                "candidate_post_ids": np.ones((1, 1025), np.int64),
                "candidate_author_ids": np.ones((1, 1025), np.int64),
                "candidate_product_surface": None,
            },
            "at most 1024",
        ),
        ({"candidate_post_age_seconds": np.full((1, 4), np.inf, np.float32)}, "infinite"),
        ({"surprise": np.ones((1, 1), np.int64)}, "unknown inputs"),
        (
            {"history_semantic_ids": np.ones((1, 5, 6), np.int32)},
            "input 'history_semantic_ids': read by X's production ranker family only",
        ),
        ({"country": np.ones((1, 1), np.int32)}, "this ranker is of the original family"),
        ({"candidate_post_ids": None}, "missing required inputs ['candidate_post_ids']"),
    ],
)
def test_ranker_rejects_bad_input(ranker, resources, change, fragment):
    arrays = request(resources.config, np.random.default_rng(2))
    for key, value in change.items():
        if value is None:
            arrays.pop(key)
        else:
            arrays[key] = value
    (result,) = ranker.handle([arrays])
    assert isinstance(result, InputError)
    assert fragment in str(result)


def test_user_encoder_and_retriever(resources):
    rng = np.random.default_rng(3)
    encoder = UserEncoderService(resources, batch_buckets=(1, 2))
    arrays = request(resources.config, rng)
    user_only = {k: v for k, v in arrays.items() if k in UserEncoderRequest.contract.input_names}
    (out,) = encoder.handle([user_only])
    assert abs(np.linalg.norm(out["user_embedding"][0]) - 1) < 1e-5
    retriever = RetrieverService(resources, "corpus.npz", batch_buckets=(1,))
    first = retriever.handle(
        [{"user_embedding": out["user_embedding"], "top_k": np.array([[5]], np.int32)}]
    )[0]
    seen = first["post_ids"][:, :2]
    second = retriever.handle(
        [
            {
                "user_embedding": out["user_embedding"],
                "top_k": np.array([[5]], np.int32),
                "history_post_ids": seen,
            }
        ]
    )[0]
    assert not np.isin(second["post_ids"], seen).any()
    np.testing.assert_array_equal(second["post_ids"][0, :3], first["post_ids"][0, 2:])
    everything = retriever.handle(
        [{"user_embedding": out["user_embedding"], "top_k": np.array([[1000]], np.int32)}]
    )[0]
    assert everything["post_ids"].shape == (1, 200)

    # in-network posts join the top_k retrieved: first, each post once (a retrieved one keeps
    # its retrieval score), none excluded; top_k counts the retrieved posts only
    top = int(first["post_ids"][0, 0])
    in_network = {
        "in_network_post_ids": np.array([[10**15, top, 10**15 + 1, 0]]),  # 0: padding
        "in_network_author_ids": np.array([[3, int(first["author_ids"][0, 0]), 3, 0]]),
    }
    (joined,) = retriever.handle(
        [
            {
                "user_embedding": out["user_embedding"],
                "top_k": np.array([[5]], np.int32),
                "excluded_post_ids": np.array([[10**15 + 1]]),
                **in_network,
            }
        ]
    )
    assert joined["post_ids"].tolist() == [[10**15, top, *first["post_ids"][0, 1:].tolist()]]
    assert joined["retrieval_scores"][0, 1] == first["retrieval_scores"][0, 0]
    assert joined["retrieval_scores"][0, 0] == retrieval.UNRETRIEVED_SCORE

    # the post ids or the author ids alone: that request refused, naming both; the other runs
    for sent, array in in_network.items():
        alone = {"user_embedding": out["user_embedding"], "top_k": np.array([[5]], np.int32)}
        refused, answered = retriever.handle([{**alone, sent: array}, alone])
        assert isinstance(refused, InputError), sent
        assert "'in_network_post_ids' and 'in_network_author_ids'" in str(refused)
        assert answered["post_ids"].tolist() == first["post_ids"].tolist()


def test_adapter_parameter_helpers():
    assert powers_of_two_up_to(8) == (1, 2, 4, 8)
    assert powers_of_two_up_to(6) == (1, 2, 4, 6)
    buckets = Parameter("candidate_buckets", "ints")
    assert buckets.parse("64, 16,1024") == (16, 64, 1024)
    assert buckets.text((16, 64)) == "16,64"
    with pytest.raises(ValueError, match="'candidate_buckets' must be a comma-separated"):
        buckets.parse("a,b")
    with pytest.raises(ValueError, match="'candidate_buckets' must list positive ints"):
        buckets.parse("0,8")


def settings(tiny_artifacts, model, max_batch, **texts):
    """Settings of ``model`` from its contract's defaults overridden by config ``texts``."""
    declared = contract(model).parameters
    defaults = {p.name: p.text(p.default) for p in declared if p.default is not None}
    return ServiceSettings.parsed(model, tiny_artifacts, max_batch, {**defaults, **texts})


def test_batch_buckets_must_reach_the_batch_size(tiny_artifacts):
    buckets = settings(tiny_artifacts, "ranker", 64, batch_buckets="64,1,8").batch_buckets
    assert buckets == (1, 8, 64)
    with pytest.raises(ValueError, match="must reach max_batch_size 64"):
        settings(tiny_artifacts, "ranker", 64, batch_buckets="1,8,32")


def test_a_missing_parameter_is_named(tiny_artifacts):
    with pytest.raises(ValueError, match="ranker: config parameters \\['batch_buckets'\\] are"):
        settings(tiny_artifacts, "ranker", 8)
    with pytest.raises(ValueError, match="no service for model 'nope'"):
        build_service(ServiceSettings("nope", tiny_artifacts, 8, {}))


def test_candidate_tower_program_has_rows_per_call_rows(tiny_artifacts):
    """The profiles' rows_per_call sets the rows of the tower's one compiled program."""
    cpu = build_service(settings(tiny_artifacts, "candidate_tower", 4096, rows_per_call="256"))
    gpu = build_service(settings(tiny_artifacts, "candidate_tower", 4096, rows_per_call="4096"))
    assert cpu.engine.candidate_chunk == 256
    assert gpu.engine.candidate_chunk == 4096
    posts, authors = np.arange(1, 301, dtype=np.int64), np.arange(301, 601, dtype=np.int64)
    np.testing.assert_allclose(gpu.embed(posts, authors), cpu.embed(posts, authors), atol=1e-5)


def test_requests_beyond_the_largest_bucket_run_in_groups(ranker, resources):
    """In-process callers may send more requests than one batch holds (Triton never does)."""
    rng = np.random.default_rng(6)
    many = [request(resources.config, rng, candidates=n) for n in (2, 3, 5, 7, 9)]
    together = ranker.handle(many)  # largest bucket 4: two groups
    for arrays, out in zip(many, together):
        (alone,) = ranker.handle([arrays])
        np.testing.assert_array_equal(alone["ranked_post_ids"], out["ranked_post_ids"])


@pytest.mark.parametrize("backend, big", [("cpu", "int8"), ("gpu", "float")])
def test_big_corpus_files_are_scored_as_int8_and_reranked_on_cpus_only(monkeypatch, backend, big):
    """Whatever this machine has: the backend JAX would run on is set by the test."""
    import jax

    from phoenix.stub.services.retrieval import INT8_MIN_ROWS, corpus_encoding

    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert corpus_encoding(INT8_MIN_ROWS - 1) == "float"
    assert corpus_encoding(INT8_MIN_ROWS) == big


def record_calls(service) -> list[tuple[int, int]]:
    """The (rows, candidates) shape of each call the service's DeviceRanker ranks, from now."""
    shapes, rank = [], service.ranker.rank

    def recorded(batch, rows=None):
        shapes.append(batch.candidate_post_ids.shape)
        return rank(batch, rows)

    service.ranker.rank = recorded
    return shapes


@pytest.mark.parametrize("split", [True, False])
def test_a_batch_of_mixed_widths_is_ranked_in_one_call_per_candidate_bucket(resources, split):
    """Candidate buckets (8, 32): requests of 3 and 5 candidates share an 8-wide call, the one of
    20 has its own 32-wide one; without split_widths the batch is one call padded to 32. Each
    answer equals the request ranked alone."""
    rng = np.random.default_rng(7)
    mixed = [request(resources.config, rng, candidates=n) for n in (3, 20, 5)]
    ranker = RankerService(
        resources, {"favorite": 1.0, "reply": 2.0}, candidate_buckets=(8, 32),
        batch_buckets=(1, 4), split_widths=split,
    )  # fmt: skip
    calls = record_calls(ranker)
    together = ranker.handle(mixed)
    assert calls == ([(4, 8), (1, 32)] if split else [(4, 32)])  # rows padded to bucket 4
    for arrays, out in zip(mixed, together):
        (alone,) = ranker.handle([arrays])
        np.testing.assert_array_equal(alone["ranked_post_ids"], out["ranked_post_ids"])
        np.testing.assert_allclose(alone["scores"], out["scores"], rtol=1e-6, atol=1e-6)


# -- the catalog: a host-only model's stub never imports JAX ---------------------------------


def test_the_catalog_names_each_service_by_its_contract():
    assert set(SERVED_BY_SERVICES) == set(CONTRACTS) - {RECOMMEND.name}  # all but the ensemble
    for model in SERVED_BY_SERVICES:
        assert service_class(model).model() == model
    with pytest.raises(ValueError, match="no service for model 'nothing'"):
        build_service(ServiceSettings("nothing", None, 1, {}))


HOST_ONLY = ("user_state", "feed_policy", "served_log")


def test_host_only_services_start_and_answer_without_importing_jax(tiny_artifacts):
    """What a stub of each host-only model runs (the adapter, the service built and warmed up)
    in a fresh interpreter: JAX stays out of it (it cost each such stub 0.8-0.9 CPU-s a start). The
    resources of a device service are the control: the check can fail."""
    script = f"""
import sys
from phoenix.schema import served
from phoenix.stub import triton_adapter
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings

for model in {HOST_ONLY!r}:
    texts = served.contract(model).parameter_texts({{}})  # the defaults
    settings = ServiceSettings.parsed(model, {str(tiny_artifacts)!r}, 8, texts)
    build_service(settings).warm_up()
    print(model, "jax" in sys.modules, len(triton_adapter.opened_program_stores()))
from phoenix.stub.services.resources import PhoenixResources

PhoenixResources({str(tiny_artifacts)!r}, ("ranker",))  # what a device service loads
print("resources", "jax" in sys.modules, len(triton_adapter.opened_program_stores()))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.split("\n")
    assert lines[:4] == [f"{m} False 0" for m in HOST_ONLY] + ["resources True 1"], done.stdout


def test_a_padding_candidate_ranked_among_a_requests_own_fails_the_batch(resources):
    """Padding sorts last unless a score is not finite: the split must not hand out padding
    (post id 0) as a ranked post."""
    config = resources.config
    rng = np.random.default_rng(3)
    parsed = [parse(RankerRequest, request(config, rng, candidates=n), config) for n in (3, 2)]
    batch = ranker_batch(parsed, config, users=2, width=4)
    scores = np.zeros((2, 4), np.float32)
    probs = np.zeros((2, 4, config.num_actions), np.float32)
    good = np.array([[2, 0, 1, 3], [1, 0, 2, 3]], np.int32)
    outputs = split_ranked(parsed, batch, RankedBatch(good, scores, probs))
    assert outputs[1]["ranked_post_ids"].shape == (1, 2)
    # the second user sent 2 candidates: its candidate 3 is padding, ranked first here
    padding_first = np.array([[2, 0, 1, 3], [3, 0, 1, 2]], np.int32)
    with pytest.raises(RuntimeError, match="padding candidate ranked among"):
        split_ranked(parsed, batch, RankedBatch(padding_first, scores, probs))
