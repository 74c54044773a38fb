"""The supervisor without a server: a fake /proc tree and a fake Triton admin API."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from phoenix.serving import serve
from phoenix.serving.supervisor import (
    RESTART_PARAMETER,
    ReadinessServer,
    StubProcess,
    Supervisor,
    TritonAPIError,
    expected_instances,
    is_alive,
    list_stubs,
    probe_body,
    rss_bytes,
    stub_instance_of,
    with_restart_marker,
)
from phoenix.serving.triton_server import redact_secrets

SERVER_PID = 100
STUB = "/venv/triton-backends/python/triton_python_backend_stub"


def stub_argv(model: str, instance: str) -> list[str]:
    """A stub's command line as Triton 2.51 writes it."""
    return [
        STUB, f"/repo/{model}/1/model.py", "triton_python_backend_shm_region_1a2b-3c4d",
        "1048576", "1048576", str(SERVER_PID), "/venv/triton-backends/python", "336",
        instance, "DEFAULT",
    ]  # fmt: skip


class FakeProc:
    """A /proc-like tree: <pid>/stat, <pid>/cmdline and <pid>/status files."""

    def __init__(self, root: Path):
        self.root = root

    def add(self, pid: int, ppid: int, argv: list[str], state: str = "S", rss_kb: int = 1000):
        folder = self.root / str(pid)
        folder.mkdir(parents=True, exist_ok=True)
        name = Path(argv[0]).name[:15] if argv else "?"
        (folder / "stat").write_text(f"{pid} ({name} x) {state} {ppid} {pid} {pid} 0 -1 4194560")
        (folder / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (folder / "status").write_text(f"Name:\t{name}\nVmRSS:\t  {rss_kb} kB\n")

    def kill(self, pid: int) -> None:
        """What kill -9 leaves behind: a zombie with an empty command line."""
        stat = self.root / str(pid) / "stat"
        parts = stat.read_text().split(") ", 1)
        fields = parts[1].split(" ", 1)
        stat.write_text(f"{parts[0]}) Z {fields[1]}")
        (self.root / str(pid) / "cmdline").write_bytes(b"")


class FakeAdmin:
    """The Triton HTTP calls the supervisor makes, answered from dicts."""

    def __init__(self, proc: FakeProc | None = None):
        self.states = {"retriever": "READY", "ranker": "READY", "recommend": "READY"}
        self.configs = {
            name: {
                "name": name,
                "backend": "python",
                "max_batch_size": 8,
                "instance_group": [{"name": f"{name}_0", "count": 1, "kind": "KIND_CPU"}],
                "parameters": {"corpus_file": {"string_value": "corpus-b.npz"}},
                "input": [{"name": "user_id", "data_type": "TYPE_INT64", "dims": [1]}],
            }
            for name in ("retriever", "ranker")
        }
        self.configs["recommend"] = {"name": "recommend", "platform": "ensemble"}
        self.loads: list[tuple[str, dict]] = []
        self.fail_loads = 0
        self.ready = True
        self.probes: dict[str, str] = {}
        self.on_load = None
        self.proc = proc
        self.next_pid = 500

    def is_ready(self) -> bool:
        return self.ready

    def model_states(self) -> dict[str, str]:
        return dict(self.states)

    def model_config(self, model: str) -> dict:
        if self.states.get(model) != "READY":
            raise TritonAPIError(f"model {model} is not available", 400)
        return json.loads(json.dumps(self.configs[model]))

    def load_model(self, model: str, config: dict, timeout: float) -> None:
        if self.on_load:
            self.on_load(model)
        if self.fail_loads:
            self.fail_loads -= 1
            raise TritonAPIError("load failed", 500)
        self.loads.append((model, config))
        self.configs[model] = config
        if self.proc is not None:  # the reload starts a new stub
            self.next_pid += 1
            self.proc.add(self.next_pid, SERVER_PID, stub_argv(model, f"{model}_0_0"))

    def probe(self, model: str, body: dict, timeout: float = 10.0) -> str:
        return self.probes.get(model, "alive")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def proc(tmp_path) -> FakeProc:
    fake = FakeProc(tmp_path / "proc")
    fake.add(SERVER_PID, 1, ["/bin/tritonserver", "--model-repository=/repo"])
    fake.add(101, SERVER_PID, stub_argv("retriever", "retriever_0_0"))
    fake.add(102, SERVER_PID, stub_argv("ranker", "ranker_0_0"))
    return fake


@pytest.fixture
def admin(proc) -> FakeAdmin:
    return FakeAdmin(proc)


def make_supervisor(admin, proc, **kwargs) -> Supervisor:
    kwargs.setdefault("clock", Clock())
    supervisor = Supervisor(
        "127.0.0.1:1", SERVER_PID, admin=admin, proc_root=proc.root, rescan_interval_s=5.0,
        **kwargs,
    )  # fmt: skip
    supervisor.prime()  # what start() does, without the thread
    return supervisor


# -- stub processes ----------------------------------------------------------------------


def test_stub_instance_is_read_from_the_stub_command_line():
    assert stub_instance_of(stub_argv("user_encoder", "user_encoder_0_0")) == "user_encoder_0_0"
    assert stub_instance_of(["/usr/bin/python3", "-m", "x"]) is None
    assert stub_instance_of([STUB, "model.py"]) is None  # too short
    assert stub_instance_of([]) is None


def test_list_stubs_finds_live_children_only(proc):
    proc.add(103, SERVER_PID, ["/usr/bin/sleep", "10"])  # a child that is no stub
    proc.add(201, 7, stub_argv("ranker", "ranker_0_0"))  # another server's stub
    proc.add(104, SERVER_PID, stub_argv("ranker", "ranker_0_1"))
    proc.kill(104)
    stubs = sorted(list_stubs(SERVER_PID, proc.root), key=lambda s: s.pid)
    assert stubs == [StubProcess(101, "retriever_0_0"), StubProcess(102, "ranker_0_0")]


def test_a_killed_stub_is_a_zombie_and_not_alive(proc):
    assert is_alive(101, proc.root)
    proc.kill(101)
    assert not is_alive(101, proc.root)
    assert not is_alive(999, proc.root)  # gone altogether


def test_rss_is_read_from_status(proc):
    proc.add(105, SERVER_PID, ["/bin/x"], rss_kb=2048)
    assert rss_bytes(105, proc.root) == 2048 * 1024
    assert rss_bytes(999, proc.root) is None


# -- configs -----------------------------------------------------------------------------


def test_expected_instances_follow_the_instance_groups():
    config = {
        "name": "ranker",
        "instance_group": [{"name": "ranker_0", "count": 2}, {"name": "ranker_1", "count": 1}],
    }
    assert expected_instances(config) == {"ranker_0_0", "ranker_0_1", "ranker_1_0"}
    assert expected_instances({"name": "recommend"}) == set()


def test_restart_marker_keeps_the_config_and_does_not_touch_the_original():
    config = {"name": "retriever", "parameters": {"corpus_file": {"string_value": "b.npz"}}}
    override = with_restart_marker(config, "1@123")
    assert override["parameters"][RESTART_PARAMETER] == {"string_value": "1@123"}
    assert override["parameters"]["corpus_file"] == {"string_value": "b.npz"}
    assert RESTART_PARAMETER not in config["parameters"]


def test_probe_request_fills_required_inputs_with_values_validation_refuses():
    config = {
        "max_batch_size": 8,
        "input": [
            {"name": "user_embedding", "data_type": "TYPE_FP32", "dims": [-1]},
            {"name": "top_k", "data_type": "TYPE_INT32", "dims": [1]},
            {"name": "history_actions", "data_type": "TYPE_FP32", "dims": [-1, -1]},
            {"name": "seen", "data_type": "TYPE_INT64", "dims": [-1], "optional": True},
        ],
    }
    body = probe_body(config)
    assert [(i["name"], i["shape"], i["data"]) for i in body["inputs"]] == [
        ("user_embedding", [1, 1], [-1.0]),
        ("top_k", [1, 1], [-1]),
        ("history_actions", [1, 1, 1], [-1.0]),
    ]
    assert probe_body({"input": [{"name": "s", "data_type": "TYPE_STRING", "dims": [1]}]}) is None


# -- detection and healing ---------------------------------------------------------------


def test_learns_python_models_but_not_the_ensemble(admin, proc):
    supervisor = make_supervisor(admin, proc)
    assert sorted(supervisor.models) == ["ranker", "retriever"]
    assert supervisor.known_pids == {101: "retriever_0_0", 102: "ranker_0_0"}
    assert supervisor.readiness() == (True, [])


def test_a_killed_stub_is_reloaded_with_its_current_config(admin, proc):
    supervisor = make_supervisor(admin, proc)
    seen_during_load = []
    admin.on_load = lambda model: seen_during_load.append(supervisor.readiness())
    proc.kill(101)
    supervisor.poll_once()

    [(model, config)] = admin.loads
    assert model == "retriever"
    assert config["parameters"]["corpus_file"] == {"string_value": "corpus-b.npz"}
    assert config["parameters"][RESTART_PARAMETER]["string_value"].startswith("1@")
    assert seen_during_load == [(False, ["model retriever is reloading"])]
    assert [e["event"] for e in supervisor.events] == ["dead", "reloaded"]
    assert supervisor.models["retriever"].state == "healthy"
    assert 101 not in supervisor.known_pids  # the new stub is watched instead
    assert supervisor.readiness() == (True, [])


def test_a_second_kill_gets_a_new_marker(admin, proc):
    supervisor = make_supervisor(admin, proc)
    proc.kill(101)
    supervisor.poll_once()
    proc.kill(admin.next_pid)
    supervisor.poll_once()
    markers = [c["parameters"][RESTART_PARAMETER]["string_value"] for _, c in admin.loads]
    assert len(markers) == 2 and markers[0] != markers[1]


def test_a_failed_reload_is_retried_after_a_backoff(admin, proc):
    clock = Clock()
    supervisor = make_supervisor(admin, proc, clock=clock)
    admin.fail_loads = 1
    proc.kill(101)
    supervisor.poll_once()
    assert supervisor.models["retriever"].state == "failed"
    assert supervisor.readiness()[0] is False
    supervisor.poll_once()  # too early: no second attempt yet
    assert admin.loads == []
    clock.now += 1.5
    supervisor.poll_once()
    assert [m for m, _ in admin.loads] == ["retriever"]
    assert supervisor.models["retriever"].state == "healthy"


def test_an_operator_reload_that_replaces_the_stub_is_not_a_death(admin, proc):
    supervisor = make_supervisor(admin, proc)
    proc.add(301, SERVER_PID, stub_argv("retriever", "retriever_0_0"))  # new version's stub
    proc.kill(101)  # old version's stub exits after the new one is up
    supervisor.poll_once()
    assert admin.loads == [] and supervisor.events == []
    assert supervisor.known_pids[301] == "retriever_0_0"


def test_a_model_unloaded_on_purpose_is_left_alone(admin, proc):
    supervisor = make_supervisor(admin, proc)
    admin.states["retriever"] = "UNAVAILABLE"
    proc.kill(101)
    supervisor.poll_once()
    assert admin.loads == []
    assert "retriever" not in supervisor.models


def test_probes_find_dead_stubs_without_a_pid(admin):
    supervisor = Supervisor("127.0.0.1:1", None, admin=admin, probe_interval_s=1.0, clock=Clock())
    supervisor.refresh_models()
    supervisor.poll_once()
    assert admin.loads == []
    admin.probes["ranker"] = "dead"
    supervisor._next_probe = 0.0
    supervisor.poll_once()
    assert [m for m, _ in admin.loads] == ["ranker"]


def test_draining_and_an_unready_triton_make_readiness_false(admin, proc):
    supervisor = make_supervisor(admin, proc)
    admin.ready = False
    assert supervisor.readiness() == (False, ["triton is not ready"])
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


def test_ready_endpoint_answers_503_with_reasons(admin, proc):
    supervisor = make_supervisor(admin, proc)
    endpoint = ReadinessServer(supervisor, "127.0.0.1", 0, is_live=lambda: True).start()
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        assert http_get(base + "/ready") == (200, {"ready": True, "reasons": []})
        supervisor.models["ranker"].state = "dead"
        assert http_get(base + "/ready") == (
            503,
            {"ready": False, "reasons": ["model ranker is dead"]},
        )
        code, status = http_get(base + "/status")
        assert code == 200 and status["models"]["ranker"]["state"] == "dead"
        assert status["stub_pids"] == {"101": "retriever_0_0", "102": "ranker_0_0"}
        assert http_get(base + "/live") == (200, {"live": True})
        assert http_get(base + "/nothing-here")[0] == 404
    finally:
        endpoint.stop()


# -- serve: admin key and server flags ---------------------------------------------------


def test_loopback_needs_no_admin_key():
    assert serve.checked_admin_key("127.0.0.1", None) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "myhost"])
def test_exposing_without_an_admin_key_is_refused(host):
    with pytest.raises(serve.ServeError, match="refusing to serve"):
        serve.checked_admin_key(host, None)


@pytest.mark.parametrize("key", ["short", "has:colon-0123456789", "has,comma-0123456789"])
def test_admin_keys_triton_cannot_parse_are_refused(key):
    with pytest.raises(serve.ServeError, match="at least 16 characters"):
        serve.checked_admin_key("0.0.0.0", key)


def test_server_flags_restrict_admin_apis_and_enable_explicit_control():
    flags = serve.server_flags(supervised=True, admin_key="k" * 20)
    assert flags["model_control_mode"] == "explicit" and flags["load_model"] == "*"
    expected = "model-repository,shared-memory,trace,logging:phoenix-admin-key=" + "k" * 20
    assert flags["http_restricted_api"] == flags["grpc_restricted_protocol"] == expected
    assert serve.server_flags(supervised=False, admin_key=None) == {
        "exit_timeout_secs": serve.EXIT_TIMEOUT_S
    }


def test_the_admin_key_is_redacted_from_error_messages():
    command = ["tritonserver", "--http-restricted-api=model-repository:phoenix-admin-key=s3cret"]
    assert (
        redact_secrets(command)[1] == "--http-restricted-api=model-repository:phoenix-admin-key=***"
    )


def test_serve_parser_has_the_reliability_options():
    args = serve.build_parser().parse_args(["--supervisor-port", "0", "--drain-seconds", "2"])
    assert (args.supervisor_port, args.drain_seconds, args.no_supervisor) == (0, 2.0, False)
