"""Hostile input: property-based fuzzing of every served model over HTTP and gRPC.

Each example starts from a right request for one model and applies one to three mutations:
a missing input, an extra input, another dtype, another shape, hostile values (extremes, NaN,
infinities), another batch size, or boundary lengths (0, the limits, one past them). Every
answer must be right (outputs present, one row per request row, finite scores) or a client
error: HTTP 400 / gRPC INVALID_ARGUMENT. Never a hang (clients time out), never a server
error, never a dead stub. Raw HTTP bodies (broken JSON, lying sizes) must get a 400 too, or
the 500 with which Triton's own HTTP front end answers JSON it cannot parse (counted apart and
reported: it never reaches a model). Afterwards the server is ready, runs the same stubs, and
answers known-good requests exactly as before.

PHOENIX_LONG_TESTS=1 runs ten times the examples with a random seed. The number of cases run
is printed as a `RELIABILITY fuzz {json}` line (`pytest -s`).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.utils import InferenceServerException

from phoenix.checkpoint import load_corpus, load_example_sequence
from phoenix.client.client import (
    client_module,
    infer_inputs,
    ranker_inputs,
    recommend_inputs,
    user_inputs,
)
from phoenix.schema.contracts import REQUEST_ID
from phoenix.schema.served import contract
from phoenix.stub.registry import list_stubs
from phoenix.util.processes import is_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
LONG = os.environ.get("PHOENIX_LONG_TESTS") == "1"
TENSOR_EXAMPLES = 3000 if LONG else 300
RAW_EXAMPLES = 300 if LONG else 40
CLIENT_TIMEOUT_S = 30.0
MODELS = ("user_encoder", "candidate_tower", "retriever", "ranker", "recommend")
CLIENT_ERROR = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}
DTYPES = (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint64, np.float16, np.float32,
    np.float64, np.bool_, np.object_,
)  # fmt: skip
# Lengths at and around the documented limits (history 4096, candidates/top_k 1024).
BOUNDARY_LENGTHS = (0, 1, 2, 17, 1023, 1024, 1025, 4096, 4097)
HOSTILE_INTS = (0, -1, 1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 1025, 4097)
HOSTILE_FLOATS = (0.0, -0.0, -1.0, 1.0, 1e38, -1e38, float("nan"), float("inf"), float("-inf"))
EXTRA_NAMES = ("extra", "user_id", "top_k", "candidate_post_ids", "history_dwell_seconds", "")


def good_requests(artifacts: Path) -> dict[str, dict[str, np.ndarray]]:
    """One right request per model, from the artifacts' example sequence."""
    seq = load_example_sequence(artifacts).to_dict()
    corpus = load_corpus(artifacts / "corpus.npz")
    seq["candidate_post_ids"] = corpus.post_ids[:30].tolist()
    seq["candidate_author_ids"] = corpus.author_ids[:30].tolist()
    seq["candidate_product_surface"] = None
    embedding = corpus.embeddings[:1].astype(np.float32)
    return {
        "user_encoder": user_inputs(seq),
        "candidate_tower": {
            "post_id": corpus.post_ids[:3, None].astype(np.int64),
            "author_id": corpus.author_ids[:3, None].astype(np.int64),
        },
        "retriever": {
            "user_embedding": embedding,
            "top_k": np.array([[10]], np.int32),
            "history_post_ids": corpus.post_ids[None, :5].astype(np.int64),
        },
        "ranker": ranker_inputs(seq),
        "recommend": recommend_inputs(seq, top_k=20),
    }


# ----------------------------------------------------------------------------------------
# Mutations
# ----------------------------------------------------------------------------------------


def values_of(dtype, shape) -> st.SearchStrategy[np.ndarray]:
    """Arrays of `dtype` and `shape`, extremes included."""
    if dtype is np.object_:
        return hnp.arrays(object, shape, elements=st.binary(max_size=8))
    if dtype is np.bool_:
        return hnp.arrays(dtype, shape)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        ints = st.sampled_from([v for v in HOSTILE_INTS if info.min <= v <= info.max])
        return hnp.arrays(dtype, shape, elements=st.integers(info.min, info.max) | ints)
    with np.errstate(over="ignore"):  # 1e38 is infinity in float16: still hostile
        hostile = [float(np.dtype(dtype).type(v)) for v in HOSTILE_FLOATS]
    width = np.dtype(dtype).itemsize * 8
    return hnp.arrays(dtype, shape, elements=st.sampled_from(hostile) | st.floats(width=width))


small_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)


@st.composite
def mutated_request(draw, base: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], list]:
    """`base` with one to three mutations; returns the request and what was done."""
    arrays = dict(base)
    done = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(
            ["drop", "extra", "dtype", "shape", "values", "rows", "length"]
        ))  # fmt: skip
        names = sorted(arrays)
        if kind == "extra" or not names:
            name = draw(st.sampled_from(EXTRA_NAMES) | st.text("abcxyz_", min_size=1, max_size=12))
            if name in arrays or not name:
                name = f"{name}_extra"
            dtype = draw(st.sampled_from(DTYPES))
            arrays[name] = draw(values_of(dtype, draw(small_shapes)))
            done.append(("extra", name, str(np.dtype(dtype)), arrays[name].shape))
            continue
        name = draw(st.sampled_from(names))
        array = arrays[name]
        if kind == "drop":
            del arrays[name]
        elif kind == "dtype":
            dtype = draw(st.sampled_from(DTYPES))
            arrays[name] = draw(values_of(dtype, array.shape))
        elif kind == "shape":
            arrays[name] = draw(values_of(array.dtype.type, draw(small_shapes)))
        elif kind == "values":
            arrays[name] = draw(values_of(array.dtype.type, array.shape))
        elif kind == "rows" and array.ndim >= 1:
            rows = draw(st.sampled_from([0, 2, 3, 8, 9, 16, 17]))
            arrays[name] = np.repeat(array[:1], rows, axis=0)
        elif kind == "length" and array.ndim >= 2:
            length = draw(st.sampled_from(BOUNDARY_LENGTHS))
            shape = (array.shape[0], length, *array.shape[2:])
            arrays[name] = np.resize(array, shape) if array.size else np.zeros(shape, array.dtype)
        done.append((kind, name, str(arrays[name].dtype) if name in arrays else None,
                     arrays[name].shape if name in arrays else None))  # fmt: skip
    return arrays, done


# ----------------------------------------------------------------------------------------
# Sending and judging
# ----------------------------------------------------------------------------------------


def send(client, protocol: str, model: str, arrays: dict[str, np.ndarray]):
    """Infer with every output requested; returns the result object."""
    tensors = infer_inputs(client_module(protocol), arrays)
    extra = {"client_timeout": CLIENT_TIMEOUT_S} if protocol == "grpc" else {}
    return client.infer(model, tensors, **extra)


def check_right_answer(result, arrays, outputs: list[dict], model: str) -> None:
    """Every output present, one row per request row, no NaN or infinity."""
    rows = next(iter(arrays.values())).shape[0] if arrays else 0
    for spec in outputs:
        value = result.as_numpy(spec["name"])
        assert value is not None, f"{model}: output {spec['name']} missing"
        assert value.shape[0] == rows, f"{model}: {spec['name']} has {value.shape[0]} rows"
        if value.dtype.kind == "f":
            assert np.isfinite(value).all(), f"{model}: {spec['name']} is not finite"


def judge(client, protocol: str, model: str, arrays, outputs, tally: Counter) -> None:
    try:
        result = send(client, protocol, model, arrays)
    except InferenceServerException as error:
        message = str(error)
        if error.status() is None:  # tritonclient refused to build it: nothing was sent
            tally["refused_by_client"] += 1
            return
        assert "not healthy" not in message, f"dead stub: {message}"
        assert error.status() == CLIENT_ERROR[protocol], (
            f"{model} over {protocol}: expected a client error, got {error.status()}: {message}"
        )
        tally["client_error"] += 1
        return
    check_right_answer(result, arrays, outputs, model)
    tally["answered"] += 1


def post_raw(http_url: str, model: str, body: bytes, headers: dict[str, str]) -> tuple[int, str]:
    """(HTTP status, body) of an inference POST with a body of our own."""
    request = urllib.request.Request(
        f"http://{http_url}/v2/models/{model}/infer", data=body, method="POST", headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


# Triton 2.51's HTTP front end answers 500 (not 400) when it cannot parse the JSON header of a
# request; the request never reaches a model.
TRITON_JSON_PARSE_500 = ("failed to parse the request JSON buffer", "Unable to parse")


def judge_raw(status: int, text: str, model: str, tally: Counter) -> None:
    if status == 500 and any(marker in text for marker in TRITON_JSON_PARSE_500):
        tally["raw_http_json_parse_500"] += 1
        return
    assert status == 400, f"{model}: raw body answered {status}: {text[:300]}"
    tally["raw_http_400"] += 1


@st.composite
def raw_body(draw) -> tuple[bytes, dict[str, str]]:
    """Broken JSON, JSON of the wrong form, or a binary body whose sizes lie."""
    kind = draw(st.sampled_from(["bytes", "json", "binary"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200)), {}
    if kind == "json":
        payload = {
            "inputs": [{
                "name": draw(st.sampled_from(["user_id", "top_k", "post_id", "x"])),
                "shape": draw(st.lists(st.integers(-2, 5), max_size=3)),
                "datatype": draw(st.sampled_from(["INT64", "FP32", "BYTES", "NOPE"])),
                "data": draw(st.lists(st.integers(-5, 5) | st.text(max_size=3), max_size=6)),
            }]
        }  # fmt: skip
        return json.dumps(payload).encode(), {}
    header = json.dumps({
        "inputs": [{"name": "user_id", "shape": [1, 1], "datatype": "INT64",
                    "parameters": {"binary_data_size": draw(st.integers(0, 64))}}]
    }).encode()  # fmt: skip
    tail = draw(st.binary(max_size=64))
    length = len(header) + draw(st.integers(-8, 8))
    return header + tail, {"Inference-Header-Content-Length": str(length)}


# ----------------------------------------------------------------------------------------
# The test
# ----------------------------------------------------------------------------------------


def fuzz_settings(examples: int):
    return settings(
        max_examples=examples,
        deadline=None,  # server latency varies with what else runs on the machine
        derandomize=not LONG,  # the short run is the same every time
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )  # fmt: skip


def answers(server, requests: dict[str, dict[str, np.ndarray]]) -> dict[str, dict]:
    client = client_module("http").InferenceServerClient(server.http_url)
    try:
        out = {}
        for model in ("ranker", "recommend"):
            result = send(client, "http", model, requests[model])
            out[model] = {o["name"]: result.as_numpy(o["name"]) for o in
                          result.get_response()["outputs"]}  # fmt: skip
        return out
    finally:
        client.close()


def test_hostile_inputs_get_right_answers_or_client_errors(start_server, tiny_artifacts):
    server = start_server(MODEL_REPOSITORY, tiny_artifacts, exit_timeout_secs=5)
    requests = good_requests(tiny_artifacts)
    reference = answers(server, requests)
    stubs_before = sorted(list_stubs(server.pid), key=lambda s: s.instance)
    assert len(stubs_before) >= len(MODELS) - 1, stubs_before  # every stub model registered
    clients = {
        "http": client_module("http").InferenceServerClient(
            server.http_url, connection_timeout=CLIENT_TIMEOUT_S, network_timeout=CLIENT_TIMEOUT_S
        ),
        "grpc": client_module("grpc").InferenceServerClient(server.grpc_url),
    }
    # every output the artifacts answer: the production family's own are optional outputs
    answered = {m: {s.name for s in contract(m).outputs if not s.optional} for m in MODELS}
    outputs = {
        m: [o for o in clients["http"].get_model_config(m)["output"] if o["name"] in answered[m]]
        for m in MODELS
    }
    tally: Counter = Counter()

    @fuzz_settings(TENSOR_EXAMPLES)
    @given(data=st.data())
    def fuzz_tensors(data):
        model = data.draw(st.sampled_from(MODELS))
        protocol = data.draw(st.sampled_from(["http", "grpc"]))
        arrays, _done = data.draw(mutated_request(requests[model]))
        judge(clients[protocol], protocol, model, arrays, outputs[model], tally)
        tally[f"{protocol}_cases"] += 1

    @fuzz_settings(RAW_EXAMPLES)
    @given(model=st.sampled_from(MODELS), body=raw_body())
    def fuzz_raw_http(model, body):
        judge_raw(*post_raw(server.http_url, model, *body), model, tally)

    try:
        fuzz_tensors()
        fuzz_raw_http()
    finally:
        for client in clients.values():
            client.close()

    print(f"RELIABILITY fuzz {json.dumps(dict(sorted(tally.items())))}", flush=True)
    assert server.is_ready()
    stubs_after = sorted(list_stubs(server.pid), key=lambda s: s.instance)
    assert stubs_after == stubs_before and all(is_alive(s.pid) for s in stubs_after)
    after = answers(server, requests)
    for model, outputs_ in reference.items():
        for name, value in outputs_.items():
            if name == REQUEST_ID.name:
                continue  # a new id per request by design
            np.testing.assert_allclose(after[model][name], value, rtol=1e-5, atol=1e-6)
