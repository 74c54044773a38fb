"""Install and locate `perf_analyzer`, Triton's load generator.

Only the `tritonclient` 2.51.0 wheel carries the binary (later wheels dropped it), while the
venv runs a newer tritonclient for numpy 2. So set-up downloads that wheel and takes the one
file out of it:

    python -m harness.perf_analyzer --extract build/wheels --to .venv/bin/perf_analyzer
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

MEMBER_SUFFIX = ".data/data/bin/perf_analyzer"


# Links to the libraries perf_analyzer needs that pytriton bundles (gpu_machine makes them)
PERF_ANALYZER_LIBS = Path(sys.prefix) / "perf_analyzer-libs"


def library_path_with_links(*paths: str | None) -> str:
    """An LD_LIBRARY_PATH of PERF_ANALYZER_LIBS (where this set-up made it) and ``paths``."""
    links = str(PERF_ANALYZER_LIBS) if PERF_ANALYZER_LIBS.is_dir() else None
    return os.pathsep.join(p for p in (links, *paths) if p)


def find_wheel(folder: Path) -> Path:
    """The tritonclient wheel in ``folder`` (exactly one is expected)."""
    wheels = sorted(folder.glob("tritonclient-*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no tritonclient wheel in {folder}")
    return wheels[-1]


def binary_member(archive: zipfile.ZipFile) -> zipfile.ZipInfo:
    """The wheel's `perf_analyzer` (FileNotFoundError when it holds none)."""
    for info in archive.infolist():
        if info.filename.endswith(MEMBER_SUFFIX):
            return info
    raise FileNotFoundError(f"{archive.filename} holds no perf_analyzer ({MEMBER_SUFFIX})")


def extract_binary(wheel: Path, dest: Path) -> Path:
    """Copy the wheel's `perf_analyzer` to ``dest``, executable; atomic so make can retry."""
    with zipfile.ZipFile(wheel) as archive:
        member = binary_member(archive)
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".partial")
        partial.write_bytes(archive.read(member))
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(dest)
    return dest


def binary() -> Path:
    """`perf_analyzer` beside the running Python (where `make setup` puts it)."""
    path = Path(sys.executable).parent / "perf_analyzer"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make setup`")
    return path


def environment() -> dict[str, str]:
    """This process's environment plus the CUDA runtime library that perf_analyzer links: the
    links a GPU machine's set-up made (on a CUDA 13 machine), and this venv's
    nvidia-cuda-runtime wheel."""
    try:
        import nvidia.cuda_runtime

        wheel_lib = str(Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib")
    except ImportError:
        wheel_lib = None
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = library_path_with_links(wheel_lib, env.get("LD_LIBRARY_PATH"))
    return env


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extract", type=Path, required=True, help="folder with the wheel")
    parser.add_argument("--to", type=Path, required=True, help="where the binary goes")
    args = parser.parse_args(argv)
    try:
        path = extract_binary(find_wheel(args.extract), args.to)
    except (OSError, zipfile.BadZipFile) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"perf_analyzer installed at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
