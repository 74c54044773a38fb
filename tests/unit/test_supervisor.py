"""The supervisor without a server: a fake process table and a fake Triton admin API."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from harness import REPO_ROOT
from harness.memory import rss_bytes
from phoenix.ops import admin_key, serve
from phoenix.ops.supervisor.admin import TritonAPIError
from phoenix.ops.supervisor.endpoints import ReadinessServer
from phoenix.ops.supervisor.state import (
    READINESS_TRITON_TIMEOUT_S,
    RESTART_PARAMETER,
    Supervisor,
    composing_models,
    expected_instances,
    readiness_reasons,
    served_models,
    with_restart_marker,
)
from phoenix.ops.triton_server import flags_to_args, redact_secrets
from phoenix.stub.registry import (
    STUB_DIR_ENV,
    StubProcess,
    list_stubs,
    register_stub,
)
from phoenix.util.processes import is_alive

SERVER_PID = 100


class FakeProcesses:
    """The server's stub children: {pid: instance}, and the pids killed (zombies now)."""

    def __init__(self):
        self.stubs = {101: "retriever_0_0", 102: "ranker_0_0"}
        self.dead: set[int] = set()

    def add(self, pid: int, instance: str) -> None:
        self.stubs[pid] = instance

    def kill(self, pid: int) -> None:
        self.dead.add(pid)

    def list(self, server_pid: int) -> list[StubProcess]:
        assert server_pid == SERVER_PID
        return [StubProcess(p, i) for p, i in self.stubs.items() if p not in self.dead]


def python_config(name: str) -> dict:
    return {
        "name": name,
        "backend": "python",
        "max_batch_size": 8,
        "instance_group": [{"name": f"{name}_0", "count": 1, "kind": "KIND_CPU"}],
        "parameters": {"corpus_file": {"string_value": "corpus-b.npz"}},
        "input": [{"name": "user_id", "data_type": "TYPE_INT64", "dims": [1]}],
    }


class FakeAdmin:
    """The Triton calls the supervisor makes, answered from dicts."""

    def __init__(self, processes: FakeProcesses | None = None):
        self.index = {m: ("READY", "") for m in ("retriever", "ranker", "recommend")}
        self.configs = {name: python_config(name) for name in ("retriever", "ranker")}
        self.configs["recommend"] = {
            "name": "recommend",
            "platform": "ensemble",
            "ensemble_scheduling": {
                "step": [{"model_name": "retriever"}, {"model_name": "ranker"}]
            },
        }
        self.loads: list[tuple[str, dict | None]] = []
        self.fail_loads = 0
        self.ready: bool | None = True
        self.on_load = None
        self.processes = processes
        self.next_pid = 500
        self.index_busy = False
        self.index_timeouts: list[float | None] = []

    def ready_status(self, timeout: float | None = None) -> int | None:
        if self.ready is None:  # no answer in time
            return None
        return 200 if self.ready else 503

    def model_index(self, timeout: float | None = None) -> dict[str, tuple[str, str]]:
        self.index_timeouts.append(timeout)
        if self.index_busy:  # as Triton's index while a model loads: no answer in time
            raise TritonAPIError("/v2/repository/index: timed out")
        return dict(self.index)

    def model_config(self, model: str, timeout: float | None = None) -> dict:
        if self.index.get(model, ("",))[0] != "READY":
            raise TritonAPIError(f"model {model} is not available", 400)
        return json.loads(json.dumps(self.configs[model]))

    def load_model(self, model: str, config: dict | None, timeout: float) -> None:
        if self.on_load:
            self.on_load(model)
        if self.fail_loads:
            self.fail_loads -= 1
            raise TritonAPIError("load failed", 500)
        self.loads.append((model, config))
        self.configs[model] = config or self.configs[model]
        self.index[model] = ("READY", "")
        if self.processes is not None and model != "recommend":  # new stubs start
            self.next_pid += 1
            self.processes.add(self.next_pid, f"{model}_0_0")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def processes() -> FakeProcesses:
    return FakeProcesses()


@pytest.fixture
def admin(processes) -> FakeAdmin:
    return FakeAdmin(processes)


def make_supervisor(admin, processes, **kwargs) -> Supervisor:
    kwargs.setdefault("clock", Clock())
    supervisor = Supervisor(
        "127.0.0.1:1", SERVER_PID, admin=admin, stub_lister=processes.list, **kwargs
    )
    supervisor.prime()  # what start() does, without the thread
    return supervisor


# -- stub processes (their records, on real processes of this machine) -------------------

# A stand-in for tritonserver: it starts one "stub" (argv[1]) and never reaps it, as Triton does.
FAKE_SERVER = """
import subprocess, sys, time
stub = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
print(stub.pid, flush=True)
time.sleep(60)
"""
# What ServiceModel.initialize does at its end, in a stub of instance retriever_0_1.
FAKE_STUB = """
import time
from phoenix.stub.registry import register_stub
register_stub({"model_instance_name": "retriever_0_1", "model_name": "retriever"})
time.sleep(60)
"""


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def write_record(stub_dir: Path, pid: int, instance: str, started: int) -> None:
    record = {"pid": pid, "instance": instance, "started": started}
    (stub_dir / f"{instance}.{pid}.json").write_text(json.dumps(record))


def test_list_stubs_finds_a_registered_stub_of_the_server_and_drops_it_once_killed(
    tmp_path, monkeypatch
):
    """The server's environment names the stub directory; a child of the server that registered
    is found with its instance; killed (a zombie until reaped) it is no stub any more."""
    env = {**os.environ, STUB_DIR_ENV: str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, FAKE_STUB], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        stub_pid = int(server.stdout.readline())
        wait_until(lambda: list_stubs(server.pid))
        assert list_stubs(server.pid) == [StubProcess(stub_pid, "retriever_0_1", "retriever")]
        record = json.loads((tmp_path / f"retriever_0_1.{stub_pid}.json").read_text())
        # Records that match no live child of the server are no stubs: a reused pid (another
        # start time), a live process of another parent (this one, registered as a stub).
        write_record(tmp_path, stub_pid, "ranker_0_0", record["started"] + 1)
        monkeypatch.setenv(STUB_DIR_ENV, str(tmp_path))
        register_stub({"model_instance_name": "ranker_0_1"})
        assert len(list(tmp_path.glob("*.json"))) == 3
        assert list_stubs(server.pid) == [StubProcess(stub_pid, "retriever_0_1", "retriever")]
        assert list_stubs(os.getpid()) == []  # this process has no stub directory
        os.kill(stub_pid, signal.SIGKILL)
        wait_until(lambda: not is_alive(stub_pid))
        assert psutil.Process(stub_pid).status() == psutil.STATUS_ZOMBIE
        assert list_stubs(server.pid) == []
    finally:
        server.kill()
        server.wait()


def test_register_stub_does_nothing_outside_a_server_with_a_stub_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(STUB_DIR_ENV, raising=False)
    register_stub({"model_instance_name": "ranker_0_0"})
    monkeypatch.setenv(STUB_DIR_ENV, str(tmp_path))
    register_stub({"model_instance_name": "ranker_0_0"})
    assert [p.name for p in tmp_path.iterdir()] == [f"ranker_0_0.{os.getpid()}.json"]


def test_a_killed_child_is_a_zombie_and_not_alive_and_is_no_stub():
    child = subprocess.Popen(["sleep", "30"])
    try:
        assert is_alive(child.pid) and rss_bytes(child.pid) > 0
        assert list_stubs(os.getpid()) == []  # a child that is no stub
        child.kill()  # not reaped yet: a zombie, like a killed stub under tritonserver
        deadline = time.monotonic() + 10
        while is_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE
        assert not is_alive(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not is_alive(child.pid) and rss_bytes(child.pid) is None


# -- configs -------------------------------------------------------------------------


def test_expected_instances_follow_the_instance_groups():
    config = {
        "name": "ranker",
        "instance_group": [{"name": "ranker_0", "count": 2}, {"name": "ranker_1", "count": 1}],
    }
    assert expected_instances(config) == {"ranker_0_0", "ranker_0_1", "ranker_1_0"}
    assert expected_instances({"name": "recommend"}) == set()


def test_an_ensemble_depends_on_the_models_of_its_steps(admin):
    assert composing_models(admin.configs["recommend"]) == {"retriever", "ranker"}
    assert composing_models(admin.configs["ranker"]) == set()


def test_restart_marker_keeps_the_config_and_does_not_touch_the_original():
    config = {"name": "retriever", "parameters": {"corpus_file": {"string_value": "b.npz"}}}
    override = with_restart_marker(config, "1@123")
    assert override["parameters"][RESTART_PARAMETER] == {"string_value": "1@123"}
    assert override["parameters"]["corpus_file"] == {"string_value": "b.npz"}
    assert RESTART_PARAMETER not in config["parameters"]


# -- detection and healing ---------------------------------------------------------------


def test_learns_every_served_model_and_the_stubs(admin, processes):
    supervisor = make_supervisor(admin, processes)
    assert sorted(supervisor.models) == ["ranker", "recommend", "retriever"]
    assert supervisor.models["recommend"].instances == set()
    assert supervisor.known_pids == {101: "retriever_0_0", 102: "ranker_0_0"}
    assert supervisor.readiness() == (True, [])


def test_models_loading_after_the_start_are_watched_healed_and_only_then_ready(admin, processes):
    """The supervisor starts with tritonserver, before the models load: each model is learned
    once READY, /ready waits until its stubs were checked, and a late model is healed too."""
    loaded = dict(admin.index)
    admin.index = {model: ("LOADING", "") for model in loaded}
    supervisor = make_supervisor(admin, processes)
    assert supervisor.models == {}
    admin.index["retriever"] = ("READY", "")
    ready, reasons = supervisor.readiness()
    assert not ready and "model retriever is not watched by the supervisor yet" in reasons
    supervisor.poll_once()
    assert sorted(supervisor.models) == ["retriever"]
    admin.index = loaded
    supervisor.poll_once()
    assert sorted(supervisor.models) == ["ranker", "recommend", "retriever"]
    assert supervisor.readiness() == (True, [])
    processes.kill(102)  # the ranker's stub: the ranker became READY last
    supervisor.poll_once()
    assert [model for model, _ in admin.loads] == ["ranker"]


def test_a_killed_stub_is_reloaded_with_its_current_config(admin, processes):
    supervisor = make_supervisor(admin, processes)
    seen_during_load = []
    admin.on_load = lambda model: seen_during_load.append(supervisor.readiness())
    processes.kill(101)
    supervisor.poll_once()

    [(model, config)] = admin.loads
    assert model == "retriever"
    assert config["parameters"]["corpus_file"] == {"string_value": "corpus-b.npz"}
    assert config["parameters"][RESTART_PARAMETER]["string_value"].startswith("1@")
    assert seen_during_load == [
        (False, ["model retriever is reloading", "model recommend needs retriever"])
    ]
    assert [e["event"] for e in supervisor.events] == ["dead", "reloaded"]
    assert supervisor.models["retriever"].state == "healthy"
    assert 101 not in supervisor.known_pids  # the new stub is watched instead
    assert supervisor.readiness() == (True, [])


def test_ready_answers_in_bounded_time_while_triton_is_busy_loading_naming_the_model(
    admin, processes
):
    """Found in CI: Triton answers its repository index only once a load ends, and a /ready
    probe during a reload timed out in the client's 2 s. /ready asks with a short timeout and
    then answers from the supervisor's own state."""
    supervisor = make_supervisor(admin, processes)
    seen_during_load = []

    def busy_load(model):
        admin.index_busy = True
        seen_during_load.append(supervisor.readiness())
        admin.index_busy = False

    admin.on_load = busy_load
    processes.kill(101)
    supervisor.poll_once()
    [(ready, reasons)] = seen_during_load
    assert ready is False
    assert reasons == [
        "triton does not answer: /v2/repository/index: timed out",
        "model retriever is reloading",
    ]
    assert READINESS_TRITON_TIMEOUT_S in admin.index_timeouts  # /ready asked with its bound
    assert supervisor.readiness() == (True, [])


def test_events_carry_wall_clock_times_and_reloads_monotonic_durations(admin, processes):
    """/status dates events for an operator (ISO 8601, UTC); the reload's duration comes from
    the monotonic clock, which a wall-clock step does not move."""
    clock = Clock()
    wall = [1_767_225_600.0]  # 2026-01-01T00:00:00Z

    def load_takes_2_5_s(model):
        clock.now += 2.5
        wall[0] -= 3600.0  # the wall clock is set back an hour meanwhile

    supervisor = make_supervisor(admin, processes, clock=clock, wall_clock=lambda: wall[0])
    admin.on_load = load_takes_2_5_s
    processes.kill(101)
    supervisor.poll_once()
    dead, reloaded = supervisor.events
    assert dead["time"] == "2026-01-01T00:00:00.000+00:00"
    assert reloaded["time"] == "2025-12-31T23:00:00.000+00:00"
    assert reloaded["seconds"] == 2.5
    assert supervisor.status()["time"] == "2025-12-31T23:00:00.000+00:00"


def test_a_second_kill_gets_a_new_marker(admin, processes):
    supervisor = make_supervisor(admin, processes)
    processes.kill(101)
    supervisor.poll_once()
    processes.kill(admin.next_pid)
    supervisor.poll_once()
    markers = [c["parameters"][RESTART_PARAMETER]["string_value"] for _, c in admin.loads]
    assert len(markers) == 2 and markers[0] != markers[1]


def test_a_failed_reload_is_retried_after_a_backoff_and_given_up_after_the_cap(admin, processes):
    clock = Clock()
    supervisor = make_supervisor(admin, processes, clock=clock, max_failed_reloads=3)
    admin.fail_loads = 3
    processes.kill(101)
    supervisor.poll_once()
    assert supervisor.models["retriever"].state == "failed"
    assert supervisor.readiness()[0] is False
    supervisor.poll_once()  # too early: no second attempt yet
    assert admin.fail_loads == 2
    for wait_s in (1.5, 2.5):  # back-off 1 s, then 2 s
        clock.now += wait_s
        supervisor.poll_once()
    assert admin.fail_loads == 0 and supervisor.models["retriever"].state == "gave_up"
    clock.now += 1000
    supervisor.poll_once()
    assert admin.loads == []  # the cap holds
    ready, reasons = supervisor.readiness()
    assert not ready and reasons[0].startswith("model retriever failed to reload too often")


def test_a_failed_reload_that_then_works_is_healthy(admin, processes):
    clock = Clock()
    supervisor = make_supervisor(admin, processes, clock=clock)
    admin.fail_loads = 1
    processes.kill(101)
    supervisor.poll_once()
    clock.now += 1.5
    supervisor.poll_once()
    assert [m for m, _ in admin.loads] == ["retriever"]
    assert supervisor.models["retriever"].state == "healthy"
    assert supervisor.readiness() == (True, [])


def test_an_operator_reload_that_replaces_the_stub_is_not_a_death(admin, processes):
    supervisor = make_supervisor(admin, processes)
    processes.add(301, "retriever_0_0")  # the new version's stub
    processes.kill(101)  # the old version's stub exits after the new one is up
    supervisor.poll_once()
    assert admin.loads == [] and supervisor.events == []
    assert supervisor.known_pids[301] == "retriever_0_0"


def test_an_operator_unload_is_respected_and_ready_names_the_model_and_its_ensemble(
    admin, processes
):
    supervisor = make_supervisor(admin, processes)
    admin.index["ranker"] = ("UNAVAILABLE", "unloaded")  # what Triton reports after an unload
    processes.kill(102)
    ready, reasons = supervisor.readiness()  # at once, before the watch runs
    assert not ready
    assert reasons == ["model ranker was unloaded by an operator", "model recommend needs ranker"]
    supervisor.poll_once()
    supervisor.poll_once()
    assert admin.loads == []
    assert supervisor.models["ranker"].state == "unloaded"
    assert [e["event"] for e in supervisor.events] == ["unloaded"]
    # The operator loads it again: healthy, ready.
    admin.index["ranker"] = ("READY", "")
    processes.add(303, "ranker_0_0")
    supervisor.poll_once()
    assert supervisor.models["ranker"].state == "healthy"
    assert supervisor.readiness() == (True, [])


def test_an_ensemble_unloaded_with_its_step_is_named_too(admin, processes):
    supervisor = make_supervisor(admin, processes)
    admin.index["ranker"] = admin.index["recommend"] = ("UNAVAILABLE", "unloaded")
    assert supervisor.readiness() == (
        False,
        ["model ranker was unloaded by an operator", "model recommend was unloaded by an operator"],
    )


def test_a_model_lost_without_an_unload_is_reloaded(admin, processes):
    supervisor = make_supervisor(admin, processes)
    admin.index["recommend"] = ("UNAVAILABLE", "load failed: ranker missing")
    assert supervisor.readiness() == (
        False,
        ["model recommend is UNAVAILABLE: load failed: ranker missing"],
    )
    supervisor.poll_once()
    assert admin.loads == [("recommend", admin.configs["recommend"])]
    assert [e["event"] for e in supervisor.events] == ["dead", "reloaded"]
    assert supervisor.readiness() == (True, [])


def test_models_in_transition_are_not_ready_but_not_healed(admin, processes):
    supervisor = make_supervisor(admin, processes)
    admin.index["retriever"] = ("LOADING", "")
    supervisor.poll_once()
    assert admin.loads == []
    assert supervisor.readiness() == (
        False,
        ["model retriever is LOADING", "model recommend needs retriever"],
    )


def test_draining_and_an_unready_triton_make_readiness_false(admin, processes):
    supervisor = make_supervisor(admin, processes)
    admin.ready = False
    assert supervisor.readiness() == (False, ["triton is not ready"])
    admin.ready = None  # its health check not answered in time, its index answered: busy
    assert supervisor.readiness() == (True, [])
    admin.ready = True
    supervisor.drain()
    assert supervisor.readiness() == (False, ["draining: the server is shutting down"])


# -- the /ready endpoint -----------------------------------------------------------------


def http_get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_ready_endpoint_answers_503_with_reasons(admin, processes):
    supervisor = make_supervisor(admin, processes)
    endpoint = ReadinessServer(supervisor, "127.0.0.1", 0, is_live=lambda: True).start()
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        assert http_get(base + "/ready") == (200, {"ready": True, "reasons": [], "degraded": []})
        supervisor.models["ranker"].state = "dead"
        code, body = http_get(base + "/ready")
        assert code == 503 and body["reasons"][0].startswith("model ranker is dead")
        assert body["reasons"][1] == "model recommend needs ranker"
        code, status = http_get(base + "/status")
        assert code == 200 and status["models"]["ranker"]["state"] == "dead"
        assert status["stub_pids"] == {"101": "retriever_0_0", "102": "ranker_0_0"}
        assert http_get(base + "/live") == (200, {"live": True})
        assert http_get(base + "/nothing-here")[0] == 404
    finally:
        endpoint.stop()


# -- the admin key -----------------------------------------------------------------------


def test_without_a_key_serve_generates_one_into_a_private_file_and_reuses_it(tmp_path, monkeypatch):
    monkeypatch.delenv("PHOENIX_ADMIN_KEY", raising=False)
    key, path = admin_key.server_admin_key(tmp_path / "build")
    assert path == tmp_path / "build" / "admin-key"
    assert admin_key.is_valid_key(key) and path.read_text().strip() == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert admin_key.server_admin_key(tmp_path / "build") == (key, path)  # a restart keeps it
    monkeypatch.chdir(tmp_path)
    assert admin_key.find_admin_key(key_file=path) == key  # how the tools find it


def test_a_key_file_others_could_read_is_replaced_and_never_used(tmp_path, monkeypatch):
    monkeypatch.delenv("PHOENIX_ADMIN_KEY", raising=False)
    path = tmp_path / "admin-key"
    path.write_text("k" * 32)
    path.chmod(0o644)
    assert admin_key.find_admin_key(key_file=path) is None
    key, _ = admin_key.server_admin_key(tmp_path)
    assert key != "k" * 32 and path.stat().st_mode & 0o777 == 0o600


def test_the_environment_key_wins_and_is_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_ADMIN_KEY", "e" * 20)
    assert admin_key.server_admin_key(tmp_path) == ("e" * 20, None)
    assert not (tmp_path / "admin-key").exists()
    assert admin_key.find_admin_key(key_file=tmp_path / "none") == "e" * 20


@pytest.mark.parametrize("key", ["short", "has:colon-0123456789", "has,comma-0123456789"])
def test_admin_keys_triton_cannot_parse_are_refused(key, tmp_path, monkeypatch):
    monkeypatch.setenv("PHOENIX_ADMIN_KEY", key)
    with pytest.raises(admin_key.AdminKeyError, match="at least 16 characters"):
        admin_key.server_admin_key(tmp_path)


def test_grpc_carries_the_key_with_tritons_prefix():
    assert admin_key.admin_headers("k", "http") == {"phoenix-admin-key": "k"}
    assert admin_key.admin_headers("k", "grpc") == {"triton-grpc-protocol-phoenix-admin-key": "k"}
    assert admin_key.admin_headers(None) is None


def test_server_flags_always_restrict_admin_apis():
    expected = "model-repository,shared-memory,trace,logging:phoenix-admin-key=" + "k" * 20
    for supervised in (True, False):
        flags = serve.server_flags(supervised=supervised, admin_key="k" * 20)
        assert flags["http_restricted_api"] == flags["grpc_restricted_protocol"] == expected
    flags = serve.server_flags(supervised=True, admin_key="k" * 20)
    assert flags["model_control_mode"] == "explicit" and flags["load_model"] == "*"


def test_the_admin_key_is_redacted_from_error_messages():
    command = ["tritonserver", "--http-restricted-api=model-repository:phoenix-admin-key=s3cret"]
    assert (
        redact_secrets(command)[1] == "--http-restricted-api=model-repository:phoenix-admin-key=***"
    )


def test_serve_parser_has_the_reliability_options():
    args = serve.build_parser().parse_args(
        ["--supervisor-port", "0", "--drain-seconds", "2", "--stop-timeout", "9"]
    )
    assert (args.supervisor_port, args.drain_seconds, args.stop_timeout) == (0, 2.0, 9.0)
    assert args.no_supervisor is False


def test_an_unusable_store_is_reported_degraded_and_keeps_readiness(admin, processes):
    reason = ["user state store redis://127.0.0.1:1/0 unavailable during ping"]
    supervisor = make_supervisor(admin, processes, degraded_by=[lambda: reason[0]])
    assert supervisor.readiness() == (True, [])
    assert supervisor.degraded() == reason and supervisor.status()["degraded"] == reason
    reason[0] = None
    assert supervisor.readiness() == (True, []) and supervisor.degraded() == []


def test_a_rollouts_next_model_is_watched_while_loaded_and_forgotten_when_unloaded(
    admin, processes
):
    """A rollout loads ``ranker__next`` beside ``ranker`` and unloads it after the switch: a
    planned unload, so /ready stays 200 and nothing reloads it, where an operator's unload of
    a served model turns /ready 503."""
    supervisor = make_supervisor(admin, processes)
    admin.index["ranker__next"] = ("READY", "")
    admin.configs["ranker__next"] = python_config("ranker__next")
    processes.add(404, "ranker__next_0_0")
    supervisor.poll_once()
    assert supervisor.models["ranker__next"].state == "healthy"
    assert supervisor.readiness() == (True, [])
    admin.index["ranker__next"] = ("UNAVAILABLE", "unloaded")
    processes.kill(404)
    supervisor.poll_once()
    supervisor.poll_once()
    assert "ranker__next" not in supervisor.models and admin.loads == []
    assert supervisor.readiness() == (True, [])
    assert [e["event"] for e in supervisor.events][-1:] == ["forgotten"]
    # its folder removed too: gone from the index, still nothing to heal
    del admin.index["ranker__next"]
    supervisor.poll_once()
    assert supervisor.readiness() == (True, []) and admin.loads == []


# -- readiness through a rollout: only the models requests reach count --------------------


def test_served_models_follow_the_ensembles_steps_and_leave_transient_copies_out():
    healthy = ("healthy", "")
    models = {
        "recommend": (*healthy, {"recommend_chain__next"}),
        "recommend_chain": (*healthy, set()),
        "ranker": (*healthy, set()),
        "ranker__next": (*healthy, set()),
        "recommend_chain__next": (*healthy, set()),
    }
    assert served_models(models) == {"recommend", "recommend_chain", "ranker",
                                     "recommend_chain__next"}  # fmt: skip
    models["recommend"] = (*healthy, {"recommend_chain"})
    assert served_models(models) == {"recommend", "recommend_chain", "ranker"}


@pytest.mark.parametrize(
    "copy_state",
    [("LOADING", ""), ("UNLOADING", ""), ("UNAVAILABLE", "unloaded"), ("READY", "")],
)
def test_a_copy_no_ensemble_calls_is_no_reason_whatever_its_state(copy_state):
    """A rollout's ``__next`` copy loading, unloading, unloaded or not yet watched: the served
    models answer, so /ready stays 200."""
    models = {
        "recommend": ("healthy", "", {"ranker"}),
        "ranker": ("healthy", "", set()),
        "ranker__next": ("healthy", "", set()),
    }
    index = {"recommend": ("READY", ""), "ranker": ("READY", ""), "ranker__next": copy_state}
    assert readiness_reasons(models, index, watched={"recommend", "ranker"}) == []
    # nor a copy dead or reloading beside (the supervisor heals it; /status shows it)
    models["ranker__next"] = ("dead", "", set())
    assert readiness_reasons(models, index, watched={"recommend", "ranker"}) == []


def test_a_copy_the_served_ensemble_calls_counts_like_any_served_model():
    models = {
        "recommend": ("healthy", "", {"ranker__next"}),
        "ranker": ("healthy", "", set()),
        "ranker__next": ("healthy", "", set()),
    }
    index = {m: ("READY", "") for m in models}
    # just loaded: Triton READY, the watch not yet round; not a reason for a copy
    assert readiness_reasons(models, index, watched={"recommend", "ranker"}) == []
    models["ranker__next"] = ("dead", "", set())
    assert readiness_reasons(models, index, watched=set(models)) == [
        "model ranker__next is dead (its stub died or its load failed); reloading",
        "model recommend needs ranker__next",
    ]
    models["ranker__next"] = ("healthy", "", set())
    index["ranker__next"] = ("UNLOADING", "")
    assert readiness_reasons(models, index, watched=set(models)) == [
        "model ranker__next is UNLOADING",
        "model recommend needs ranker__next",
    ]


def test_a_model_called_by_name_must_be_watched_ready_and_healthy():
    models = {"recommend": ("healthy", "", {"ranker"}), "ranker": ("healthy", "", set())}
    index = {m: ("READY", "") for m in models}
    assert readiness_reasons(models, index, watched={"recommend"}) == [
        "model ranker is not watched by the supervisor yet"
    ]
    index["ranker"] = ("UNAVAILABLE", "unloaded")
    assert readiness_reasons(models, index, watched=set(models)) == [
        "model ranker was unloaded by an operator",
        "model recommend needs ranker",
    ]


def test_readiness_holds_through_a_rollouts_steps_and_follows_the_switch(admin, processes):
    """The rollout's loads and unloads as Triton's index shows them, the watch running between
    them: /ready 200 at every step; a dead copy while recommend calls it: 503, naming both."""
    supervisor = make_supervisor(admin, processes)
    seen = []

    def step(**index) -> None:
        for model, state in index.items():
            admin.index[model] = state
        seen.append(supervisor.readiness())
        supervisor.poll_once()
        seen.append(supervisor.readiness())

    admin.configs["ranker__next"] = python_config("ranker__next")
    step(ranker__next=("LOADING", ""))
    processes.add(404, "ranker__next_0_0")
    step(ranker__next=("READY", ""))
    admin.configs["recommend"] = switched = json.loads(json.dumps(admin.configs["recommend"]))
    switched["ensemble_scheduling"]["step"][1]["model_name"] = "ranker__next"
    step()  # recommend now calls ranker__next
    assert supervisor.models["recommend"].composing == {"retriever", "ranker__next"}
    processes.kill(404)  # honest meanwhile: recommend's copy dies, its first reload fails
    admin.fail_loads = 1
    supervisor.poll_once()
    ready, reasons = supervisor.readiness()
    assert not ready and reasons[-1] == "model recommend needs ranker__next", reasons
    supervisor.clock.now += 2  # past the back-off: reloaded (the fake's load starts a stub)
    supervisor.poll_once()
    assert supervisor.readiness() == (True, [])
    admin.configs["recommend"]["ensemble_scheduling"]["step"][1]["model_name"] = "ranker"
    step()  # back on the names
    step(ranker__next=("UNLOADING", ""))
    step(ranker__next=("UNAVAILABLE", "unloaded"))
    assert seen == [(True, [])] * len(seen) and "ranker__next" not in supervisor.models


def test_serve_runs_triton_with_readiness_that_a_rollouts_loads_do_not_turn_false():
    flags = serve.server_flags(supervised=True, admin_key="k" * 20)
    assert "--strict-readiness=false" in flags_to_args(flags)
    assert "strict_readiness" not in serve.server_flags(supervised=False, admin_key="k" * 20)
