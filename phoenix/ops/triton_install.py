"""Where tritonserver and its Python backend are: the `nvidia-pytriton` wheel's server with the
backend folder this module builds, or the install $PHOENIX_TRITON_HOME names.

`python -m phoenix.ops.triton_install --build-backend-dir DIR` links the backend folder the
wheel lacks: the Python backend looks for its stub beside `libtriton_python.so` (docs/serving.md).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from phoenix.util.command_line import command_parser

BACKEND_DIR = Path(sys.prefix) / "triton-backends"
BACKEND_FILES = ("libtriton_python.so", "triton_python_backend_utils.py")
STUB_NAME = "triton_python_backend_stub"
# A Triton install to use instead of the wheel's (deploy/image: /opt/tritonserver).
TRITON_HOME_ENV = "PHOENIX_TRITON_HOME"


class TritonServerError(RuntimeError):
    """The server could not be found, started, or did not become ready."""


def pytriton_server_root() -> Path:
    """Folder `pytriton/tritonserver` of the installed `nvidia-pytriton` wheel."""
    spec = importlib.util.find_spec("pytriton")
    folders = (spec.submodule_search_locations or []) if spec else []
    root = Path(next(iter(folders), "")) / "tritonserver"
    if not folders or not (root / "bin" / "tritonserver").is_file():
        raise TritonServerError(f"no tritonserver from nvidia-pytriton in {sys.prefix}: make setup")
    return root


def build_backend_dir(dest: Path = BACKEND_DIR) -> Path:
    """Build (or refresh) `dest/python/` with links to the Python backend and this Python's stub
    (links: the stub finds its libcudart by an $ORIGIN rpath, resolved from the real file)."""
    root = pytriton_server_root()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    targets = {name: root / "backends" / "python" / name for name in BACKEND_FILES}
    targets[STUB_NAME] = root / "python_backend_stubs" / version / STUB_NAME
    if not targets[STUB_NAME].is_file():
        raise TritonServerError(f"no Python {version} backend stub in the pytriton wheel")
    (dest / "python").mkdir(parents=True, exist_ok=True)
    for name, target in targets.items():
        link = dest / "python" / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    (dest / ".phoenix-backend-dir").touch()  # the Makefile's stamp
    return dest


def server_and_backends() -> tuple[Path, Path]:
    """The tritonserver binary and the backend folder it loads: the wheel's server and our
    backend folder (built when missing), or with $PHOENIX_TRITON_HOME (NVIDIA's image:
    /opt/tritonserver) that install's own."""
    if home := os.environ.get(TRITON_HOME_ENV):
        return Path(home) / "bin" / "tritonserver", Path(home) / "backends"
    linked = all((BACKEND_DIR / "python" / f).exists() for f in (*BACKEND_FILES, STUB_NAME))
    backends = BACKEND_DIR if linked else build_backend_dir()
    return pytriton_server_root() / "bin" / "tritonserver", backends


def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser(
        "python -m phoenix.ops.triton_install",
        "Build the backend folder (Python backend + this Python's stub) in DIR.",
    )
    parser.add_argument("--build-backend-dir", metavar="DIR", type=Path, required=True)
    try:
        print(build_backend_dir(parser.parse_args(argv).build_backend_dir))
    except TritonServerError as error:
        parser.exit(1, f"error: {error}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
