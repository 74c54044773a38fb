"""A rollout under load against a real tritonserver (phoenix.serving.rollout, docs/rollout.md):
threads call ``recommend`` and ``ranker`` over gRPC without pause while the server goes from
the tiny artifacts (N) to a copy with perturbed ranker weights and version 2 (N+1), with a
shadow, the switch and the unloads; then back with a rollback. No request fails, the ensemble
included; after the switch the answers are N+1's, after the rollback exactly N's; the
per-version counters are on /metrics."""

from __future__ import annotations

import dataclasses
import re
import shutil
import threading
import time
import urllib.request

import numpy as np
import pytest

from clients.workload import random_users
from phoenix.checkpoint import RANKER_PARAMS_FILE, load_config, read_npz, save_config, write_npz
from phoenix.serving import rollout
from phoenix.serving.client import connect, infer, ranker_inputs, recommend_inputs
from phoenix.serving.inprocess import InProcessModels
from tests.integration.conftest import MODEL_REPOSITORY, launch_server
from tests.rankings import assert_same_ranking_up_to_ties

pytestmark = pytest.mark.integration
LOAD_THREADS = (("recommend", 2), ("ranker", 1))
# between one thread's calls: load enough that a request dropped by a switch or an unload
# would be seen (1,127 calls through the rollout and rollback, measured once; 3,274 at
# 0.02 s), and cores left for the model loads
PAUSE_S = 0.1


def perturbed_version(source, target):
    """A copy of ``source`` (its compiled programs included: same shapes) whose ranker
    weights are perturbed, labelled version 2."""
    shutil.copytree(source, target)
    params = read_npz(target / RANKER_PARAMS_FILE, RANKER_PARAMS_FILE)
    rng = np.random.default_rng(1)
    params = {
        key: value + 0.05 * rng.standard_normal(value.shape).astype(value.dtype)
        if value.dtype.kind == "f"
        else value
        for key, value in params.items()
    }
    write_npz(target / RANKER_PARAMS_FILE, params)
    save_config(target, dataclasses.replace(load_config(target), version=2))
    return target


class Load:
    """Threads calling models over gRPC until stopped; every call's outcome recorded."""

    def __init__(self, url: str, requests: dict[str, list[dict]]):
        self.url, self.requests = url, requests
        self.stop = threading.Event()
        self.calls: list[tuple[str, float, str]] = []  # model, seconds, error ("" if none)
        self.threads = [
            threading.Thread(target=self._call, args=(model,), daemon=True)
            for model, count in LOAD_THREADS
            for _ in range(count)
        ]

    def _call(self, model: str) -> None:
        client = connect(self.url, "grpc")
        for sent in range(10**9):
            if self.stop.is_set():
                return
            started = time.monotonic()
            try:
                arrays = self.requests[model][sent % len(self.requests[model])]
                infer(client, "grpc", model, arrays, client_timeout=30)
                error = ""
            except Exception as failure:  # every failure counts, whatever tritonclient raised
                error = str(failure)
            self.calls.append((model, time.monotonic() - started, error))
            time.sleep(PAUSE_S)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def answers(client, requests) -> list[dict]:
    return [infer(client, "grpc", model, arrays) for model, arrays in requests]


def served_counters(metrics_url: str) -> dict[tuple[str, str], float]:
    """{(model, version): requests} of phoenix_requests_served_total."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    counters: dict[tuple[str, str], float] = {}
    for labels, value in re.findall(
        r"^phoenix_requests_served_total\{([^}]*)\} (\S+)$", text, re.M
    ):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))  # one series per stub: summed
        key = (named["model"], named["version"])
        counters[key] = counters.get(key, 0.0) + float(value)
    return counters


def test_a_rollout_under_load_fails_no_request_and_a_rollback_restores_n(tiny_artifacts, tmp_path):
    new_dir = perturbed_version(tiny_artifacts, tmp_path / "v2")
    explicit = {"model_control_mode": "explicit", "load_model": "*", "exit_timeout_secs": 5}
    server = launch_server(
        MODEL_REPOSITORY, tiny_artifacts, log_path=tmp_path / "tritonserver.log", **explicit
    )
    try:
        users = random_users(tiny_artifacts, 3, seed=0, history_len=8, num_candidates=16, top_k=10)
        requests = {
            "recommend": [recommend_inputs(u) for u in users],
            "ranker": [ranker_inputs(u) for u in users],
        }
        probes = [(m, arrays) for m, many in requests.items() for arrays in many]
        client = connect(server.grpc_url, "grpc")
        admin = rollout.Server(client, "grpc", None, server.served_repository)
        before = answers(client, probes)

        with Load(server.grpc_url, requests) as load:
            plan = rollout.forward_plan(admin, new_dir)
            report = rollout.roll(admin, plan, requests["recommend"], shadow_seconds=1.0)
            after = answers(client, probes)
            after_counters = served_counters(server.metrics_url)
            back = rollout.roll(admin, rollout.rollback_plan(admin, report))
            time.sleep(0.5)  # calls on N again
        # as `before`, without load: a request batched with others runs another program
        # (batch bucket), whose floats may differ in the last bits
        restored = answers(client, probes)
        counters = served_counters(server.metrics_url)
        # N+1 alone: its services in this process, with the server's parameters
        reference = InProcessModels.like_server(client, "grpc", new_dir)
        expected = [reference.run(model, arrays) for model, arrays in probes]
    finally:
        server.stop()

    failed = [call for call in load.calls if call[2]]
    per_model = {m: sum(1 for c in load.calls if c[0] == m) for m, _ in LOAD_THREADS}
    slowest = max(seconds for _, seconds, _ in load.calls)
    print(f"{len(load.calls)} calls {per_model}, slowest {slowest:.2f} s, failed {len(failed)}")
    assert not failed, failed[:5]
    assert all(count > 10 for count in per_model.values()), per_model

    events = [e["event"] for e in report["timeline"]]
    assert events.count("switched") == 2 and events.count("unloaded") == len(plan.shadowed)
    assert report["shadow"]["ranker"]["requests"] > 0  # N+1's ranker beside N's, compared
    assert report["target"]["version"] == "2" and back["target"]["version"] == "none"
    shadow = report["shadow"]["recommend"]
    assert shadow["requests"] >= len(requests["recommend"]) and 0 < shadow["top_k_overlap"] <= 1
    assert shadow["max_abs_score_delta"] > 0  # the versions differ

    # after the switch: N+1's answers
    for served, alone, old in zip(after, expected, before):
        assert_same_ranking_up_to_ties(
            served["ranked_post_ids"][0], served["scores"][0],
            alone["ranked_post_ids"][0], alone["scores"][0], tol=1e-4,
        )  # fmt: skip
        assert not np.array_equal(served["scores"], old["scores"])
    # after the rollback: exactly N's
    for restored_answer, old in zip(restored, before):
        for name in old:
            if name != "request_id":  # new per request
                np.testing.assert_array_equal(restored_answer[name], old[name], err_msg=name)

    # a series per live model and version: N+1's while it serves, N's again after the rollback
    assert after_counters.get(("ranker", "2"), 0) > 0, after_counters
    assert ("ranker", "none") not in after_counters and ("ranker__next", "2") not in after_counters
    assert counters.get(("ranker", "none"), 0) > 0 and ("ranker", "2") not in counters, counters
