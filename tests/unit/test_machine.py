"""The machine description benchmarks write beside their figures (harness.machine)."""

import pytest

from harness.machine import cpu_model, faiss_build, machine, widest_simd

# Two processors' worth of a /proc/cpuinfo (trimmed): the fields read are the first
# 'model name' and the 'flags' lines.
AVX2_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 bmi2
processor\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse4_2 avx fma avx2 bmi2
"""
AVX512_CPUINFO = "model name\t: Intel(R) Xeon(R) Platinum\nflags\t\t: avx avx2 avx512f avx512bw\n"


def test_cpu_model_is_the_first_model_name():
    assert cpu_model(AVX2_CPUINFO) == "AMD EPYC"
    assert cpu_model(AVX512_CPUINFO) == "Intel(R) Xeon(R) Platinum"
    assert cpu_model("processor\t: 0\n") == "unknown"


def test_widest_simd_prefers_avx512_to_avx2():
    assert widest_simd(AVX512_CPUINFO) == "avx512f"
    assert widest_simd(AVX2_CPUINFO) == "avx2"
    assert widest_simd("flags\t\t: fpu sse4_2\n") == "none"
    assert widest_simd("") == "none"


def test_machine_names_this_machine():
    described = machine()
    assert described["cpus"] >= 1
    assert described["simd"] in ("avx512f", "avx2", "none")
    assert len(described["load_avg"]) == 3 and all(load >= 0 for load in described["load_avg"])


def test_faiss_build_names_the_version_and_a_simd_level_faiss_knows():
    faiss = pytest.importorskip("faiss")
    build = faiss_build()
    assert build["version"] == faiss.__version__
    levels = {name[len("SIMDLevel_") :] for name in dir(faiss) if name.startswith("SIMDLevel_")}
    assert build["simd_level"] in levels - {"COUNT"}, build
