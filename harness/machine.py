"""What a benchmark ran on: this project's 2-core machines are not all alike (an AVX2-only
EPYC served at about half an AVX-512 Xeon's rate), so each result names its machine; and the
device a benchmark asked for, required of this process's JAX (``require_device``)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
SIMD_FLAGS = ("avx512f", "avx2")  # the widest first: Faiss and numpy pick their kernels by them


def cpu_model(cpuinfo: str) -> str:
    """The first 'model name' of a /proc/cpuinfo text ('unknown' without one)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def widest_simd(cpuinfo: str) -> str:
    """The widest of SIMD_FLAGS the CPU reports ('none' if neither)."""
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags.update(value.split())
    return next((flag for flag in SIMD_FLAGS if flag in flags), "none")


def faiss_build() -> dict:
    """Faiss' version and the SIMD level its kernels run at on this CPU: the same store searched
    4-13% faster at AVX-512 than at AVX2 on one CPU (docs/retrieval.md, "Another machine")."""
    import faiss  # only the benchmarks that search a store ask

    return {"version": faiss.__version__, "simd_level": faiss.SIMDConfig.get_level_name()}


def machine() -> dict:
    """CPU model, widest SIMD, CPUs, platform and load average now."""
    cpuinfo = CPUINFO.read_text() if CPUINFO.exists() else ""
    return {
        "cpu_model": cpu_model(cpuinfo),
        "simd": widest_simd(cpuinfo),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg": [round(load, 2) for load in os.getloadavg()],
    }


def require_device(device: str) -> None:
    """With ``--device gpu``, JAX of this process on a GPU too (the in-process side), and no
    preallocation: the server's stubs share the GPU with it. With ``cpu``, JAX on the CPU even
    on a machine with a GPU (before anything starts a device)."""
    if device != "gpu":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        return
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax

    if jax.default_backend() != "gpu":
        raise SystemExit(f"error: --device gpu needs JAX on a GPU in this process, found "
                         f"{jax.default_backend()!r} ({jax.devices()})")  # fmt: skip
