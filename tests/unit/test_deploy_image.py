"""deploy/image/Dockerfile, read as text (no Docker engine here): the pinned Triton image, the
targets, non-root, the JAX memory setting, and a command line serve accepts with the ports the
manifests declare. The requirements' resolution is in tests/slow/test_deploy_requirements.py."""

from __future__ import annotations

import re
import shlex

import pytest

from phoenix.ops import serve
from phoenix.ops.triton_install import TRITON_HOME_ENV
from phoenix.ops.triton_server import TritonServer
from tests.deploy_checks import IMAGE_DIR, K8S_DIR, render

DOCKERFILE = (IMAGE_DIR / "Dockerfile").read_text()
# Instructions with their continuation lines joined.
INSTRUCTIONS = [
    (m.group(1).upper(), m.group(2))
    for m in re.finditer(
        r"^([A-Za-z]+)\s+((?:.*\\\n)*.*)$", re.sub(r"^\s*#.*\n", "", DOCKERFILE, flags=re.M), re.M
    )
]


def stages() -> dict[str, list[tuple[str, str]]]:
    found, current = {}, None
    for op, text in INSTRUCTIONS:
        if op == "FROM":
            current = text.split()[-1]
            found[current] = []
        if current:
            found[current].append((op, text))
    return found


def last(stage: str, op: str) -> str:
    """The instruction `op` in effect at the end of `stage` (its parents' included)."""
    chain, name = [], stage
    while name in stages():
        chain.insert(0, name)
        name = stages()[name][0][1].split()[0]
    values = [text for s in chain for o, text in stages()[s] if o == op]
    return values[-1] if values else ""


def exec_form(text: str) -> list[str]:
    import json

    return json.loads(text.replace("\\\n", " "))


def arg_default(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)", DOCKERFILE, re.M)
    assert match, f"no ARG {name}=... in the Dockerfile"
    return match.group(1)


def test_the_base_is_a_pinned_triton_25_image_with_cpu_and_gpu_targets():
    assert re.fullmatch(
        r"nvcr\.io/nvidia/tritonserver:(\d\d)\.(\d\d)-py3", arg_default("TRITON_IMAGE")
    )
    assert int(arg_default("TRITON_IMAGE").split(":")[1][:2]) >= 25
    assert {"cpu", "gpu"} <= set(stages())


@pytest.mark.parametrize("stage", ["cpu", "gpu"])
def test_each_target_runs_serve_as_non_root_with_the_jax_memory_setting(stage):
    user = last(stage, "USER")
    uid = arg_default("UID") if user == "${UID}" else user
    assert uid.isdigit() and int(uid) != 0
    env = " ".join(text for o, text in INSTRUCTIONS if o == "ENV")
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=false" in env
    assert f"{TRITON_HOME_ENV}=/opt/tritonserver" in env
    entry = exec_form(last(stage, "ENTRYPOINT"))
    assert entry[-3:] == ["python", "-m", "phoenix.ops.serve"] and "tini" in entry[0]
    args = serve.build_parser().parse_args(exec_form(last(stage, "CMD")))
    assert args.host == "0.0.0.0" and args.device == stage


def test_the_image_exposes_serves_ports_and_runs_as_the_manifests_user():
    parser = serve.build_parser()
    defaults = parser.parse_args([])
    ports = {
        defaults.http_port,
        defaults.grpc_port,
        defaults.metrics_port,
        defaults.supervisor_port,
    }
    exposed = {int(p) for o, text in INSTRUCTIONS if o == "EXPOSE" for p in text.split()}
    assert exposed == ports
    deployment = next(o for o in render(K8S_DIR / "overlays" / "cpu") if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(
        arg_default("UID")
    )


def test_the_files_the_image_copies_exist_and_are_in_the_build_context():
    """Every COPY source exists and .dockerignore (everything out, then what the image needs
    back in) lets it through."""
    from tests.deploy_checks import REPO_ROOT

    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    allowed = [line[1:] for line in ignore if line.startswith("!")]
    assert "*" in ignore
    for op, text in INSTRUCTIONS:
        if op == "COPY":
            for source in shlex.split(text)[:-1]:
                assert (REPO_ROOT / source).exists(), source
                assert any(source == a or source.startswith(a + "/") for a in allowed), source


def test_serve_starts_the_images_tritonserver_when_told_where_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv(TRITON_HOME_ENV, str(tmp_path))
    command = TritonServer(tmp_path, http_port=1, grpc_port=2, metrics_port=3).command()
    assert command[0] == str(tmp_path / "bin" / "tritonserver")
    assert f"--backend-directory={tmp_path / 'backends'}" in command
