"""Overload: at about twice its capacity the server refuses the excess fast, and the requests
it accepts keep a bounded latency (the queue policy in every model's dynamic_batching block).

Capacity is measured first with a closed loop; then requests are due at a fixed rate (open
loop) of twice the capacity (three times if twice refused nothing). Requests are server-heavy
(1024 candidates for the ranker, top_k 500 through the ensemble) so a Python client on a
2-core machine can offer that much.

- `ranker` alone (the short test): one queue, so every refusal is immediate.
- `recommend` (long only): the ensemble's composing models share the request path; a request
  refused by a later step (the ranker's queue is full) has already waited in the earlier
  steps, so some refusals take as long as those waits (docs/reliability.md).

PHOENIX_LONG_TESTS=1 runs longer, both workloads, both protocols. Figures are printed as
`RELIABILITY overload {json}` lines (`pytest -s`). The tests assert properties (no error other
than a refusal, refusals faster than accepted requests, accepted latency bounded by the queue
timeout plus the service time measured in the same test); absolute latency figures belong to
benchmarks (`make bench-reliability`, `make bench-serving`), not to tests that must hold on a
busy machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from harness.loadgen import Caller, LoadRun, measure_capacity, percentiles_ms
from harness.triton import start_triton
from phoenix.checkpoint import load_example_sequence
from phoenix.client.client import ranker_inputs, recommend_inputs, user_inputs

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_REPOSITORY = REPO_ROOT / "model_repository"
LONG = os.environ.get("PHOENIX_LONG_TESTS") == "1"
# gRPC requests are sent asynchronously from one thread; HTTP ones from a pool of threads,
# whose client CPU (and GIL) on a 2-core machine slows the server and inflates refusal times.
CASES = (
    [("ranker", p) for p in ("grpc", "http")] + [("recommend", p) for p in ("grpc", "http")]
    if LONG
    else [("ranker", "grpc")]
)
# Twice the capacity; three times when nothing was refused at twice (a closed loop
# underestimates capacity when the batcher stalls now and then, see the xfail test below).
OVERLOAD_FACTORS = (2.0, 3.0)
CAPACITY_S = 6.0
OVERLOAD_S = 45.0 if LONG else 12.0
CAPACITY_WORKERS = 64  # a queue deep enough that the batcher never waits for work: saturated
# More requests in flight than the queues hold (64 per model), so the client never waits for a
# free worker at 2x.
WORKERS = 160
CANDIDATES = 1024  # the ranker's largest candidate bucket
TOP_K = 500  # the whole tiny corpus: the ranker scores ~500 candidates per request
QUEUE_TIMEOUT_S = 5.0  # default_timeout_microseconds in the model configs
# A request waits at most QUEUE_TIMEOUT_S in a queue, then runs: its latency is bounded by
# that plus a few service times, measured in the same test (the closed loop's p99).
SERVICE_TIMES = 3
QUEUE_FULL = "Exceeds maximum queue size"
TIMED_OUT = "Request timeout expired"


def classify(error: str) -> str:
    """'ok', 'queue_full', 'timed_out' or 'other'."""
    if not error:
        return "ok"
    if QUEUE_FULL in error and ("[503]" in error or "UNAVAILABLE" in error):
        return "queue_full"
    if TIMED_OUT in error and ("[503]" in error or "UNAVAILABLE" in error):
        return "timed_out"
    return "other"


def heavy_inputs(model: str, artifacts: Path) -> tuple[dict[str, np.ndarray], range]:
    """One server-heavy request for `model`, and the range of answer lengths that is right."""
    sequence = load_example_sequence(artifacts).to_dict()
    if model == "recommend":  # the user's history is left out of the top_k
        return recommend_inputs(sequence, top_k=TOP_K), range(TOP_K - 50, TOP_K + 1)
    rng = np.random.default_rng(0)
    sequence["candidate_post_ids"] = rng.integers(1, 2**62, CANDIDATES).tolist()
    sequence["candidate_author_ids"] = rng.integers(1, 2**62, CANDIDATES).tolist()
    sequence["candidate_product_surface"] = None
    return ranker_inputs(sequence), range(CANDIDATES, CANDIDATES + 1)


def caller_factory(server, artifacts: Path, model: str, protocol: str):
    inputs, lengths = heavy_inputs(model, artifacts)

    def check(outputs: dict[str, np.ndarray]) -> None:
        shape = outputs["ranked_post_ids"].shape
        if len(shape) != 2 or shape[0] != 1 or shape[1] not in lengths:
            raise AssertionError(f"wrong answer: ranked_post_ids of shape {shape}")

    def make(_index: int) -> Caller:
        url = server.http_url if protocol == "http" else server.grpc_url
        return Caller(url, protocol, model, inputs, outputs=["ranked_post_ids"],
                      check=check, timeout_s=30)  # fmt: skip

    return make


@pytest.fixture(scope="module")
def overload_server(tiny_artifacts, tmp_path_factory):
    log = tmp_path_factory.mktemp("overload") / "tritonserver.log"
    server = start_triton(MODEL_REPOSITORY, tiny_artifacts, log_path=log, exit_timeout_secs=5)
    yield server
    server.kill()  # not a stop under test (tests/integration/conftest.py, "killed")


@pytest.mark.parametrize("model,protocol", CASES)
def test_twice_capacity_is_refused_fast_and_accepted_latency_stays_bounded(
    overload_server, tiny_artifacts, model, protocol
):
    make = caller_factory(overload_server, tiny_artifacts, model, protocol)
    closed_loop = measure_capacity(make, workers=CAPACITY_WORKERS, duration_s=CAPACITY_S)
    assert closed_loop["failed"] == 0, closed_loop["errors"]
    capacity = closed_loop["ok_per_s"]
    for factor in OVERLOAD_FACTORS:
        rate = factor * capacity
        run = LoadRun(
            make, workers=WORKERS, duration_s=OVERLOAD_S, rate=rate, asynchronous=protocol == "grpc"
        )
        outcomes = run.start().wait().snapshot()
        kinds = [classify(o.error) for o in outcomes]
        if "queue_full" in kinds:
            break
    service_s = {
        kind: [o.ended - o.started for o, k in zip(outcomes, kinds) if k == kind]
        for kind in ("ok", "queue_full", "timed_out")
    }
    client_lag = [o.started - o.due for o in outcomes]
    accepted = percentiles_ms(service_s["ok"])
    queue_full = percentiles_ms(service_s["queue_full"])
    figures = {
        "model": model,
        "protocol": protocol,
        "capacity_rps": round(capacity, 1),
        "overload_factor": factor,
        "offered_rps": round(rate, 1),
        "sent": len(outcomes),
        "accepted": kinds.count("ok"),
        "accepted_rps": round(kinds.count("ok") / OVERLOAD_S, 1),
        "queue_full": kinds.count("queue_full"),
        "timed_out": kinds.count("timed_out"),
        "other_errors": kinds.count("other"),
        "accepted_p50_ms": accepted["p50_ms"],
        "accepted_p99_ms": accepted["p99_ms"],
        "accepted_max_ms": accepted["max_ms"],
        "queue_full_p50_ms": queue_full["p50_ms"],
        "queue_full_p95_ms": queue_full["p95_ms"],
        "queue_full_p99_ms": queue_full["p99_ms"],
        "timed_out_p50_ms": percentiles_ms(service_s["timed_out"])["p50_ms"],
        "client_lag_p99_ms": percentiles_ms(client_lag)["p99_ms"],
    }
    print(f"RELIABILITY overload {json.dumps(figures)}", flush=True)
    others = [o.error for o, k in zip(outcomes, kinds) if k == "other"]
    assert not others, others[:5]
    assert figures["accepted"] > 0 and figures["queue_full"] > 0
    assert accepted["p99_ms"] <= QUEUE_TIMEOUT_S * 1e3 + SERVICE_TIMES * closed_loop["p99_ms"]
    # A refusal does no work: it comes faster than an accepted answer.
    assert queue_full["p50_ms"] < accepted["p50_ms"]
    # Past the overload the server answers normally again.
    caller = make(0)
    try:
        caller()
    finally:
        caller.close()
    assert overload_server.is_ready()


# ----------------------------------------------------------------------------------------
# Normal traffic under the queue policy
# ----------------------------------------------------------------------------------------

# One client at a time: a batcher stall (~0.5 s) shows as a p99 far above the median; a busy
# machine slows every request alike. So the bound is relative to the median measured here.
STALL_RATIO = 10.0
STALL_FLOOR_MS = 100.0


def single_client_latency_ms(server, model: str, inputs: dict[str, np.ndarray]) -> dict:
    def make(_index: int) -> Caller:
        return Caller(server.grpc_url, "grpc", model, inputs, timeout_s=30)

    summary = measure_capacity(make, workers=1, duration_s=4.0)
    assert summary["failed"] == 0, summary["errors"]
    return {"p50_ms": summary["p50_ms"], "p99_ms": summary["p99_ms"]}


def stalled(latency: dict) -> bool:
    return latency["p99_ms"] > STALL_RATIO * latency["p50_ms"] + STALL_FLOOR_MS


def test_one_client_through_the_ensemble_is_not_slowed(overload_server, tiny_artifacts):
    inputs = recommend_inputs(load_example_sequence(tiny_artifacts).to_dict(), top_k=50)
    latency = single_client_latency_ms(overload_server, "recommend", inputs)
    print(f"RELIABILITY normal_traffic {json.dumps({'recommend_c1': latency})}", flush=True)
    assert not stalled(latency), latency


# Guards the instance_group count of 2: with one instance and a queue policy, Triton 2.51's
# batcher misses wake-ups and a direct request now and then waits ~0.5 s (docs/reliability.md).
def test_one_client_calling_a_model_directly_is_not_slowed(overload_server, tiny_artifacts):
    sequence = load_example_sequence(tiny_artifacts).to_dict()
    latency = {
        "user_encoder": single_client_latency_ms(
            overload_server, "user_encoder", user_inputs(sequence)
        ),
        "ranker": single_client_latency_ms(
            overload_server, "ranker", heavy_inputs("ranker", tiny_artifacts)[0]
        ),
    }
    print(f"RELIABILITY normal_traffic_direct {json.dumps(latency)}", flush=True)
    assert not any(stalled(figures) for figures in latency.values()), latency
