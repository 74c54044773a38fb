"""The rendered Deployment's container, run here for real: serve with the manifest's own args
(ports made free, loopback, tiny artifacts) and the image's way of naming Triton
(PHOENIX_TRITON_HOME pointing at a /opt/tritonserver-like folder). The manifest's probe paths
answer on its probe port, Triton serves on its HTTP, gRPC and metrics ports, and a SIGTERM
ends in exit 0 within the grace period the manifest leaves after its preStop sleep."""

from __future__ import annotations

import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient

from harness.polling import wait_until
from phoenix.ops.triton_install import BACKEND_DIR, TRITON_HOME_ENV, pytriton_server_root
from phoenix.util.processes import LoggedProcess, http_get_status, pick_free_ports
from tests.deploy_checks import K8S_DIR, PORT_OPTIONS, render, serving_container, sleep_seconds

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
READY_TIMEOUT_S = float(os.environ.get("PHOENIX_TEST_READY_TIMEOUT", "300"))  # as test_faults


def triton_home(root: Path) -> Path:
    """A folder laid out as NVIDIA's image lays out /opt/tritonserver: bin/tritonserver and
    backends/python, here links to the wheel's server and the project's backend folder."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "tritonserver").symlink_to(pytriton_server_root() / "bin" / "tritonserver")
    (root / "backends").mkdir()
    (root / "backends" / "python").symlink_to((BACKEND_DIR / "python").resolve())
    return root


def local_args(args: list[str], ports: dict[str, int], artifacts: Path, build: Path) -> list[str]:
    """The manifest's args with free ports, loopback, these artifacts and build folder."""
    replaced = {f"--{option.replace('_', '-')}": str(ports[name])
                for name, option in PORT_OPTIONS.items()}  # fmt: skip
    replaced.update(
        {"--host": "127.0.0.1", "--artifacts": str(artifacts), "--build-dir": str(build)}
    )
    out = []
    for arg in args:
        option = arg.split("=", 1)[0]
        out.append(f"{option}={replaced[option]}" if option in replaced else arg)
    return [*out, "--quiet"]


def secret_values(container: dict, store_url: str) -> dict[str, str]:
    """The container's env taken from Secrets, as the cluster would fill it: the store's URL
    (phoenix-redis) is ``store_url``; a Secret this test does not know fails it."""
    known = {("phoenix-redis", "url"): store_url}
    env = {}
    for entry in container["env"]:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref and not ref.get("optional"):
            env[entry["name"]] = known[(ref["name"], ref["key"])]
    return env


def test_the_deployments_container_runs_here_and_stops_within_its_grace_period(
    tiny_artifacts, redis_server, tmp_path
):
    deployment = next(o for o in render(K8S_DIR / "overlays" / "cpu") if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    container = serving_container(spec)
    ports = dict(zip(PORT_OPTIONS, pick_free_ports(len(PORT_OPTIONS))))
    declared = {p["name"]: p["containerPort"] for p in container["ports"]}
    local = {declared[name]: port for name, port in ports.items()}  # manifest port -> here
    home = triton_home(tmp_path / "tritonserver")
    env = dict(os.environ, **{TRITON_HOME_ENV: str(home)})
    env.update(
        {
            e["name"]: e["value"]
            for e in container["env"]
            if "value" in e and not e["value"].startswith("/")
        }
    )  # fmt: skip  (paths of the image's layout)
    env.update(secret_values(container, redis_server.url))
    args = local_args(container["args"], ports, tiny_artifacts, tmp_path / "build")
    command = [sys.executable, "-m", "phoenix.ops.serve", *args]
    serve = LoggedProcess(command, tmp_path / "serve.out", env=env).start()
    try:

        def probe(kind: str) -> int | None:
            get = container[kind]["httpGet"]
            port = get["port"] if isinstance(get["port"], int) else declared[get["port"]]
            return http_get_status(f"http://127.0.0.1:{local[port]}{get['path']}", timeout=5)

        started = wait_until(lambda: probe("startupProbe") == 200 or not serve.is_running(),
                             READY_TIMEOUT_S, 0.5)  # fmt: skip
        assert started and serve.is_running(), serve.failure("serve did not start")
        assert probe("readinessProbe") == 200 and probe("livenessProbe") == 200
        # the store the Secret names, and no other: serve started none of its own
        ready = urllib.request.urlopen(f"http://127.0.0.1:{ports['supervisor']}/ready").read()
        assert b'"degraded": []' in ready
        said = (tmp_path / "serve.out").read_text()
        assert f"user state: {redis_server.url}  (named by --redis or $" in said, said
        assert "(data in" not in said and "(throwaway" not in said, said
        # Triton's own ports, as the Services reach them, and the server the image names.
        assert (
            http_get_status(f"http://127.0.0.1:{ports['http']}/v2/health/ready", timeout=5) == 200
        )
        grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{ports['grpc']}")
        assert grpc.is_server_ready()
        grpc.close()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics").read()
        assert b"nv_inference_request_success" in metrics
        servers = [p for p in psutil.Process(serve.pid).children() if "tritonserver" in p.name()]
        assert servers and servers[0].cmdline()[0] == str(home / "bin" / "tritonserver")
        # Pod deletion: preStop sleeps, then SIGTERM; what is left of the grace period must do.
        left = spec["terminationGracePeriodSeconds"] - sleep_seconds(
            container["lifecycle"]["preStop"]
        )
        termed = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        assert wait_until(lambda: probe("readinessProbe") != 200, 5, 0.02), "no drain"
        code = serve.wait_exit(left)
        print(f"DEPLOY stop: exit {code} after {time.monotonic() - termed:.1f} s of {left:g} s")
        assert code == 0, serve.failure(f"serve did not exit 0 within {left:g} s of SIGTERM")
    finally:
        serve.kill()  # the whole group, if anything still runs
