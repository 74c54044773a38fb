"""The Triton adapter (phoenix/stub/triton_adapter.py) without a server: a fake
``triton_python_backend_utils`` stands in for the stub's module. A refused request gets
INVALID_ARG alone, a failing batch INTERNAL for each request, the good requests beside a
refused one their outputs; the refusals and failures are counted on the adapter's metrics."""

from __future__ import annotations

import gc
import json
import os
import pstats
import re
import sys
import threading
import time
import types
from collections import defaultdict

import numpy as np
import pytest
from google.protobuf.json_format import MessageToDict

from phoenix.checkpoint.identity import ArtifactMismatch, artifact_version, config_digest
from phoenix.client.client import model_inputs
from phoenix.corpus_store import CorpusStore, Posts, StoreFollower
from phoenix.feed_policy import FILTERS
from phoenix.ops.configs import model_config
from phoenix.ops.profiles import profile
from phoenix.schema.contracts import FEED_POLICY
from phoenix.stub.corpus import FollowedStore
from phoenix.stub.request_metrics import (
    CANDIDATES,
    DROPPED,
    FAILED,
    GENERATION,
    IN_NETWORK,
    LAG,
    REFUSED,
    SERVED,
    SKIPPED,
    STUB,
    WHOLE_REQUEST,
    CorpusMetrics,
)
from phoenix.stub.triton_adapter import ServiceModel

MODEL = FEED_POLICY.name  # numpy only: the quickest service to start


# ----------------------------------------------------------------------------------------
# The fake stub module
# ----------------------------------------------------------------------------------------


def only_version(metrics, family: str) -> str:
    """The one version label of ``family``'s series."""
    (version,) = {dict(labels)["version"] for labels in metrics.series(family)}
    return version


class FakeMetrics:
    """What Triton's /metrics would show: {(family, sorted labels): value}; families and
    metrics of one name and labels are shared, as Triton shares them between instances."""

    def __init__(self):
        self.values: dict[tuple, float] = defaultdict(float)
        self.calls: dict[tuple, int] = defaultdict(int)  # increments and sets: round trips
        self.descriptions: dict[str, str] = {}

    def value(self, family: str, **labels: str) -> float:
        """The sum over the stubs' series of ``labels`` (Prometheus' ``sum by``)."""
        key = tuple(sorted(labels.items()))
        series = self.series(family)
        assert key in series, f"no series {family}{key}; have {sorted(series)}"
        return series[key]

    def series(self, family: str) -> dict[tuple, float]:
        """{labels but the stub's: the sum of those series}; each series names its stub."""
        summed: dict[tuple, float] = defaultdict(float)
        for (name, labels), value in self.values.items():
            if name == family:
                assert STUB in dict(labels), f"{name}{labels} names no stub"
                summed[tuple((k, v) for k, v in labels if k != STUB)] += value
        return dict(summed)


def fake_backend_utils(metrics: FakeMetrics, with_metrics: bool = True) -> types.ModuleType:
    module = types.ModuleType("triton_python_backend_utils")

    class Metric:
        def __init__(self, key, kind: str):
            self.key, self.kind = key, kind
            metrics.values[key] += 0.0  # the series exists from its creation

        def increment(self, value: float) -> None:
            assert self.kind == MetricFamily.COUNTER and value >= 0, (self.key, value)
            metrics.values[self.key] += value
            metrics.calls[self.key] += 1

        def set(self, value: float) -> None:
            assert self.kind == MetricFamily.GAUGE, self.key
            metrics.values[self.key] = value
            metrics.calls[self.key] += 1

    class MetricFamily:
        COUNTER, GAUGE = "counter", "gauge"

        def __init__(self, name: str, description: str, kind: str):
            assert kind in (MetricFamily.COUNTER, MetricFamily.GAUGE)
            assert (name.endswith("_total")) == (kind == MetricFamily.COUNTER), name
            assert metrics.descriptions.setdefault(name, description) == description
            self.name, self.kind = name, kind

        def Metric(self, labels: dict[str, str]):  # noqa: N802 - the stub's name
            assert all(isinstance(v, str) for v in labels.values()), labels
            return Metric((self.name, tuple(sorted(labels.items()))), self.kind)

    class TritonError:
        INVALID_ARG, INTERNAL = "INVALID_ARG", "INTERNAL"

        def __init__(self, message: str, code: str = "INTERNAL"):
            self._message, self._code = message, code

        def message(self) -> str:
            return self._message

        def code(self) -> str:
            return self._code

    class Tensor:
        def __init__(self, name: str, array: np.ndarray):
            self.name, self.array = name, array

        @classmethod
        def from_dlpack(cls, name: str, buffer) -> Tensor:
            return cls(name, np.array(np.from_dlpack(buffer)))

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.outputs = {t.name: t.array for t in output_tensors}
            self.error = error

    for value in (MetricFamily, TritonError, Tensor, InferenceResponse):
        if value is not MetricFamily or with_metrics:
            setattr(module, value.__name__, value)
    return module


class InputTensor:
    """A request tensor as the stub hands it over: name(), is_cpu() and DLPack."""

    def __init__(self, name: str, array: np.ndarray):
        self._name, self._array = name, np.ascontiguousarray(array)

    def name(self) -> str:
        return self._name

    def is_cpu(self) -> bool:
        return True

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class Request:
    def __init__(self, arrays: dict[str, np.ndarray]):
        self._inputs = [InputTensor(name, array) for name, array in arrays.items()]

    def inputs(self):
        return self._inputs


# ----------------------------------------------------------------------------------------
# A model instance, initialized as Triton initializes it
# ----------------------------------------------------------------------------------------


def triton_args(tiny_artifacts, digest: str = "") -> dict[str, str]:
    """``initialize``'s args: the model config in JSON form, as Triton passes it."""
    config = MessageToDict(
        model_config(FEED_POLICY, profile("cpu")), preserving_proto_field_name=True
    )
    config["parameters"]["artifact_dir"] = {"string_value": str(tiny_artifacts)}
    config["parameters"]["config_digest"] = {"string_value": digest}
    return {
        "model_config": json.dumps(config),
        "model_repository": str(tiny_artifacts),
        "model_instance_kind": "CPU",
        "model_instance_name": f"{MODEL}_0",
    }


@pytest.fixture
def metrics(monkeypatch):
    metrics = FakeMetrics()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_backend_utils(metrics))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # initialize sets it; restored after the test
    monkeypatch.delenv("PHOENIX_STUB_DIR", raising=False)
    return metrics


@pytest.fixture(autouse=True)
def unfrozen_heap():
    """finalize() freezes the heap (the stub process exits next); this process goes on."""
    yield
    gc.unfreeze()


class PolicyModel(ServiceModel):
    """model.py of MODEL: the adapter, nothing else."""

    service_name = MODEL


def started_model(tiny_artifacts, digest: str = "") -> PolicyModel:
    """An instance of MODEL, initialized as Triton initializes it."""
    instance = PolicyModel()
    instance.initialize(triton_args(tiny_artifacts, digest))
    return instance


@pytest.fixture
def model(metrics, tiny_artifacts):
    instance = started_model(tiny_artifacts)
    instance.service_artifacts = tiny_artifacts  # what its version label is made of
    yield instance
    instance.finalize()


def policy_request(rng, num_actions: int, candidates: int = 6, **changes) -> dict:
    values = {
        "user_id": 7,
        "candidate_post_ids": rng.integers(1, 10**9, candidates).tolist(),
        "candidate_author_ids": rng.integers(1, 50, candidates).tolist(),
        "candidate_action_probs": rng.random((candidates, num_actions)).tolist(),
        **changes,
    }
    return model_inputs(MODEL, values)


# ----------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------


def test_refused_requests_get_invalid_arg_alone_and_are_counted(model, metrics):
    rng = np.random.default_rng(0)
    actions = model.service.config.num_actions
    good = [policy_request(rng, actions), policy_request(rng, actions, candidates=9)]
    bad_probs = policy_request(rng, actions)
    bad_probs["candidate_action_probs"][0, 0, 0] = 1.5  # probabilities lie in [0, 1]
    two_rows = policy_request(rng, actions)
    two_rows["seen_post_ids"] = np.zeros((2, 3), np.int64)  # a filter of 2 rows, 1 user
    batch = [good[0], bad_probs, good[1], two_rows]

    responses = model.execute([Request(arrays) for arrays in batch])

    assert [r.error.code() if r.error else None for r in responses] == [
        None, "INVALID_ARG", None, "INVALID_ARG",
    ]  # fmt: skip
    assert "candidate_action_probs" in responses[1].error.message()
    assert "rows" in responses[3].error.message()
    for response, arrays in zip((responses[0], responses[2]), good):
        (alone,) = model.service.handle([arrays])
        assert set(response.outputs) == {spec.name for spec in FEED_POLICY.outputs}
        for spec in FEED_POLICY.outputs:
            assert response.outputs[spec.name].dtype == spec.dtype
            np.testing.assert_array_equal(response.outputs[spec.name], alone[spec.name])

    # every series names the model and its artifacts' version (none in config.json: content)
    version = artifact_version(model.service_artifacts)
    assert re.fullmatch(r"sha256-[0-9a-f]{12}", version)
    assert metrics.value(REFUSED, model=MODEL, version=version, input="candidate_action_probs") == 1
    assert metrics.value(REFUSED, model=MODEL, version=version, input=WHOLE_REQUEST) == 1
    assert metrics.value(FAILED, model=MODEL, version=version) == 0
    # every input's series exists from the start, at 0 until a refusal names it
    inputs = (*FEED_POLICY.input_names, WHOLE_REQUEST)
    expected = {(("input", name), ("model", MODEL), ("version", version)) for name in inputs}
    assert set(metrics.series(REFUSED)) == expected
    assert metrics.value(REFUSED, model=MODEL, version=version, input="user_id") == 0


def test_a_failing_batch_answers_internal_for_each_of_its_requests_and_counts_them(
    model, metrics, monkeypatch
):
    rng = np.random.default_rng(1)
    actions = model.service.config.num_actions

    def broken(requests):
        raise RuntimeError("the engine broke")

    monkeypatch.setattr(model.service, "run", broken)
    responses = model.execute([Request(policy_request(rng, actions)) for _ in range(3)])

    assert [r.error.code() for r in responses] == ["INTERNAL"] * 3
    assert all("RuntimeError: the engine broke" in r.error.message() for r in responses)
    assert all(r.outputs == {} for r in responses)
    assert metrics.value(FAILED, model=MODEL, version=only_version(metrics, FAILED)) == 3
    assert sum(metrics.series(REFUSED).values()) == 0


def test_answers_count_their_posts_the_in_network_ones_and_each_filters_drops(model, metrics):
    rng = np.random.default_rng(4)
    actions = model.service.config.num_actions
    posts = [11, 12, 13, 13, 14, 15, 16, 17]  # 13 twice: one duplicate dropped
    first = policy_request(
        rng,
        actions,
        candidates=8,
        candidate_post_ids=posts,
        candidate_author_ids=[1, 2, 3, 3, 4, 5, 6, 8],  # the user (7) wrote none
        seen_post_ids=[15, 16],  # two seen
        excluded_author_ids=[8],  # one excluded
        in_network_post_ids=[11, 14, 99],  # two of the candidates in-network
    )
    second = policy_request(rng, actions, candidates=5)  # nothing dropped, nothing in-network
    responses = model.execute([Request(first), Request(second)])

    (version,) = {dict(labels)["version"] for labels in metrics.series(SERVED)}
    labels = dict(model=MODEL, version=version)
    assert metrics.value(SERVED, **labels) == 2
    assert metrics.value(CANDIDATES, **labels) == (8 - 4) + 5
    assert metrics.value(IN_NETWORK, **labels) == 2
    dropped = {f: metrics.value(DROPPED, **labels, filter=f) for f in FILTERS}
    assert dropped == {"duplicate": 1, "own_post": 0, "excluded_author": 1, "seen": 2, "too_old": 0}
    # the counters agree with what the answers say
    ranked = [r.outputs["ranked_post_ids"] for r in responses]
    assert metrics.value(CANDIDATES, **labels) == sum(np.count_nonzero(r) for r in ranked)
    counts = sum(r.outputs["filtered_counts"].sum(0) for r in responses)
    assert [dropped[f] for f in FILTERS] == counts.tolist()


def test_a_batch_moves_each_served_counter_once_by_its_sum(model, metrics):
    """An increment is a round trip to the server: once per batch, not once per request."""
    rng = np.random.default_rng(5)
    actions = model.service.config.num_actions
    batch = [
        policy_request(rng, actions, candidates=6, seen_post_ids=[1], in_network_post_ids=[2])
        for _ in range(5)
    ]
    batch[0]["candidate_post_ids"][0, :2] = [1, 2]  # one seen, one in-network
    batch[1]["candidate_post_ids"][0, :2] = [1, 2]
    model.execute([Request(arrays) for arrays in batch])
    for family in (SERVED, CANDIDATES, IN_NETWORK, DROPPED):
        moved = {key: n for key, n in metrics.calls.items() if key[0] == family}
        assert moved and max(moved.values()) == 1, (family, moved)
    (version,) = {dict(labels)["version"] for labels in metrics.series(SERVED)}
    labels = dict(model=MODEL, version=version)
    assert metrics.value(SERVED, **labels) == 5
    assert metrics.value(CANDIDATES, **labels) == 5 * 6 - 2  # the two seen dropped
    assert metrics.value(IN_NETWORK, **labels) == 2
    assert metrics.value(DROPPED, **labels, filter="seen") == 2


def store_posts(first_id: int, n: int = 10, emb_size: int = 4) -> Posts:
    vectors = np.eye(emb_size, dtype=np.float32)[np.arange(n) % emb_size]  # unit rows
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    return Posts(ids, ids % 7 + 1, np.zeros(n, np.int64), vectors)


def test_a_followed_store_shows_its_generation_lag_and_skipped_generations(metrics, tmp_path):
    store = CorpusStore.create(tmp_path / "store", 4)
    store.add(store_posts(1))
    corpus = FollowedStore(StoreFollower(tmp_path / "store", 4, on_error=lambda message: None))
    gauges = CorpusMetrics(sys.modules["triton_python_backend_utils"], "retriever", "3", corpus)
    generation = corpus.follower.current().generation
    assert metrics.value(GENERATION, model="retriever", version="3") == generation
    assert metrics.value(LAG, model="retriever", version="3") == 0
    assert metrics.value(SKIPPED, model="retriever", version="3") == 0
    entry = store.add(store_posts(101))
    (tmp_path / "store" / "segments" / entry.name / "post_ids.npy").unlink()  # a torn copy
    corpus.follower.refresh()
    gauges.update()
    assert (
        metrics.value(GENERATION, model="retriever", version="3") == generation
    )  # still the good one
    assert metrics.value(SKIPPED, model="retriever", version="3") == 1
    waited = metrics.value(
        LAG, model="retriever", version="3"
    )  # since the torn generation was written
    assert 0 <= waited < 60 and corpus.follower.lag_seconds(now=time.time() + 60) >= 60
    gauges.close()


def test_gauges_are_set_again_only_when_their_value_changes(metrics, tmp_path):
    """A set is a round trip to the server: after each batch, only the gauges that moved."""
    store = CorpusStore.create(tmp_path / "store", 4)
    store.add(store_posts(1))
    corpus = FollowedStore(StoreFollower(tmp_path / "store", 4, on_error=lambda message: None))
    gauges = CorpusMetrics(sys.modules["triton_python_backend_utils"], "retriever", "3", corpus)
    sets = lambda name: sum(n for key, n in metrics.calls.items() if key[0] == name)  # noqa: E731
    assert [sets(name) for name in (GENERATION, LAG, SKIPPED)] == [1, 1, 1]  # the first update
    for _ in range(3):
        gauges.update()  # nothing changed
    assert [sets(name) for name in (GENERATION, LAG, SKIPPED)] == [1, 1, 1]
    store.add(store_posts(101))
    corpus.follower.refresh()
    gauges.update()
    assert (
        metrics.value(GENERATION, model="retriever", version="3")
        == corpus.follower.current().generation
    )
    assert sets(GENERATION) == 2 and sets(SKIPPED) == 1
    gauges.close()


def test_a_corpus_file_shows_no_store_gauges(model, metrics):
    actions = model.service.config.num_actions
    (answer,) = model.execute([Request(policy_request(np.random.default_rng(5), actions))])
    assert answer.error is None
    assert GENERATION not in {name for name, _ in metrics.values}  # the policy's corpus file


def test_instances_of_a_model_add_to_the_same_series(metrics, tiny_artifacts):
    rng = np.random.default_rng(2)

    first, second = started_model(tiny_artifacts), started_model(tiny_artifacts)
    actions = first.service.config.num_actions
    refused = policy_request(rng, actions, candidate_author_ids=[-1] * 6)  # ids must be >= 0
    first.execute([Request(refused)])
    second.execute([Request(refused), Request(refused)])
    for instance in (first, second):
        instance.finalize()
    version = only_version(metrics, REFUSED)
    assert metrics.value(REFUSED, model=MODEL, version=version, input="candidate_author_ids") == 3


def test_the_adapter_serves_without_custom_metrics(monkeypatch, tiny_artifacts):
    """A Triton without MetricFamily (or with metrics off): answers as before, counts nothing."""
    metrics = FakeMetrics()
    utils = fake_backend_utils(metrics, with_metrics=False)
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", utils)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("PHOENIX_STUB_DIR", raising=False)
    instance = started_model(tiny_artifacts)
    rng = np.random.default_rng(3)
    actions = instance.service.config.num_actions
    refused = policy_request(rng, actions, candidate_author_ids=[-1] * 6)
    good, bad = instance.execute([Request(policy_request(rng, actions)), Request(refused)])
    instance.finalize()
    assert good.error is None and set(good.outputs) == {s.name for s in FEED_POLICY.outputs}
    assert bad.error.code() == "INVALID_ARG" and "candidate_author_ids" in bad.error.message()
    assert metrics.values == {}


def test_an_instance_refuses_artifacts_its_config_does_not_state(metrics, tiny_artifacts):
    """The served config's config_digest is what clients trust: it must be true."""
    started_model(tiny_artifacts, config_digest(tiny_artifacts))
    with pytest.raises(ArtifactMismatch, match=str(tiny_artifacts)):
        started_model(tiny_artifacts, "0" * 64)


class WatchedStart(PolicyModel):
    """MODEL's instance that says which thread is inside its start-up's work (``_initialize``,
    which ``initialize`` runs with the collector disabled)."""

    starting: set[int] = set()

    def _initialize(self, args) -> None:
        self.starting.add(threading.get_ident())
        try:
            super()._initialize(args)
        finally:
            self.starting.discard(threading.get_ident())


def test_start_up_collects_nothing_then_freezes_what_it_made(metrics, tiny_artifacts):
    """No collector pass while an instance starts; once ready, its objects are frozen and the
    collector runs again; a failed start leaves the collector running too.

    A gc callback sees every pass of the process: one due before ``initialize`` disables the
    collector (the allocations of this test's own set-up), one after it enables it again, or
    one another thread starts, is none of the start-up's. Only the passes that start in the
    starting thread inside its work count. The collector's generation-0 count is brought
    to one allocation short of a pass first, so that a start-up that let it run would
    certainly be caught (its thousands of allocations would start one)."""
    passes = []

    def count(phase, info):
        if phase == "start" and threading.get_ident() in WatchedStart.starting:
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        gc.unfreeze()
        args = triton_args(tiny_artifacts)
        instance = WatchedStart()
        threshold = gc.get_threshold()[0]
        due = [[] for _ in range(max(threshold - gc.get_count()[0] - 1, 0))]  # kept alive
        instance.initialize(args)  # thousands of allocations: passes were due
        del due
        assert passes == []
        assert gc.isenabled() and gc.get_freeze_count() > 0
        gc.unfreeze()
        with pytest.raises(ArtifactMismatch):
            started_model(tiny_artifacts, "0" * 64)
        assert gc.isenabled()
    finally:
        gc.callbacks.remove(count)


def test_finalize_freezes_the_heap_so_the_stub_exits_without_walking_it(metrics, tiny_artifacts):
    instance = started_model(tiny_artifacts)
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    instance.finalize()
    assert gc.get_freeze_count() > 0  # objects an exiting interpreter's collections skip


# ---- JAX's platforms in a GPU instance's stub ----


@pytest.mark.parametrize(
    ("platforms", "expected"),
    [("cuda", "cuda,cpu"), ("cuda,cpu", "cuda,cpu"), ("cpu", "cpu"), (" cuda , ", "cuda,cpu")],
)
def test_a_gpu_stub_keeps_the_host_platform_its_outputs_need(platforms, expected):
    from phoenix.stub.triton_adapter import with_host_platform

    assert with_host_platform(platforms) == expected


def test_configure_adds_the_host_platform_for_gpu_instances_only(monkeypatch):
    from phoenix.stub.triton_adapter import configure_jax_environment

    for name in ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.setenv(name, "")  # recorded, so the test's values are undone after it
        monkeypatch.delenv(name)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    configure_jax_environment("GPU", "1")
    assert (os.environ["JAX_PLATFORMS"], os.environ["CUDA_VISIBLE_DEVICES"]) == ("cuda,cpu", "1")
    monkeypatch.delenv("JAX_PLATFORMS")
    configure_jax_environment("GPU", "0")
    assert "JAX_PLATFORMS" not in os.environ  # unset: JAX starts every platform it has
    configure_jax_environment("CPU", "0")
    assert os.environ["JAX_PLATFORMS"] == "cpu"


# ---- profiling a stub's executions (PHOENIX_STUB_PROFILE) ----


def test_a_stub_profiles_its_executions_when_asked_and_writes_them_at_the_end(
    metrics, tiny_artifacts, tmp_path, monkeypatch
):
    from phoenix.stub.profile import PROFILE_ENV

    monkeypatch.setenv(PROFILE_ENV, str(tmp_path / "profiles"))
    instance = started_model(tiny_artifacts)
    rng = np.random.default_rng(6)
    actions = instance.service.config.num_actions
    for batch in (3, 1):
        instance.execute([Request(policy_request(rng, actions)) for _ in range(batch)])
    instance.finalize()
    (summary,) = (tmp_path / "profiles").glob("*.txt")
    assert summary.name.startswith(f"{MODEL}_0-") and summary.with_suffix(".prof").is_file()
    text = summary.read_text()
    assert text.startswith(f"{MODEL}_0: 2 executions, 4 requests (2.0 per execution)")
    assert "tottime" in text  # the table of the functions with the most time of their own
    # the service's and the adapter's work were profiled (the raw statistics: which of them
    # make the summary's top functions depends on the machine's speed)
    profiled = {name for _, _, name in pstats.Stats(str(summary.with_suffix(".prof"))).stats}
    assert {"handle", "host_buffers"} <= profiled


def test_a_stub_profiles_nothing_unless_asked(metrics, tiny_artifacts, monkeypatch):
    from phoenix.stub.profile import PROFILE_ENV

    monkeypatch.delenv(PROFILE_ENV, raising=False)
    instance = started_model(tiny_artifacts)
    assert instance.profile is None  # execute runs as it always did
    actions = instance.service.config.num_actions
    (answer,) = instance.execute([Request(policy_request(np.random.default_rng(7), actions))])
    assert answer.error is None
    instance.finalize()


def test_served_counts_are_sent_at_most_once_a_flush_interval_and_none_is_lost(metrics):
    from phoenix.stub.request_metrics import FLUSH_INTERVAL_S, ServedMetrics

    now = [100.0]
    served = ServedMetrics(
        sys.modules["triton_python_backend_utils"], "ranker", "1", ["ranked_post_ids"],
        clock=lambda: now[0],
    )  # fmt: skip
    answer = {"ranked_post_ids": np.array([[5, 6, 0]])}  # two posts and padding

    def shown():
        return metrics.value(SERVED, model="ranker", version="1"), metrics.value(
            CANDIDATES, model="ranker", version="1"
        )

    served.count([answer])
    assert shown() == (1, 2)  # the first batch at once
    served.count([answer, answer])
    now[0] += FLUSH_INTERVAL_S / 2
    served.count([answer])
    assert shown() == (1, 2)  # held back: each send is a round trip
    now[0] += FLUSH_INTERVAL_S / 2
    served.count([answer])
    assert shown() == (5, 10)  # the interval passed: everything counted so far
    served.count([answer])
    served.close()  # the instance ends
    assert shown() == (6, 12)
    calls = {key[0]: n for key, n in metrics.calls.items()}
    assert calls == {SERVED: 3, CANDIDATES: 3}


def test_prefix_cache_counts_are_sent_as_served_counts_are_and_none_is_lost(metrics, monkeypatch):
    from phoenix.engine.prefix_cache import PrefixCache
    from phoenix.stub.request_metrics import (
        CACHE_BYTES,
        CACHE_EVICTIONS,
        CACHE_HITS,
        CACHE_MISSES,
        FLUSH_INTERVAL_S,
        METRICS_INTERVAL_ENV,
        PrefixCacheMetrics,
    )

    pb = sys.modules["triton_python_backend_utils"]
    now = [100.0]
    cache = PrefixCache(100, ttl_s=60, version="1", clock=lambda: now[0])
    shown = PrefixCacheMetrics(pb, "ranker", "1", cache, clock=lambda: now[0])
    labels = dict(model="ranker", version="1")

    def values():
        reasons = [
            metrics.value(CACHE_EVICTIONS, **labels, reason=why) for why in ("budget", "expired")
        ]
        hits, misses = metrics.value(CACHE_HITS, **labels), metrics.value(CACHE_MISSES, **labels)
        return hits, misses, *reasons, metrics.value(CACHE_BYTES, **labels)

    assert values() == (0, 0, 0, 0, 0)  # every series from the start
    for user in range(4):  # the fourth evicts the first
        cache.get(user)
        cache.put(user, user, 30)
    cache.get(3)
    now[0] += FLUSH_INTERVAL_S / 2
    shown.update()
    assert values() == (0, 0, 0, 0, 0)  # held back: each send is a round trip
    now[0] += FLUSH_INTERVAL_S / 2
    shown.update()
    assert values() == (1, 4, 1, 0, 90)
    now[0] += 60  # every entry expires
    cache.get(3)
    shown.close()  # the instance ends: nothing counted is lost
    assert values() == (1, 5, 1, 3, 0)
    assert metrics.value(CACHE_EVICTIONS, **labels, reason="version") == 0
    # no cache (off, or a model without one): no series
    PrefixCacheMetrics(pb, "retriever", "1", None)
    assert "retriever" not in {dict(k)["model"] for k in metrics.series(CACHE_HITS)}
    # an interval of 0 sends after every batch
    monkeypatch.setenv(METRICS_INTERVAL_ENV, "0")
    every = PrefixCacheMetrics(pb, "ranker_now", "1", cache, clock=lambda: now[0])
    cache.get(3)
    every.update()
    assert metrics.value(CACHE_MISSES, model="ranker_now", version="1") == 6
    monkeypatch.setenv(METRICS_INTERVAL_ENV, "soon")
    with pytest.raises(ValueError, match=METRICS_INTERVAL_ENV):
        PrefixCacheMetrics(pb, "ranker_bad", "1", cache)
