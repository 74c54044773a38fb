"""Server start-up: seconds until Triton is ready, with an empty and with a filled JAX cache.

    python -m bench.gpu.startup --profile gpu --artifacts DIR --out bench/results/gpu/startup.json

Serves the project's model_repository derived for the profile's device (as `serve --device`
does; the CPU profile loads one small model only), first with an empty program store
(every bucket compiled), then once more over the cache that first start filled (a restart).
Given the serving step's cache folder, that step then starts warm.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from harness.gpu_bench import profiles

READY_TIMEOUT_S = 900


def derived_repository(device: str, build_dir: Path) -> Path:
    """The repository generated for the device's deployment profile (as `serve --device`
    serves it: the GPU profile's configs)."""
    from phoenix.ops.configs import write_repository
    from phoenix.ops.profiles import profile

    return write_repository(build_dir / f"model_repository-{device}", profile(device))


def seconds_to_ready(
    repository: Path, artifacts: Path, cache: Path, log: Path, models: tuple[str, ...]
) -> float:
    """Start a server over ``repository`` (only ``models`` if any), wait until ready, stop it;
    the seconds it took."""
    from harness.triton import triton_server
    from phoenix.engine.programs import STORE_ENV

    only = {"model_control_mode": "explicit", "load_model": list(models)} if models else {}
    server = triton_server(repository, artifacts, log_path=log, env={STORE_ENV: str(cache)},
                           ready_timeout=READY_TIMEOUT_S, **only)  # fmt: skip
    started = time.monotonic()
    with server:
        return time.monotonic() - started


def measure(profile: profiles.Profile, artifacts: Path, cache: Path, build_dir: Path) -> dict:
    repository = derived_repository(profile.device, build_dir)
    shutil.rmtree(cache, ignore_errors=True)
    models = profile.startup_models
    result: dict[str, Any] = {"repository": str(repository), "artifacts": str(artifacts),
                              "cache": str(cache), "models": list(models) or "all"}  # fmt: skip
    for label in ("empty_cache_s", "filled_cache_s"):
        log = build_dir / f"startup-{label.removesuffix('_s')}.log"
        result[label] = seconds_to_ready(repository, artifacts, cache, log, models)
        print(f"  ready after {result[label]:.1f} s ({label.removesuffix('_s')})", flush=True)
    return result


def main(argv=None) -> int:
    parser = profiles.step_parser("bench.gpu.startup", __doc__)
    parser.add_argument("--artifacts", type=Path, required=True, help="artifact directory")
    parser.add_argument("--cache", type=Path, required=True, help="JAX cache folder (emptied)")
    parser.add_argument("--build-dir", type=Path, default=profiles.BUILD_DIR)
    args = parser.parse_args(argv)
    profile = profiles.chosen_profile(args)
    startup = measure(profile, args.artifacts.resolve(), args.cache, args.build_dir)
    # JAX only now (write_result): on a GPU it would have taken the memory the stubs need.
    profiles.write_result(args.out, {"profile": profile.name, "startup": startup})
    return 0


if __name__ == "__main__":
    sys.exit(main())
