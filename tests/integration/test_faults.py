"""Faults under load against the real serve command (tritonserver + supervisor), on loopback.

One `python -m phoenix.ops.serve` process serves tiny artifacts with no admin key given,
so it generates one into its build directory, where the tests read it like the project's tools
do. Tests run in file order on it and the last one shuts it down:

- the admin APIs need the key (HTTP 403, gRPC UNAVAILABLE); inference, health and metadata
  do not;
- a corpus swap of recommend's chain through the model load API: zero failed requests, new
  answers after; a corpus file outside the artifact directory is refused and the loaded corpus
  keeps serving;
- an operator's unload (with the key) of `recommend_chain`: /ready turns 503 naming it and
  `recommend`, the supervisor leaves it unloaded; loaded again, /ready is 200;
- kill -9 of a model's stub: the supervisor notices, /ready turns 503, the model is reloaded,
  /ready turns 200; failures stay inside that window;
- SIGTERM to the serve command: /ready turns 503 at once, in-flight requests complete, new
  ones are refused cleanly, the process exits 0;
- SIGKILL of the serve command leaves no tritonserver, stub, user-state store or taken port
  behind (the store's data stays in its folder); SIGKILL of the `make` that started it stops it
  as SIGTERM does.

Timing figures are reported, not asserted, except where the bound is the property (recovery),
and then it is generous and relative to a load measured in the same run.

PHOENIX_LONG_TESTS=1 (`make test-reliability-long`) kills every model's stub in turn.
Figures are printed as `RELIABILITY <name> {json}` lines (see them with `pytest -s`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from harness.loadgen import LoadRun, alternating_callers, error_kind, summarize
from harness.polling import wait_until
from harness.serve_process import ServePorts, ServeProcess
from phoenix.checkpoint import Corpus, load_corpus, load_example_sequence, save_corpus
from phoenix.client.client import recommend_inputs
from phoenix.ops.admin_key import admin_headers, find_admin_key
from phoenix.ops.serve import DEFAULT_STOP_TIMEOUT_S, EXIT_TIMEOUT_S
from phoenix.ops.serve_store import STORE_FOLDER
from phoenix.ops.supervisor.admin import TritonAdmin, TritonAPIError
from phoenix.ops.supervisor.state import RESTART_PARAMETER
from phoenix.ops.triton_server import SHARED_MEMORY, SHARED_MEMORY_PREFIX
from phoenix.user_state.embedded import STATE_FILE, STORE_LOCK
from phoenix.util.processes import http_get_status, is_alive

pytestmark = [pytest.mark.integration, pytest.mark.serial, pytest.mark.timeout(900)]

LONG = os.environ.get("PHOENIX_LONG_TESTS") == "1"
READY_TIMEOUT_S = float(os.environ.get("PHOENIX_TEST_READY_TIMEOUT", "300"))
# recommend's one step first: the stub every recommend request crosses
KILLED_MODELS = (
    ["recommend_chain", "retriever", "user_encoder", "ranker", "candidate_tower", "feed_policy"]
    if LONG
    else ["recommend_chain"]
)
WORKERS = 4  # even workers HTTP, odd ones gRPC
CHAIN = "recommend_chain"  # the one model the recommend ensemble calls
WARMUP_S = 1.5
AFTER_S = 4.0 if LONG else 2.0
DRAIN_S = 1.0
# Bounds that only keep a broken run from hanging; the figures are reported, not asserted.
DETECT_WAIT_S = 30.0
RECOVERY_WAIT_S = 300.0
# The bounds asserted: /ready reflects an operator's unload within 1 s, and a
# killed model is back within 15 s; on a busy machine, within 3x a load measured in this run.
UNLOAD_VISIBLE_S = 1.0
RECOVERY_BOUND_S = 15.0
RECOVERY_REFERENCE_FACTOR = 3.0
TOP_K = 20
# A SIGKILLed serve command: the bound for tritonserver, its stubs and its ports to be gone.
ORPHAN_LIMIT_S = 5.0


def report(name: str, **figures) -> None:
    print(f"RELIABILITY {name} {json.dumps(figures, sort_keys=True)}", flush=True)


@dataclass
class Served:
    """The serve command under test and what the tests need to talk to it."""

    serve: ServeProcess
    admin: TritonAdmin
    admin_key: str
    artifacts: Path
    old_ids: set[int]
    new_ids: set[int]
    server_pid: int = 0
    reference_load_s: float = 0.0  # an operator's load of recommend's chain, measured here


def supervisor_status(served: Served) -> dict:
    return served.serve.status()


def wait_for(condition, timeout_s: float, interval_s: float = 0.05) -> float:
    """time.monotonic() when `condition()` first holds; AssertionError after `timeout_s`."""
    when = wait_until(condition, timeout_s, interval_s)
    if when is None:
        raise AssertionError(f"condition not met within {timeout_s} s")
    return when


def write_relabelled_corpus(artifacts: Path, filename: str) -> tuple[set[int], set[int]]:
    """A second corpus: same vectors under new post ids, so answers show which one served."""
    old = load_corpus(artifacts / "corpus.npz")
    rng = np.random.default_rng(7)
    new_ids = np.unique(rng.integers(1, 2**62, size=2 * len(old)))[: len(old)]
    rng.shuffle(new_ids)
    save_corpus(artifacts / filename, Corpus(new_ids, old.embeddings, old.author_ids))
    return set(old.post_ids.tolist()), set(new_ids.tolist())


EXEC_WITH_SIGHUP_DEFAULT = (
    "import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
    "os.execvp(sys.argv[1], sys.argv[1:])"
)


def serve_command_in_make(root: Path):
    """Turns the serve command line into a `make` run of a recipe holding it, as `make serve`
    runs serve."""

    def wrap(command: list[str]) -> list[str]:
        makefile = root / "serve.mk"
        makefile.write_text(f"SHELL := /bin/bash\nserve:\n\t{' '.join(command)}\n")
        make = ["make", "--no-print-directory", "-f", str(makefile), "serve"]
        # as from a terminal: a suite run under nohup passes SIGHUP ignored down to serve, which
        # then takes itself for detached and, by design, outlives make (stop_with_parent)
        return [sys.executable, "-c", EXEC_WITH_SIGHUP_DEFAULT, *make]

    return wrap


def shut_down(served: Served) -> None:
    """SIGTERM the serve command (SIGKILL to its group when it outlives the bound); make sure
    tritonserver and its stubs do not outlive us either."""
    served.serve.stop(DRAIN_S + DEFAULT_STOP_TIMEOUT_S + EXIT_TIMEOUT_S + 30)
    if served.server_pid and is_alive(served.server_pid):
        os.killpg(served.server_pid, signal.SIGKILL)


@contextlib.contextmanager
def serving(tiny_artifacts, tmp_path_factory, name: str, via_make: bool = False):
    root = tmp_path_factory.mktemp(name)
    artifacts = Path(shutil.copytree(tiny_artifacts, root / "artifacts"))
    old_ids, new_ids = write_relabelled_corpus(artifacts, "corpus-b.npz")
    env = {k: v for k, v in os.environ.items() if k != "PHOENIX_ADMIN_KEY"}  # serve makes one
    serve = ServeProcess(
        artifacts, root, DRAIN_S, ["--ready-timeout", str(READY_TIMEOUT_S)], env=env,
        wrap=serve_command_in_make(root) if via_make else None,
        ready_timeout_s=READY_TIMEOUT_S + 30,
    ).start()  # fmt: skip
    served = None
    try:
        key_file = serve.build_dir / "admin-key"
        wait_until(lambda: key_file.exists() or not serve.process.is_running(), 60, 0.1)
        admin_key = find_admin_key(key_file=key_file) or ""
        assert admin_key, f"serve wrote no usable key to {key_file}"
        served = Served(serve, TritonAdmin(serve.http_url, admin_key), admin_key, artifacts,
                        old_ids, new_ids)  # fmt: skip
        serve.wait_ready(interval_s=0.5)
        served.server_pid = supervisor_status(served)["server_pid"]
        yield served
    finally:
        if served is not None:
            shut_down(served)
        else:
            serve.stop()


@pytest.fixture(scope="module")
def served(tiny_artifacts, tmp_path_factory):
    """The server most tests share (and fault)."""
    with serving(tiny_artifacts, tmp_path_factory, "faults") as server:
        yield server


@pytest.fixture
def fresh_served(tiny_artifacts, tmp_path_factory):
    """A server of its own, never faulted."""
    with serving(tiny_artifacts, tmp_path_factory, "clean-exit") as server:
        yield server


def corpus_label(served: Served):
    """A check that names the corpus an answer came from ('old' or 'new')."""

    def check(outputs: dict[str, np.ndarray]) -> str:
        ids = set(outputs["ranked_post_ids"][0].tolist())
        if len(ids) != TOP_K:
            raise AssertionError(f"wrong answer: {len(ids)} posts, expected {TOP_K}")
        if ids <= served.new_ids:
            return "new"
        if ids <= served.old_ids:
            return "old"
        raise AssertionError("wrong answer: posts from both corpora or neither")

    return check


def recommend_load(served: Served, duration_s: float) -> LoadRun:
    inputs = recommend_inputs(load_example_sequence(served.artifacts).to_dict(), top_k=TOP_K)
    make = alternating_callers(served.serve.http_url, served.serve.grpc_url, "recommend", inputs,
                               outputs=["ranked_post_ids"], check=corpus_label(served),
                               timeout_s=60)  # fmt: skip
    # The pause keeps a worker from spinning on instant refusals.
    return LoadRun(make, workers=WORKERS, duration_s=duration_s, pause_after_error_s=0.05)


def user_parameters(config: dict) -> dict:
    """A model's parameters minus the supervisor's restart marker."""
    return {k: v for k, v in (config.get("parameters") or {}).items() if k != RESTART_PARAMETER}


# ----------------------------------------------------------------------------------------
# Admin APIs closed by default
# ----------------------------------------------------------------------------------------


def test_the_generated_key_is_private_and_admin_apis_need_it(served):
    key_file = served.serve.log.parent / "build" / "admin-key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    http = httpclient.InferenceServerClient(served.serve.http_url)
    grpc = grpcclient.InferenceServerClient(served.serve.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            http.unload_model("ranker")
        assert refused.value.status() == "403"
        with pytest.raises(InferenceServerException) as refused:
            grpc.unload_model("ranker")
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "restricted" in refused.value.message().lower()
        for client in (http, grpc):
            with pytest.raises(InferenceServerException):
                client.get_model_repository_index()
        # Health, metadata, config and inference stay open.
        assert http.is_server_ready() and grpc.is_server_ready()
        assert http.get_model_metadata("ranker")["name"] == "ranker"
        assert grpc.get_model_config("ranker").config.name == "ranker"
        assert http.is_model_ready("ranker") and http.is_model_ready("recommend")
        # The key opens them.
        index = http.get_model_repository_index(headers=admin_headers(served.admin_key))
        assert {entry["name"] for entry in index} >= {"ranker", "recommend"}
        grpc.get_model_repository_index(headers=admin_headers(served.admin_key, "grpc"))
    finally:
        http.close()
        grpc.close()
    assert http_get_status(served.serve.ready_url) == 200


# ----------------------------------------------------------------------------------------
# Corpus swap through the model load API
# ----------------------------------------------------------------------------------------


def test_corpus_swap_under_load_fails_nothing(served):
    """recommend's chain loaded again on another corpus under recommend's load: every
    request is answered, from the old corpus until the new one is ready, then from it."""
    config = served.admin.model_config(CHAIN)
    config["parameters"]["corpus_file"] = {"string_value": "corpus-b.npz"}
    with pytest.raises(TritonAPIError) as refused:  # the load API needs the admin key
        TritonAdmin(served.serve.http_url).load_model(CHAIN, config, timeout=30)
    assert refused.value.status == 403

    with recommend_load(served, duration_s=300) as run:
        time.sleep(WARMUP_S)
        load_started = time.monotonic()
        served.admin.load_model(CHAIN, config, timeout=300)
        load_done = time.monotonic()
        time.sleep(AFTER_S)
    outcomes = run.snapshot()
    served.reference_load_s = load_done - load_started

    summary = summarize(outcomes)
    before = {o.label for o in outcomes if o.ended < load_started}
    after = {o.label for o in outcomes if o.started > load_done}
    during = [o for o in outcomes if o.started <= load_done and o.ended >= load_started]
    report(
        "corpus_swap",
        requests=summary["requests"],
        failed=summary["failed"],
        load_s=round(load_done - load_started, 2),
        served_during_load=len(during),
        p99_ms=summary["p99_ms"],
    )
    assert summary["failed"] == 0, summary["errors"]
    assert before == {"old"} and after == {"new"}
    assert during, "no request was served while the new corpus loaded"
    # The old stub exits after the new one started: the supervisor must not call that a death,
    # nor the ensemble's reload around its new step an unload.
    assert supervisor_status(served)["events"] == []
    assert http_get_status(served.serve.ready_url) == 200


def test_a_corpus_outside_the_artifact_directory_is_refused_and_the_old_one_serves(served):
    shutil.copy(served.artifacts / "corpus.npz", served.artifacts.parent / "outside.npz")
    config = served.admin.model_config(CHAIN)
    before = config["parameters"]["corpus_file"]
    config["parameters"]["corpus_file"] = {"string_value": "../outside.npz"}
    with pytest.raises(TritonAPIError, match="outside the artifact directory"):
        served.admin.load_model(CHAIN, config, timeout=300)
    after = served.admin.model_config(CHAIN)["parameters"]["corpus_file"]
    with recommend_load(served, duration_s=60) as run:
        time.sleep(WARMUP_S)
    summary = summarize(run.snapshot())
    assert after == before
    assert summary["failed"] == 0 and summary["ok"] > 0, summary["errors"]
    assert http_get_status(served.serve.ready_url) == 200


# ----------------------------------------------------------------------------------------
# An operator's unload is respected, and /ready says so
# ----------------------------------------------------------------------------------------


def ready_body(served: Served) -> tuple[int | None, dict]:
    try:
        with urllib.request.urlopen(served.serve.ready_url, timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_readiness_probes_do_not_leak_open_files(served):
    """A load balancer probes /ready for as long as the node lives: every probe asks Triton,
    and the serve process (which runs the supervisor) must not open anything per probe."""
    serve = psutil.Process(served.serve.process.pid)
    for _ in range(10):  # the endpoint's thread makes its Triton clients once
        assert ready_body(served)[0] in (200, 503)
    before = serve.num_fds()
    for _ in range(200):
        assert ready_body(served)[0] in (200, 503)
    assert serve.num_fds() - before < 20, f"{before} -> {serve.num_fds()} open files"


def test_an_operator_unload_turns_ready_false_naming_the_model_and_its_ensemble(served):
    events_before = len(supervisor_status(served)["events"])
    unloaded = time.monotonic()
    served.admin.unload_model(CHAIN)
    unready = wait_for(lambda: ready_body(served)[0] == 503, DETECT_WAIT_S, 0.02)
    code, body = ready_body(served)
    # Unloading ends when its stubs have stopped; then several supervisor rounds pass, in
    # which it must not load the model back.
    wait_for(lambda: served.admin.model_index()[CHAIN][0] == "UNAVAILABLE", 120, 0.2)
    time.sleep(2.0)
    still = ready_body(served)
    states = served.admin.model_index()
    events = supervisor_status(served)["events"][events_before:]
    report("operator_unload", ready_false_after_s=round(unready - unloaded, 3), reasons=body)
    assert unready - unloaded <= UNLOAD_VISIBLE_S
    assert code == 503 and any(CHAIN in r for r in body["reasons"])
    assert any("model recommend " in r for r in body["reasons"]), body  # its ensemble
    assert states[CHAIN][0] == "UNAVAILABLE"
    assert still[0] == 503
    assert f"model {CHAIN} was unloaded by an operator" in still[1]["reasons"], still
    assert "reloaded" not in [e["event"] for e in events], events

    # The operator loads it back (and the ensemble, if Triton unloaded it with its step).
    served.admin.load_model(CHAIN, None, timeout=300)
    if served.admin.model_index()["recommend"][0] != "READY":
        served.admin.load_model("recommend", None, timeout=300)
    wait_for(lambda: http_get_status(served.serve.ready_url) == 200, RECOVERY_WAIT_S, 0.1)


# ----------------------------------------------------------------------------------------
# kill -9 of a stub: the supervisor heals it
# ----------------------------------------------------------------------------------------


def stub_pid(served: Served, model: str) -> int:
    pids = supervisor_status(served)["stub_pids"]
    return next(int(pid) for pid, instance in pids.items() if instance == f"{model}_0_0")


def kill_stub_and_recover(served: Served, model: str) -> dict:
    """Kill `model`'s stub mid-load; returns the measured window and the failures."""
    parameters_before = user_parameters(served.admin.model_config(model))
    with recommend_load(served, duration_s=RECOVERY_WAIT_S + 60) as run:
        time.sleep(WARMUP_S)
        pid = stub_pid(served, model)
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        detected = wait_for(
            lambda: http_get_status(served.serve.ready_url) == 503, DETECT_WAIT_S, 0.02
        )
        reasons = ready_body(served)[1].get("reasons", [])
        recovered = wait_for(
            lambda: http_get_status(served.serve.ready_url) == 200, RECOVERY_WAIT_S, 0.1
        )
        time.sleep(AFTER_S)
    outcomes = run.snapshot()
    failures = [o for o in outcomes if not o.ok]
    ok_after = [o for o in outcomes if o.ok and o.started > recovered]
    events = [e["event"] for e in supervisor_status(served)["events"] if e["model"] == model]
    return {
        "model": model,
        "detect_s": round(detected - killed, 2),
        "recovery_s": round(recovered - killed, 2),
        "reference_load_s": round(served.reference_load_s, 2),
        "reasons": reasons,
        "requests": len(outcomes),
        "failed": len(failures),
        "failed_started_after_recovery": sum(o.started > recovered for o in failures),
        "failure_window_s": round(max((o.ended for o in failures), default=killed) - killed, 2),
        "first_failure_started_s": round(
            min((o.started for o in failures), default=killed) - killed, 2
        ),  # fmt: skip
        "ok_after_recovery": len(ok_after),
        "labels_after": sorted({o.label for o in ok_after}),
        "errors": summarize(failures)["errors"],
        "events": events[-2:],
        "parameters_kept": user_parameters(served.admin.model_config(model)) == parameters_before,
    }


@pytest.mark.parametrize("model", KILLED_MODELS)
def test_killed_stub_is_healed_and_failures_stay_in_the_window(served, model):
    result = kill_stub_and_recover(served, model)
    report("stub_kill", **result)
    assert any(model in reason for reason in result["reasons"]), result["reasons"]
    assert result["events"] == ["dead", "reloaded"]
    # Back within 15 s, or within 3x an operator's load measured in this run when the machine
    # is busy: a reload is a load plus the detection.
    bound_s = max(RECOVERY_BOUND_S, RECOVERY_REFERENCE_FACTOR * served.reference_load_s)
    assert result["recovery_s"] <= bound_s, result
    assert result["failed_started_after_recovery"] == 0, result["errors"]
    # A request already waiting on the dead stub learns it ~1 s later (the backend's health
    # check); nothing fails later than that after /ready is back.
    assert result["failure_window_s"] <= result["recovery_s"] + 2.0
    assert result["first_failure_started_s"] >= -1.0  # only requests in flight at the kill
    assert result["ok_after_recovery"] > 0
    assert result["parameters_kept"], "the reload lost the model's parameters (corpus_file?)"
    assert len(result["labels_after"]) == 1  # one corpus answers, whichever was loaded


# ----------------------------------------------------------------------------------------
# SIGTERM: drain, finish in-flight requests, exit 0
# ----------------------------------------------------------------------------------------


def sigterm_under_load(served: Served) -> dict:
    """SIGTERM the serve command under load; the figures and the requests around it."""
    server_pid = served.server_pid
    limit_s = DRAIN_S + DEFAULT_STOP_TIMEOUT_S + EXIT_TIMEOUT_S + 30
    with recommend_load(served, duration_s=limit_s + 30) as run:
        time.sleep(WARMUP_S)
        termed = time.monotonic()
        served.serve.terminate()
        unready = wait_for(
            lambda: http_get_status(served.serve.ready_url) != 200, DETECT_WAIT_S, 0.02
        )
        if served.serve.process.wait_exit(limit_s) is None:
            pytest.fail("serve did not exit after SIGTERM")
        exited = time.monotonic()
        time.sleep(0.5)  # let clients see the closed ports
    outcomes = run.snapshot()
    in_flight = [o for o in outcomes if o.started < termed <= o.ended]
    draining = [o for o in outcomes if unready <= o.started < termed + DRAIN_S - 0.2]
    after = [o for o in outcomes if o.started >= termed + DRAIN_S]
    kinds = [error_kind(o.error) for o in after if not o.ok]
    figures = {
        "unready_after_s": round(unready - termed, 3),
        "exit_s": round(exited - termed, 2),
        "exit_code": served.serve.process.returncode,
        "in_flight": len(in_flight),
        "in_flight_failed": sum(not o.ok for o in in_flight),
        "during_drain": len(draining),
        "during_drain_failed": sum(not o.ok for o in draining),
        "after_drain_ok": sum(o.ok for o in after),
        "after_drain_refused": kinds.count("refused"),
        "after_drain_cut": kinds.count("cut"),
        "after_drain_other": kinds.count("other"),
        "errors": summarize(after)["errors"],
    }
    assert in_flight and all(o.ok for o in in_flight), summarize(in_flight)["errors"]
    assert all(o.ok for o in draining), summarize(draining)["errors"]
    assert kinds.count("other") == 0, summarize(after)["errors"]
    assert kinds.count("cut") <= WORKERS  # at most the one request on each connection
    assert not is_alive(server_pid), "tritonserver outlived the serve command"
    return figures


def test_sigterm_under_load_drains_and_exits_0(fresh_served):
    figures = sigterm_under_load(fresh_served)
    report("sigterm", **figures)
    said = fresh_served.serve.log.read_text()
    assert figures["exit_code"] == 0, said[-2000:]
    assert "stopped cleanly" in said
    folder = store_folder(fresh_served)  # the user-state store serve started: stopped, kept
    assert (folder / "appendonlydir").is_dir() and not store_is_running(folder)


def test_sigterm_after_a_heal_exits_non_zero_and_says_why(served):
    """Triton 2.51 never finishes unloading a model version whose stub died (the supervisor
    loaded a new one beside it), so the stop outlives Triton's exit timeout."""
    figures = sigterm_under_load(served)
    report("sigterm_after_heal", **figures)
    said = served.serve.log.read_text()
    assert figures["exit_code"] != 0
    assert "the stop outlived" in said and "whose stub died" in said, said[-2000:]


# ----------------------------------------------------------------------------------------
# Nothing outlives the serve command
# ----------------------------------------------------------------------------------------


def port_is_free(port: int) -> bool:
    """A new server could listen on `port` now (connections closing in TIME_WAIT do not count:
    servers set SO_REUSEADDR)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def store_folder(served: Served) -> Path:
    """The folder of the user-state store serve started (its data, kept across runs)."""
    return served.serve.build_dir / STORE_FOLDER


def store_is_running(folder: Path) -> bool:
    """Whether a redis-server holds the store folder's lock (phoenix.user_state.embedded)."""
    with (folder / STORE_LOCK).open("rb") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def store_pid(served: Served) -> int:
    return json.loads((store_folder(served) / STATE_FILE).read_text())["pid"]


def serve_processes(served: Served) -> list[int]:
    """The serve command (under make, or itself), tritonserver and every stub."""
    launchers = [served.serve.process.pid]
    if psutil.Process(served.serve.process.pid).name() == "make":
        launchers = [child.pid for child in psutil.Process(served.serve.process.pid).children()]
    stubs = [int(pid) for pid in supervisor_status(served)["stub_pids"]]
    return [*launchers, served.server_pid, *stubs]


def shared_memory_of(pids: list[int]) -> set[Path]:
    """The server's shared-memory regions, as its processes map them. Nothing can remove them
    after a SIGKILL of serve (the Python backend removes a region when its instance unloads):
    the test does, not to leave 16 MiB in /dev/shm at each run."""
    regions = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                name = line.split()[-1]
                if name.startswith(f"{SHARED_MEMORY}/{SHARED_MEMORY_PREFIX}"):
                    regions.add(Path(name))
    return regions


def remove(regions: set[Path]) -> None:
    for region in regions:
        region.unlink(missing_ok=True)


def left_behind(pids: list[int], ports: ServePorts) -> list[str]:
    return [f"pid {pid}" for pid in pids if is_alive(pid)] + [
        f"port {port}" for port in ports if not port_is_free(port)
    ]


def test_sigkill_of_serve_leaves_no_server_stub_or_port_behind(tiny_artifacts, tmp_path_factory):
    """tritonserver gets SIGKILL from the kernel when serve dies (its parent-death signal), and
    each stub exits once tritonserver is gone: within 5 s nothing runs and every port is free."""
    with serving(tiny_artifacts, tmp_path_factory, "sigkill") as served:
        pids = [*serve_processes(served), store_pid(served)]
        assert len(pids) >= 4, pids  # serve, tritonserver, stubs and the user-state store
        regions = shared_memory_of(pids)
        assert regions, "found no shared memory of the server's"
        killed = time.monotonic()
        served.serve.process.send_signal(signal.SIGKILL)  # serve alone: not its process group
        gone = wait_until(lambda: not left_behind(pids, served.serve.ports), ORPHAN_LIMIT_S)
        report("sigkill", processes=len(pids), gone_after_s=gone and round(gone - killed, 2))
        remove(regions)
        assert gone is not None, left_behind(pids, served.serve.ports)
        # the store's data stays in serve's build folder, for the next start
        assert (store_folder(served) / "appendonlydir").is_dir()


def test_sigkill_of_make_leaves_nothing_behind(tiny_artifacts, tmp_path_factory):
    """`make serve` killed with SIGKILL: serve, make's child, gets SIGKILL from the kernel (its
    parent-death signal), tritonserver follows it and the stubs follow tritonserver: within 5 s
    nothing runs and every port is free."""
    with serving(tiny_artifacts, tmp_path_factory, "sigkill-make", via_make=True) as served:
        pids = serve_processes(served)
        assert psutil.Process(pids[0]).ppid() == served.serve.process.pid  # make runs serve itself
        regions = shared_memory_of(pids)
        killed = time.monotonic()
        served.serve.process.send_signal(signal.SIGKILL)  # make alone: not its process group
        gone = wait_until(lambda: not left_behind(pids, served.serve.ports), ORPHAN_LIMIT_S)
        report("sigkill_make", gone_after_s=gone and round(gone - killed, 2))
        remove(regions)
        assert gone is not None, left_behind(pids, served.serve.ports)
