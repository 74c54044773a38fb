"""Every metric that the HPA's prometheus-adapter rule, the Grafana dashboard and the alerts
query (deploy/k8s/monitoring) is exported by a real tritonserver serving our models, with a
series for each served model (served.CONTRACTS; our own counters for each Python model), and
a refused request moves the refused counter of its model and input."""

from __future__ import annotations

import re
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from phoenix.checkpoint import load_config
from phoenix.client.client import connect, infer, model_inputs
from phoenix.schema.served import CONTRACTS
from phoenix.stub.request_metrics import (
    CANDIDATES,
    DROPPED,
    DROPPED_OUTPUT,
    FAILED,
    IN_NETWORK,
    IN_NETWORK_OUTPUT,
    PREFIX_CACHE_METRICS,
    REFUSED,
    SERVED,
    STORE_METRICS,
    candidate_output,
)
from tests.deploy_checks import K8S_DIR, render, sample, triton_metrics_used

PYTHON_MODELS = {name for name, contract in CONTRACTS.items() if not contract.is_ensemble}
# the models returning posts (candidate_output): they count candidates too
WITH_CANDIDATES = {name for name in PYTHON_MODELS if candidate_output(CONTRACTS[name].output_names)}


def with_output(name: str) -> set[str]:
    return {model for model in PYTHON_MODELS if name in CONTRACTS[model].output_names}


# our own metrics' models; Triton's (nv_...) have a series for every model. The corpus store's
# gauges (STORE_METRICS) need a server following a store: test_corpus_store_serving has one.
OWN_SERIES = {
    REFUSED: PYTHON_MODELS,
    FAILED: PYTHON_MODELS,
    SERVED: PYTHON_MODELS,
    CANDIDATES: WITH_CANDIDATES,
    IN_NETWORK: with_output(IN_NETWORK_OUTPUT),
    DROPPED: with_output(DROPPED_OUTPUT),
    # the models with a prefix cache (on by default): the ranker and the chain's ranker stage
    **{family: {"ranker", "recommend_chain"} for family in PREFIX_CACHE_METRICS},
}


def scrape(url: str) -> dict[str, set[str]]:
    """{metric name: the values of its `model` label} from a Prometheus text page."""
    series: dict[str, set[str]] = {}
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    for line in text.splitlines():
        if match := re.match(r"([a-z_:][a-z0-9_:]*)(\{[^}]*\})?\s", line):
            model = re.search(r'model="([^"]+)"', match.group(2) or "")
            series.setdefault(match.group(1), set()).update([model.group(1)] if model else [])
    return series


def test_the_metrics_of_the_hpa_rule_and_the_dashboard_exist_on_a_real_server(triton):
    used = triton_metrics_used(render(K8S_DIR / "monitoring"))
    assert {"nv_inference_queue_duration_us", "nv_inference_request_success"} <= used
    exported = scrape(triton.metrics_url)
    served_here = used - set(STORE_METRICS)  # this server's corpus is a file
    assert sorted(served_here - set(exported)) == [], f"queried but not exported: {exported.keys()}"
    assert set(OWN_SERIES) | set(STORE_METRICS) <= used
    for metric in served_here:
        models = OWN_SERIES.get(metric, set(CONTRACTS))
        assert exported[metric] >= models, (metric, sorted(exported[metric]))


def test_a_refused_request_moves_the_refused_counter_of_its_model_and_input(triton, tiny_artifacts):
    """top_k 0 passes Triton's checks (dtype, shape) and is refused by the retriever."""
    url = triton.metrics_url
    top_k = dict(model="retriever", input="top_k")
    before = sample(url, REFUSED, **top_k)
    other = sample(url, REFUSED, model="retriever", input="user_embedding")
    failed = sample(url, FAILED, model="retriever")
    emb_size = load_config(tiny_artifacts).emb_size
    user = np.full(emb_size, emb_size**-0.5, np.float32)
    client = connect(triton.http_url)
    with pytest.raises(InferenceServerException, match="top_k") as refused:
        infer(
            client,
            "http",
            "retriever",
            model_inputs("retriever", {"user_embedding": user, "top_k": 0}),
        )
    assert refused.value.status() == "400"  # INVALID_ARG over HTTP
    infer(
        client, "http", "retriever", model_inputs("retriever", {"user_embedding": user, "top_k": 5})
    )
    assert sample(url, REFUSED, **top_k) == before + 1
    assert sample(url, REFUSED, model="retriever", input="user_embedding") == other
    assert sample(url, FAILED, model="retriever") == failed
