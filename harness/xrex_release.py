"""X's release, packed for a machine that runs X's own ranker forward beside ours
(bench/bench_xrex.py): the parts of its ``phoenix/`` folder the forward imports, and the
``xai_proto`` package generated from its protos, in one archive. Imports the standard
library, ``harness`` and ``phoenix.util.command_line`` (``pip`` and ``protoc`` run as commands).

    python -m harness.xrex_release X_PHOENIX_DIR        # build/xrex/xrex.tar.xz
    make gpu-payload GPU_PAYLOAD_ARGS="--xrex X_PHOENIX_DIR"     # the same, into the payload

``X_PHOENIX_DIR`` is the ``phoenix/`` folder of a checkout of X's x-algorithm (its August
2026 release, "xrex"). Nothing of it is copied into this repository: the archive is built
from the user's checkout and lies, like the rest of the payload, outside git.

The archive holds ``release/`` (``xrex/``, ``python/common/xai-configlib/src``,
``python/common/xai-gimmick/src``, X's NOTICE files) and ``site/xai_proto``. ``unpack``
lays it out again (every time: an archive rebuilt from another checkout must not meet the
last one's files) for ``bench/xrex_side.py --release DIR/release --site DIR/site``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness import REPO_ROOT
from phoenix.util.command_line import command_parser

# What X's ranker forward imports from the release (bench/xrex_side.py stubs the rest).
PARTS = (
    "xrex",
    "python/common/xai-configlib/src",
    "python/common/xai-gimmick/src",
    "NOTICE",
    "THIRD_PARTY_NOTICES.md",
)
PROTOS = "python/common/xai-proto/proto"
# protoc of grpcio-tools 1.62 writes protobuf 4.25 code, which protobuf runtimes 4.25 to 6.x
# load; a newer protoc's code refuses any runtime older than itself, and the GPU machine's
# protobuf is whatever its image holds.
GRPC_TOOLS = "grpcio-tools==1.62.3"
TOOLS_DIR = REPO_ROOT / "build" / GRPC_TOOLS.replace("grpcio-tools==", "grpc-tools-")
ARCHIVE = "xrex.tar.xz"


class ReleaseError(RuntimeError):
    """X's release folder is not one this can pack."""


def check_release(release: Path) -> None:
    missing = [part for part in (*PARTS[:3], PROTOS) if not (release / part).exists()]
    if missing:
        raise ReleaseError(
            f"{release}: not the phoenix/ folder of X's release (no {', '.join(missing)})"
        )


def grpc_tools(tools_dir: Path = TOOLS_DIR) -> Path:
    """A folder holding ``grpc_tools`` (installed there by pip on first use)."""
    if not (tools_dir / "grpc_tools").is_dir():
        print(f"installing {GRPC_TOOLS} into {tools_dir} (for protoc)", flush=True)
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                   str(tools_dir), GRPC_TOOLS, "protobuf==4.25.8"]  # fmt: skip
        done = subprocess.run(command, text=True)
        if done.returncode:
            raise ReleaseError(f"pip install {GRPC_TOOLS} failed (exit {done.returncode})")
    return tools_dir


def relative_imports(source: str) -> str:
    """protoc writes ``import recsys_pb2 as ...``; inside a package it must be relative."""
    lines = []
    for line in source.splitlines(keepends=True):
        if line.startswith("import ") and "_pb2" in line.split(" as ")[0]:
            line = "from . " + line
        lines.append(line)
    return "".join(lines)


def generate_proto(release: Path, dest: Path, tools_dir: Path) -> list[Path]:
    """``dest/xai_proto``: messages and gRPC stubs of every ``.proto`` of the release."""
    protos = sorted((release / PROTOS).glob("*.proto"))
    package = dest / "xai_proto"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{release / PROTOS}",
               f"--python_out={package}", f"--grpc_python_out={package}",
               *map(str, protos)]  # fmt: skip
    env = {"PYTHONPATH": str(tools_dir), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise ReleaseError(f"protoc failed: {done.stderr.strip()[-500:]}")
    written = sorted(package.glob("*_pb2*.py"))
    for path in written:
        path.write_text(relative_imports(path.read_text()))
    return written


def pack(release: Path, out: Path, tools_dir: Path = TOOLS_DIR) -> int:
    """Write the archive; return its size in bytes."""
    release = release.resolve()
    check_release(release)
    tools = grpc_tools(tools_dir)
    with tempfile.TemporaryDirectory() as scratch:
        site = Path(scratch) / "site"
        generate_proto(release, site, tools)
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:xz") as archive:
            for part in PARTS:
                if (release / part).exists():
                    archive.add(release / part, arcname=f"release/{part}", filter=no_caches)
            archive.add(site / "xai_proto", arcname="site/xai_proto", filter=no_caches)
        partial.replace(out)
    return out.stat().st_size


def no_caches(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in member.name else member


def unpack(archive: Path, dest: Path) -> tuple[Path, Path]:
    """The archive laid out under ``dest`` (replaced); returns (release, site)."""
    if not archive.is_file():
        raise ReleaseError(f"no {archive}: build it with python -m harness.xrex_release "
                           "X_PHOENIX_DIR, or the payload with --xrex X_PHOENIX_DIR")  # fmt: skip
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with tarfile.open(archive) as opened:
        opened.extractall(dest, filter="data")
    return dest / "release", dest / "site"


def main(argv=None) -> int:
    parser = command_parser("python -m harness.xrex_release", __doc__)
    parser.add_argument("release", type=Path, help="the phoenix/ folder of X's release")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "xrex" / ARCHIVE,
                        help="(default: build/xrex/xrex.tar.xz)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        size = pack(args.release, args.out)
    except ReleaseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"{args.out}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
