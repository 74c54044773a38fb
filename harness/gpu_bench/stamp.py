"""Where and how a GPU result was measured, added to a JSON file a step wrote without it.

    python -m harness.gpu_bench.stamp FILE --command 'COMMAND'

`bench_serving.py` and `bench_service_host.py` write their figures without the GPU, the driver,
JAX's version or the command that ran them; `bench/gpu/measure.py` and `bench/gpu/lease.sh` add
them here after such a step. Fields the file has already are kept; paths of this machine in
the command are written portably (`phoenix.util.machine_paths`).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from harness.gpu_bench import profiles
from phoenix.util.command_line import command_parser
from phoenix.util.machine_paths import portable_text


def identity() -> dict:
    """This machine: GPU and driver (nvidia-smi), JAX and numpy, host cores and platform."""
    import jax
    import numpy as np

    return {
        **profiles.gpu_identity(),
        "jax": jax.__version__,
        "numpy": np.__version__,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
    }


def stamp(path: Path, command: str, machine: dict | None = None, profile: str = "") -> dict:
    """Add ``command``, this machine's identity (or ``machine``) and the GPU benchmark's
    ``profile`` (when given) to the JSON at ``path`` where it lacks them; returns the result
    as written."""
    result = json.loads(path.read_text())
    if profile:
        result.setdefault("profile", profile)
    found = result.setdefault("machine", {})
    for key, value in (identity() if machine is None else machine).items():
        found.setdefault(key, value)
    result = {"command": result.get("command") or portable_text(command), **result}
    path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv=None) -> int:
    parser = command_parser("python -m harness.gpu_bench.stamp", __doc__)
    parser.add_argument("files", nargs="+", type=Path, help="result JSON files")
    parser.add_argument("--command", required=True, help="the command that wrote them")
    args = parser.parse_args(argv)
    for path in args.files:
        stamp(path, args.command)
        print(f"stamped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
