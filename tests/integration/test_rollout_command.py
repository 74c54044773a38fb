"""`phoenix-rollout` as an operator types it, against a real `phoenix-serve` under Locust load.

One serve command (its supervisor, its admin key, its state file) serves the tiny artifacts
(version N, no version label: named by content); Locust's HTTP and gRPC users call it
throughout. The tests, in file order, end every way a rollout can end, each with the server
READY on both probes (the supervisor's /ready and Triton's own) and serving exactly one
version, no `__next` model left:

- refused before loading anything: a failed gate, a corpus the new version lacks, a copy of
  the served artifacts (the served version label);
- a new version that fails to load: cleaned up, N serves on;
- success over HTTP with a shadow (two version labels on /metrics meanwhile), then
  `--rollback` over gRPC; `phoenix-recommend --check` agrees with the version served after each;
- the rollout SIGKILLed part way, then rolled back from its report.

Both probes answer 200 every 0.2 s throughout each rollout and rollback (and the failed
load), each within the deployment's probe timeout, and Locust counts 0 failed requests over all
of it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from harness import REPO_ROOT
from harness.locust_runs import failure_kinds, finish_locust, locust_totals, start_locust
from harness.polling import wait_until
from harness.serve_process import ServeProcess
from phoenix.checkpoint import RANKER_PARAMS_FILE, read_npz, write_npz
from phoenix.checkpoint.identity import artifact_version
from phoenix.ops.admin_key import find_admin_key
from phoenix.ops.rollout import GATE_FILE
from phoenix.ops.serving_state import read_serving_state
from phoenix.ops.supervisor.admin import TritonAdmin
from phoenix.util.processes import http_get_status

pytestmark = pytest.mark.integration
READY_WITHIN_S = 10.0  # /ready and Triton's readiness agree within this after a rollout ends
ROLLOUT_TIMEOUT_S = 600.0
EXIT_REFUSED = 3
PROBE_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 3.0  # the deployment's readinessProbe timeoutSeconds


def perturbed_copy(source: Path, target: Path) -> Path:
    """``source`` with perturbed ranker weights (its compiled programs too: same shapes); no
    version label, so its content names it."""
    shutil.copytree(source, target)
    params = read_npz(target / RANKER_PARAMS_FILE, RANKER_PARAMS_FILE)
    rng = np.random.default_rng(1)
    write_npz(
        target / RANKER_PARAMS_FILE,
        {
            key: value + 0.05 * rng.standard_normal(value.shape).astype(value.dtype)
            if value.dtype.kind == "f"
            else value
            for key, value in params.items()
        },
    )
    return target


def probe(url: str) -> tuple[int | None, str]:
    """(status, body) of GET ``url``; (None, why) when nothing answers in PROBE_TIMEOUT_S."""
    try:
        with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT_S) as response:
            return response.status, ""
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")[:500]
    except OSError as error:  # refused, reset, timed out
        return None, str(error)


class ReadinessProbes:
    """Each URL of ``urls`` ({name: url}) probed every PROBE_INTERVAL_S from a thread of its
    own (a slow answer delays no other probe) while the ``with`` block runs: every answer
    counted, every one other than 200 kept with its time and body (/ready's reasons)."""

    def __init__(self, urls: dict[str, str]):
        self.urls = urls
        self.answers = {name: 0 for name in urls}
        self.failures: list[tuple[float, str, int | None, str]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in urls]

    def run(self, name: str) -> None:
        started = next_at = time.monotonic()
        while not self.stop.is_set():
            status, body = probe(self.urls[name])
            self.answers[name] += 1
            if status != 200:
                self.failures.append((round(time.monotonic() - started, 2), name, status, body))
            next_at += PROBE_INTERVAL_S
            self.stop.wait(max(0.0, next_at - time.monotonic()))

    def summary(self) -> dict[str, list]:
        """The answers other than 200 grouped by endpoint, status and /ready's reasons:
        [count, first and last second]."""
        groups: dict[str, list] = {}
        for at, name, status, body in self.failures:
            try:
                why = json.loads(body)["reasons"]
            except (ValueError, KeyError, TypeError):
                why = body[:200]
            entry = groups.setdefault(f"{name} {status} {why}", [0, at, at])
            entry[0], entry[2] = entry[0] + 1, at
        return groups

    def assert_all_200(self, at_least: int) -> None:
        """Every endpoint answered at least ``at_least`` probes, all of them 200."""
        print(f"ROLLOUT-COMMAND readiness probes {self.answers}, not 200: {len(self.failures)}")
        assert min(self.answers.values()) >= at_least, self.answers
        assert self.failures == [], self.summary()

    def __enter__(self) -> ReadinessProbes:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(PROBE_TIMEOUT_S + 1)


class Operator:
    """The server under test and the commands an operator runs against it."""

    def __init__(self, serve: ServeProcess, work: Path):
        self.serve, self.work = serve, work
        self.report = work / "rollout.json"
        key = find_admin_key(key_file=serve.build_dir / "admin-key")
        self.admin = TritonAdmin(serve.http_url, key)

    def command(self, module: str, *args: str) -> list[str]:
        return [sys.executable, "-m", module, *args]

    def rollout_args(self, *args: str, protocol: str = "http") -> list[str]:
        url = self.serve.http_url if protocol == "http" else self.serve.grpc_url
        where = ["--url", url, "--protocol", protocol, "--serve-dir", str(self.serve.build_dir)]
        return self.command("clients.rollout", *args, *where, "--report", str(self.report))

    def run(self, command: list[str], timeout_s: float = ROLLOUT_TIMEOUT_S):
        environment = {k: v for k, v in os.environ.items() if k != "PHOENIX_ADMIN_KEY"}
        return subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s,
            env=environment,
        )  # fmt: skip

    def roll(self, *args: str, protocol: str = "http"):
        return self.run(self.rollout_args(*args, protocol=protocol))

    def check(self, artifacts: Path) -> subprocess.CompletedProcess:
        """phoenix-recommend --check: the served feed equals ``artifacts``' in this process."""
        args = ["--url", self.serve.http_url, "--artifacts", str(artifacts), "--check"]
        return self.run(self.command("clients.recommend", *args), timeout_s=300)

    def assert_state_names(self, artifacts: Path) -> None:
        """serve's serving.json names the artifacts served now and their version label."""
        state = read_serving_state(self.serve.build_dir, self.serve.http_url)
        assert Path(state["artifacts"]) == Path(artifacts).resolve()
        assert state["artifact_version"] == artifact_version(artifacts)

    def probes(self) -> ReadinessProbes:
        """The supervisor's /ready and Triton's own readiness, probed while a block runs."""
        triton = f"http://{self.serve.http_url}/v2/health/ready"
        return ReadinessProbes({"/ready": self.serve.ready_url, "/v2/health/ready": triton})

    def ready_on_both_probes(self) -> bool:
        triton = f"http://{self.serve.http_url}/v2/health/ready"
        return http_get_status(self.serve.ready_url) == 200 and http_get_status(triton) == 200

    def served_dirs(self) -> set[str]:
        """The artifact directories the loaded models read, and any rollout copy's name."""
        served = set()
        for model, (state, _) in self.admin.model_index().items():
            if model.endswith("__next"):
                served.add(f"{model} ({state})")
            elif state == "READY":
                parameters = self.admin.model_config(model).get("parameters", {})
                if "artifact_dir" in parameters:
                    served.add(parameters["artifact_dir"]["string_value"])
        return served

    def assert_serves_only(self, artifacts: Path) -> None:
        ready = wait_until(self.ready_on_both_probes, READY_WITHIN_S, 0.2)
        assert ready is not None, (self.serve.status()["reasons"], self.served_dirs())
        assert self.served_dirs() == {str(artifacts)}


@pytest.fixture(scope="module")
def operated(tiny_artifacts, tmp_path_factory):
    """The served tiny artifacts (N), N+1 and its broken variants beside them, Locust's users
    on the server for the whole module (their failures checked at its end)."""
    work = tmp_path_factory.mktemp("rollout-command")
    versions = {"n": Path(shutil.copytree(tiny_artifacts, work / "n"))}
    versions["next"] = perturbed_copy(tiny_artifacts, work / "next")
    gated = versions["gated"] = Path(shutil.copytree(versions["next"], work / "gated"))
    (gated / GATE_FILE).write_text('{"passed": false, "rule": "ndcg@20 of N+1 >= N"}\n')
    no_corpus = versions["no_corpus"] = Path(shutil.copytree(versions["next"], work / "no-corpus"))
    (no_corpus / "corpus.npz").unlink()
    versions["copy"] = Path(shutil.copytree(versions["n"], work / "v2"))  # N's label
    broken = versions["broken"] = Path(shutil.copytree(versions["next"], work / "broken"))
    (broken / RANKER_PARAMS_FILE).write_bytes(b"not an npz file")  # fails every load
    env = {k: v for k, v in os.environ.items() if k != "PHOENIX_ADMIN_KEY"}  # serve makes one
    serve = ServeProcess(versions["n"], work / "serve", 0.0, env=env, ready_timeout_s=300)
    serve.start()
    locust = None
    try:
        serve.wait_ready(interval_s=0.5)
        prefix = work / "locust"
        urls = {"http": serve.http_url, "grpc": serve.grpc_url}
        # Traffic through every step of every rollout (about 6 requests a second), not a
        # saturating load: that took a core from the rest of the suite for the whole module.
        locust = start_locust(urls, prefix, users=2, artifacts=versions["n"], run_time="30m",
                              extra=["--exclude-tags", "recommend_by_id",
                                     "--think-time", "0.2,0.4"])  # fmt: skip
        operator = Operator(serve, work)
        yield operator, versions
        finish_locust(locust)
        locust = None
        totals = locust_totals(prefix)
        kinds = failure_kinds(Path(f"{prefix}_failures.csv"))
        print(f"ROLLOUT-COMMAND locust {totals} failures {dict(kinds)}")
        assert totals.requests > 100 and totals.failures == 0, (totals, kinds)
    finally:
        if locust is not None:
            finish_locust(locust)
        serve.stop()


def test_a_failed_gate_a_missing_corpus_and_the_served_label_are_refused_before_any_load(
    operated,
):
    operator, versions = operated
    gated = operator.roll(str(versions["gated"]))
    assert gated.returncode == EXIT_REFUSED, gated.stderr
    assert "failed its offline gate" in gated.stderr and "--force" in gated.stderr
    no_corpus = operator.roll(str(versions["no_corpus"]))
    assert no_corpus.returncode == EXIT_REFUSED, no_corpus.stderr
    assert "'corpus.npz'" in no_corpus.stderr and "nothing was loaded" in no_corpus.stderr
    copy = operator.roll(str(versions["copy"]))  # the served artifacts copied as "v2"
    assert copy.returncode == EXIT_REFUSED, copy.stderr
    label = artifact_version(versions["n"])
    assert f"{versions['copy']} is version {label}, the version served ({versions['n']})" in (
        copy.stderr
    )
    assert "same content" in copy.stderr and "--force" in copy.stderr
    assert not operator.report.exists()  # a refusal writes no report (a rollback's stays)
    operator.assert_serves_only(versions["n"])


def test_a_version_that_fails_to_load_is_cleaned_up_and_n_serves_on(operated):
    operator, versions = operated
    with operator.probes() as probes:
        broken = operator.roll(str(versions["broken"]))
    assert broken.returncode == EXIT_REFUSED, broken.stderr
    assert "loading recommend_chain__next failed" in broken.stderr
    probes.assert_all_200(at_least=10)
    operator.assert_serves_only(versions["n"])


def served_versions(metrics_url: str) -> set[tuple[str, str]]:
    """(model, version) of every phoenix_requests_served_total series on /metrics now."""
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    found = set()
    for labels in re.findall(r"^phoenix_requests_served_total\{([^}]*)\}", text, re.M):
        named = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found.add((named["model"], named["version"]))
    return found


def test_a_rollout_over_http_then_a_rollback_over_grpc(operated):
    operator, versions = operated
    with operator.probes() as probes:  # both readiness probes from start to end
        rollout = subprocess.Popen(
            operator.rollout_args(str(versions["next"]), "--shadow-seconds", "3"),
            cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        seen: set[tuple[str, str]] = set()
        while rollout.poll() is None:  # /metrics while both versions serve
            seen |= served_versions(operator.serve.metrics_url)
            time.sleep(0.3)
        stderr = rollout.stderr.read()
        assert rollout.returncode == 0, stderr
        operator.assert_serves_only(versions["next"])
        operator.assert_state_names(versions["next"])
        checked = operator.check(versions["next"])
        assert checked.returncode == 0, checked.stdout + checked.stderr

        back = operator.roll("--rollback", protocol="grpc")
        assert back.returncode == 0, back.stderr
        operator.assert_serves_only(versions["n"])
        operator.assert_state_names(versions["n"])
    probes.assert_all_200(at_least=100)
    chain_versions = {version for model, version in seen if model.startswith("recommend_chain")}
    assert {artifact_version(versions["n"]), artifact_version(versions["next"])} <= chain_versions
    checked = operator.check(versions["n"])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_rollout_killed_part_way_is_rolled_back_from_its_report(operated):
    operator, versions = operated
    with operator.probes() as probes:  # the killed rollout's copies are loaded beside: ready
        rollout = subprocess.Popen(
            operator.rollout_args(str(versions["next"]), "--shadow-seconds", "30"),
            cwd=REPO_ROOT, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        shadowing = wait_until(
            lambda: operator.admin.model_index().get("recommend_chain__next", ("",))[0] == "READY",
            300,
            0.2,
        )
        assert shadowing is not None and rollout.poll() is None
        rollout.send_signal(signal.SIGKILL)
        rollout.wait(30)
        back = operator.roll("--rollback")
    assert back.returncode == 0, back.stderr
    assert "removed leftover" in back.stderr  # what the killed rollout had loaded
    probes.assert_all_200(at_least=20)
    operator.assert_serves_only(versions["n"])
