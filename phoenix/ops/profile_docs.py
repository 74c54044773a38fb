"""The deployment figures docs/deploy.md states, written from the profiles so they cannot drift.

Stub processes per pod (one per Python-backend instance), how many share the GPU, and the GPU
memory each of those gets under the GPU overlay's ``XLA_PYTHON_CLIENT_MEM_FRACTION``: a block
between ``<!-- profile-table:start -->`` and ``<!-- profile-table:end -->`` in docs/deploy.md.
A unit test fails when the block differs from what this writes; ``make configs`` rewrites it.

    python -m phoenix.ops.profile_docs            # rewrite the block in docs/deploy.md
    python -m phoenix.ops.profile_docs --check    # exit 1 when it is out of date
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from phoenix.ops.profiles import CPU, GPU, Profile
from phoenix.util.doc_blocks import (
    DocBlockError,
    generator_main,
    with_block,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY_DOC = REPO_ROOT / "docs" / "deploy.md"
GPU_OVERLAY_PATCH = REPO_ROOT / "deploy" / "k8s" / "overlays" / "gpu" / "gpu.yaml"
MEM_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"
GPU_MEMORY_FOR_STUBS = 0.9  # the rest of the GPU: CUDA contexts, Triton (deploy policy test)
GPU_SIZES_GIB = (16, 24, 40, 48, 80, 141)  # T4/V100-16, A10/L4, A100-40, L40S, A100/H100-80, H200
START, END = "<!-- profile-table:start -->", "<!-- profile-table:end -->"


class ProfileDocError(DocBlockError):
    """A file the block is read from or written to is missing or not as expected."""


def stubs(profile: Profile) -> int:
    """Stub processes of one server: one per instance of every (Python-backend) model."""
    return sum(d.instances for d in profile.models.values())


def device_stubs(profile: Profile) -> int:
    """The stubs placed on the profile's device (a KIND_CPU model in the GPU profile is not)."""
    return sum(
        d.instances
        for model, d in profile.models.items()
        if profile.instance_kind_of(model) == profile.instance_kind
    )


def placement(profile: Profile, model: str) -> str:
    return "GPU" if profile.instance_kind_of(model) == "KIND_GPU" else "host"


def profile_block(cpu: Profile, gpu: Profile, mem_fraction: float) -> str:
    """The generated Markdown between the markers (without them)."""
    on_gpu = device_stubs(gpu)
    lines = [
        "Generated from `phoenix/ops/profiles.py` and the GPU overlay by "
        "`python -m phoenix.ops.profile_docs` (`make configs`); a unit test fails when it "
        "is out of date.",
        "",
        "| model | CPU profile: stubs | GPU profile: stubs (where) |",
        "| --- | --- | --- |",
    ]
    for model in cpu.models:
        gpu_cell = f"{gpu.models[model].instances} ({placement(gpu, model)})"
        lines.append(f"| {model} | {cpu.models[model].instances} | {gpu_cell} |")
    lines += [
        f"| **per pod** | **{stubs(cpu)}** | **{stubs(gpu)}**, {on_gpu} of them on the GPU |",
        "",
        "The `recommend` ensemble runs no stub: Triton chains its steps. GPU memory per GPU "
        f"stub at the GPU overlay's `{MEM_FRACTION_ENV}={mem_fraction:g}` "
        f"({on_gpu} stubs x {mem_fraction:g} = {on_gpu * mem_fraction:.0%} of the GPU; the "
        f"largest value the deploy policy test accepts is {GPU_MEMORY_FOR_STUBS:g} / {on_gpu} "
        f"= {GPU_MEMORY_FOR_STUBS / on_gpu:.2f}):",
        "",
        "| GPU memory | " + " | ".join(f"{size} GiB" for size in GPU_SIZES_GIB) + " |",
        "| --- |" + " --- |" * len(GPU_SIZES_GIB),
        "| per GPU stub | "
        + " | ".join(f"{size * mem_fraction:.1f} GiB" for size in GPU_SIZES_GIB)
        + " |",
    ]
    return "\n".join(lines)


def overlay_mem_fraction(patch: Path = GPU_OVERLAY_PATCH) -> float:
    """The XLA_PYTHON_CLIENT_MEM_FRACTION the GPU overlay's Deployment patch sets."""
    import yaml  # PyYAML: the deploy tooling's dependency, needed only here

    try:
        deployment = yaml.safe_load(patch.read_text())
        containers = deployment["spec"]["template"]["spec"]["containers"]
        values = [
            e["value"]
            for c in containers
            for e in c.get("env", ())
            if e["name"] == MEM_FRACTION_ENV
        ]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as error:
        raise ProfileDocError(f"{patch}: cannot read the containers' env ({error})") from None
    if len(values) != 1:
        raise ProfileDocError(f"{patch}: expected one {MEM_FRACTION_ENV}, found {len(values)}")
    return float(values[0])


ABOUT = (
    "Write the stub counts and GPU memory per stub of the deployment profiles into "
    "docs/deploy.md, between its profile-table markers."
)
FILES = {"--doc": DEPLOY_DOC, "--gpu-patch": GPU_OVERLAY_PATCH}  # option: default path


def documents(args) -> list[tuple[Path, str, str]]:
    """docs/deploy.md: (path, its text, the text with the profile table written)."""
    text = args.doc.read_text()
    table = profile_block(CPU, GPU, overlay_mem_fraction(args.gpu_patch))
    return [(args.doc, text, with_block(text, START, END, table, args.doc))]


def main(argv: Optional[Sequence[str]] = None) -> int:
    return generator_main(
        argv, "phoenix.ops.profile_docs", ABOUT, FILES, documents, "the profile table"
    )


if __name__ == "__main__":
    sys.exit(main())
