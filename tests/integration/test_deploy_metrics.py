"""Every Triton metric that the HPA's prometheus-adapter rule and the Grafana dashboard query
(deploy/k8s/monitoring) is exported by a real tritonserver serving our models, with a series for
each served model (contracts.CONTRACTS)."""

from __future__ import annotations

import re
import urllib.request

from phoenix.serving.contracts import CONTRACTS
from tests.deploy_checks import K8S_DIR, render, triton_metrics_used


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
    assert sorted(used - set(exported)) == [], f"queried but not exported: {exported.keys()}"
    for metric in used:
        assert exported[metric] >= set(CONTRACTS), (metric, sorted(exported[metric]))
