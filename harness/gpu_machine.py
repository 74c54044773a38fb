"""Set up a bare GPU machine from the payload (harness/gpu_payload.py); standard
library and `phoenix.util.command_line` only (the machine has none of the packages yet).

    python -m harness.gpu_machine --payload .gpu

Into the Python environment that runs this script (the machine's venv, first on PATH):
- the payload's wheels, with `pip install --no-index --no-deps` (the machine has no package
  registry); a distribution already installed there is kept as it is;
- Triton's server files, unpacked into site-packages where `phoenix.ops.triton_install`
  looks for them;
- a .pth file that puts this checkout on sys.path: the backend stub starts an isolated Python
  that ignores PYTHONPATH, so this is how model.py finds `phoenix`;
- perf_analyzer beside the Python (where bench_serving.py looks), and a folder with the two
  libraries it links (libcudart.so.12, libb64.so.0d), made of links to pytriton's bundled copies:
  `library_path_with_links` puts them on a library path (perf_analyzer.environment and
  bench/gpu/measure.py use it).

Running it again on the same machine redoes only what is missing.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from harness import REPO_ROOT
from harness.perf_analyzer import (
    PERF_ANALYZER_LIBS,
    extract_binary,
    find_wheel,
)
from phoenix.util.command_line import command_parser

# The payload's parts (gpu_payload.py writes them) and where pytriton's server lies in a
# site-packages: written here once, since this module may import nothing but the standard library.
SERVER_ARCHIVE = "server.tar.xz"
WHEELS_DIR = "wheels"
PERF_ANALYZER_DIR = "perf_analyzer"
SERVER_ROOT = "pytriton/tritonserver"
SERVER_MARKER = f"{SERVER_ROOT}/bin/tritonserver"
STUBS = f"{SERVER_ROOT}/python_backend_stubs"
BUNDLED_LIBS = "nvidia_pytriton.libs"
PTH_NAME = "phoenix-checkout.pth"
# link name -> pattern of pytriton's bundled copy in BUNDLED_LIBS
BUNDLED_LIBRARIES = {"libcudart.so.12": "libcudart-*.so.12*", "libb64.so.0d": "libb64-*.so.0d"}


class SetupError(RuntimeError):
    """The machine cannot be set up from this payload."""


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def normalized_name(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): lower case, runs of -_. as -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_of(wheel: Path) -> tuple[str, str]:
    """(normalised name, version) from a wheel's file name."""
    name, version = wheel.name.split("-")[:2]
    return normalized_name(name), version


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def install_wheels(folder: Path) -> list[str]:
    """Install the wheels whose distribution is missing; return what was installed."""
    missing = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version = distribution_of(wheel)
        present = installed_version(name)
        if present is None:
            missing.append(wheel)
        else:
            print(f"  kept {name} {present} (payload: {version})")
    if missing:
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                   "--no-compile", *map(str, missing)]  # fmt: skip
        if subprocess.run(command).returncode:
            raise SetupError(f"pip install failed for {[w.name for w in missing]}")
    return [w.name for w in missing]


def unpack_server(archive: Path, site: Path) -> bool:
    """Unpack the server files into ``site`` unless they are there; True when unpacked."""
    if (site / SERVER_MARKER).is_file():
        return False
    with tarfile.open(archive, "r:xz") as tar:
        # The archive is ours, but extract only plain files and dirs all the same.
        tar.extractall(site, filter="data")
    return True


def link_checkout(site: Path, checkout: Path = REPO_ROOT) -> Path:
    pth = site / PTH_NAME
    pth.write_text(f"{checkout}\n")
    return pth


def install_perf_analyzer(wheel_folder: Path, dest: Path) -> Path:
    """perf_analyzer out of the tritonclient 2.51.0 wheel (Python's zipfile: no unzip here)."""

    return extract_binary(find_wheel(wheel_folder), dest)


def link_bundled_libraries(site: Path, dest: Path = PERF_ANALYZER_LIBS) -> list[Path]:
    """Links named as perf_analyzer asks for them, to pytriton's bundled copies."""
    bundled = site / BUNDLED_LIBS
    dest.mkdir(parents=True, exist_ok=True)
    links = []
    for name, pattern in BUNDLED_LIBRARIES.items():
        found = sorted(bundled.glob(pattern))
        if not found:
            raise SetupError(f"no {pattern} in {bundled}: is the server unpacked?")
        link = dest / name
        link.unlink(missing_ok=True)
        link.symlink_to(found[-1])
        links.append(link)
    return links


# What every model stub imports at start-up (the services import their models' code); faiss is
# imported only when a corpus store is served, and the machine has no wheel of it.
STUB_IMPORTS = ("phoenix.stub.triton_adapter", "phoenix.stub.services.catalog")
# What the stubs import between them, in a fresh interpreter: the catalog imports a service's
# module only when that service is asked for, so every one is asked for.
STUB_IMPORT_CODE = """
import importlib, sys
for module in sys.argv[1:]:
    importlib.import_module(module)
from phoenix.stub.services.catalog import SERVED_BY_SERVICES, service_class
for model in SERVED_BY_SERVICES:
    service_class(model)
"""


def check_stub_imports(python: str = sys.executable) -> None:
    """Import what the stubs import, in a fresh interpreter: a package the payload lacks fails
    the set-up here, named, rather than every served model at the server's start."""
    done = subprocess.run(
        [python, "-c", STUB_IMPORT_CODE, *STUB_IMPORTS],
        capture_output=True, text=True, cwd=REPO_ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},  # imports only: keep off the GPU
    )  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SetupError(
            f"the model stubs cannot import their code: {last} (carry its distribution: "
            f"`python -m harness.gpu_payload --also NAME`, or add it to MACHINE_LACKS in "
            f"harness/gpu_payload.py, and rebuild the payload)"
        )


def set_up(payload: Path) -> None:
    site = site_packages()
    for part in (SERVER_ARCHIVE, WHEELS_DIR, PERF_ANALYZER_DIR):
        if not (payload / part).exists():
            raise SetupError(
                f"{payload / part} is missing: build the payload with make gpu-payload"
            )
    installed = install_wheels(payload / WHEELS_DIR)
    print(f"  wheels installed: {', '.join(installed) or 'none needed'}")
    unpacked = unpack_server(payload / SERVER_ARCHIVE, site)
    print(f"  Triton server files {'unpacked into' if unpacked else 'already in'} {site}")
    print(f"  {link_checkout(site)} -> {REPO_ROOT}")
    binary = install_perf_analyzer(
        payload / PERF_ANALYZER_DIR, Path(sys.executable).parent / "perf_analyzer"
    )
    links = link_bundled_libraries(site)
    print(f"  {binary}; its libraries in {links[0].parent}")
    check_stub_imports()
    print(f"  the stubs' imports load: {', '.join(STUB_IMPORTS)}")


def main(argv=None) -> int:
    parser = command_parser("python -m harness.gpu_machine", __doc__)
    parser.add_argument("--payload", type=Path, default=REPO_ROOT / ".gpu", help="(default: .gpu)")
    args = parser.parse_args(argv)
    print(f"setting up {sys.prefix} from {args.payload}", flush=True)
    try:
        set_up(args.payload.resolve())
    except (SetupError, OSError, tarfile.TarError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
