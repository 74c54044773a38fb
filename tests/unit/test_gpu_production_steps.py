"""The GPU benchmark's production, prefix-cache and reference steps (harness/gpu_bench/steps.py)
as far as a machine without a GPU can check them: the steps each profile runs, each step's
command as its script parses it (harness/bench_options.py, the parsers bench/ uses), the
repository the production step serves, the summary's FLOP rate against the device's dtype
(harness/production_report.py) and the tables rendered from the steps' figures
(harness/gpu_bench/production_tables.py). `bash bench/gpu/run.sh --cpu` runs them on this CPU
(tests/integration/test_gpu_bench_smoke.py)."""

import re
import statistics
from pathlib import Path

import pytest

from harness import bench_options
from harness.gpu_bench import steps
from harness.gpu_bench.production_tables import (
    prefix_cache_table,
    production_table,
    reference_table,
)
from harness.production_report import summarize, table

REPO_ROOT = Path(__file__).resolve().parents[2]


def parameter(config_text: str, key: str) -> str:
    """A model parameter's value in a generated config.pbtxt."""
    found = re.search(rf'key: "{key}"\s*value\s*{{\s*string_value: "([^"]*)"', config_text)
    assert found, key
    return found.group(1)


def test_both_profiles_run_every_step_unless_told_which():
    assert steps.parse_args([]).steps == list(steps.STEPS)
    assert steps.parse_args(["--cpu"]).steps == list(steps.STEPS)
    assert steps.STEPS[-4:] == ("production", "prefix-cache", "reference", "xrex")
    named = steps.parse_args(["--cpu", "--steps", "production,prefix-cache"]).steps
    assert named == ["production", "prefix-cache"]


def test_an_unknown_step_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as stopped:
        steps.parse_args(["--steps", "production,prefix"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "unknown steps ['prefix']" in error and "prefix-cache" in error


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_production_step_is_a_command_bench_production_reads(device, tmp_path):
    args = steps.parse_args((["--cpu"] if device == "cpu" else []) + ["--build-dir", str(tmp_path)])
    command = steps.step_command("production", args)
    assert command[1:3] == ["-m", "bench.bench_production"]
    parsed = bench_options.production_args(command[3:])
    assert parsed.device == device
    preset = "nano" if device == "gpu" else "tiny"
    assert parsed.artifacts == args.build_dir / f"production-{preset}"
    assert parsed.out == args.results / "production.json"
    assert parsed.build_dir == args.build_dir / "production"
    if device == "gpu":  # the points the GPU issue asks for, and Locust's own run
        assert parsed.concurrency == [1, 16, 64] and parsed.locust_seconds > 0


@pytest.mark.parametrize("device", ["gpu", "cpu"])
def test_the_prefix_cache_step_is_a_command_bench_prefix_cache_reads(device, tmp_path):
    args = steps.parse_args((["--cpu"] if device == "cpu" else []) + ["--build-dir", str(tmp_path)])
    command = steps.step_command("prefix-cache", args)
    assert command[1:3] == ["-m", "bench.bench_prefix_cache"]
    parsed = bench_options.prefix_cache_args(command[3:])
    assert parsed.out == args.results / "prefix-cache.json"
    assert parsed.work == args.build_dir / "prefix-cache"
    assert parsed.skip_paged  # Locust's paged users serve the CPU profile
    assert parsed.skip_production == (device == "cpu")  # nano is minutes of a small CPU


def test_the_reference_step_checks_the_repositorys_sets_made_with_xs_code(tmp_path):
    args = steps.parse_args(["--build-dir", str(tmp_path)])
    command = steps.step_command("reference", args)
    assert command[1:] == [
        "-m", "phoenix.ops.check_reference", str(REPO_ROOT / "tests" / "data" / "production"),
        "--json", str(args.results / "reference.json"),
    ]  # fmt: skip
    assert sorted(p.name for p in steps.REFERENCE_SETS.glob("*_params.npz")) == [
        "small_serving_params.npz", "small_training_kernel_params.npz",
    ]  # fmt: skip


def test_the_production_benchmark_serves_the_gpu_profile_with_one_candidate_bucket(tmp_path):
    args = bench_options.production_args(["--device", "gpu", "--build-dir", str(tmp_path)])
    args.candidates = 64  # main sets it from the artifacts' ranker
    text = (bench_options.production_repository(args) / "ranker" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU" in text
    assert parameter(text, "batch_buckets") == "1,8,64"  # the GPU profile's
    assert parameter(text, "candidate_buckets") == "64"  # the requests' width alone
    assert parameter(text, "prefix_cache_mib") == "0"
    assert "default_timeout_microseconds: 120000000" in text  # --queue-timeout-s


def test_in_process_users_a_call_match_what_the_servers_batcher_can_make():
    assert bench_options.in_process_batches(1, 64) == (1,)
    assert bench_options.in_process_batches(16, 8) == (1, 8)  # the CPU profile: as before
    assert bench_options.in_process_batches(16, 64) == (1, 8, 16)  # the GPU profile's 64
    assert bench_options.in_process_batches(64, 64) == (1, 8, 64)
    assert bench_options.in_process_batches(4, 64) == (1, 4)


def test_a_gpu_run_cannot_rewrite_the_cpu_table_of_the_docs(capsys):
    with pytest.raises(SystemExit) as stopped:
        bench_options.production_args(["--device", "gpu", "--docs"])
    assert stopped.value.code == 2
    assert "--docs rewrites the CPU figures" in capsys.readouterr().err


def point(served: float, in_process: float, p50: float, p99: float) -> dict:
    return {
        "protocol": "grpc", "concurrency": 16,
        "in_process": {"batch_1": {"throughput": in_process, "cpu_s_per_request": 0.01}},
        "served": {"throughput": served, "error": None, "server_cpu_s_per_request": 0.02,
                   "p50_ms": p50, "p99_ms": p99},
    }  # fmt: skip


def production_results(profile: str) -> dict:
    return {
        "settings": {"profile": profile, "artifacts": "build/gpu-bench/production-nano",
                     "history": 1022, "candidates": 64, "instances": 2},
        "flops_per_request": {"total": 28e9, "prefix": 25.4e9, "candidates": 2.6e9},
        "matmul_gflops": {"float32": {"qkv": 50_000.0},
                          "bfloat16": {"qkv": 400_000.0, "peak": 700_000.0}},
        "rounds": [[point(1000.0, 1250.0, 10.0, 20.0)], [point(1100.0, 1100.0, 12.0, 30.0)]],
        "failed_requests": 0,
    }  # fmt: skip


def test_on_a_gpu_the_flop_rate_is_set_against_the_best_bfloat16_matmul():
    results = production_results("gpu")
    summary = summarize(results)
    (row,) = summary["rows"]
    assert summary["matmul_dtype"] == "bfloat16" and summary["matmul_gflops"] == 700_000.0
    assert row["served_req_s"] == 1050.0  # medians of the rounds
    assert row["served_vs_in_process"] == pytest.approx(statistics.median([0.8, 1.0]))
    assert (row["served_p50_ms"], row["served_p99_ms"]) == (11.0, 25.0)
    assert row["served_share_of_matmul_rate"] == pytest.approx(1050 * 28 / 700_000)
    results["summary"] = summary
    lines = production_table(results)
    assert "| 16 | grpc | 1,050.0 | 11.0 / 25.0 ms | 1,175.0 | 90% | 29.40 | 4.2% |" in lines
    assert "share of the bfloat16 matmul rate |" in lines[2]
    results["settings"]["max_batch"] = 64
    assert "beyond: the best of 1, 8 and up to 64, the server's largest batch)" in table(results)
    assert lines[-1] == (
        "A request is 28.0 GFLOP of matmuls (the prefix 25.4); the best matmul rate of the same "
        "run 700 TFLOP/s (peak); failed requests: 0."
    )


def test_on_a_cpu_the_flop_rate_stays_against_float32():
    summary = summarize(production_results("cpu"))
    assert summary["matmul_dtype"] == "float32" and summary["matmul_gflops"] == 50_000.0


def test_the_prefix_cache_table_shows_both_models_and_a_cached_users_memory():
    def cache_point(off, miss, hit):
        return {"call_ms": {"off": off, "miss": miss, "hit": hit},
                "hit_over_miss": miss / hit, "bookkeeping_share_of_miss": 0.0125}  # fmt: skip

    result = {
        "machine": {"gpu": "NVIDIA H200", "jax": "0.10.2", "numpy": "2.4.6", "cpu_count": 16},
        "profile": "gpu",
        "engine": {"config": {"dtype": "bfloat16"}, "points": {"1x64": cache_point(3, 4, 0.5)},
                   "entry_bytes": 2 * 2**20},
        "production": {"config": {"dtype": "bfloat16"},
                       "points": {"8x64": cache_point(20, 24, 3)},
                       "memory": {"bytes_per_user": 4 * 2**20,
                                  "device_in_use_bytes_per_user": 5 * 2**20}},
    }  # fmt: skip
    lines = prefix_cache_table(result)
    assert lines[0].endswith(
        "measured on NVIDIA H200 (jax 0.10.2, numpy 2.4.6, 16 host cores), profile `gpu`."
    )
    assert lines[-2:] == [
        "| original, mini, bfloat16 | 1 x 64 | 3.00 | 4.00 | 0.50 | 8.00x | 1.25% | 2.00 MiB |",
        "| production, nano, bfloat16 | 8 x 64 | 20.00 | 24.00 | 3.00 | 8.00x | 1.25% | "
        "4.00 MiB (5.00 MiB of device memory) |",
    ]


def test_the_reference_table_shows_each_set_and_whether_it_is_within_the_tolerances():
    def differences(log_max, log_mean, cont_max):
        return [{"output": "log_probs", "max": log_max, "mean": log_mean},
                {"output": "logits", "max": 1.0, "mean": 0.1},
                {"output": "continuous", "max": cont_max, "mean": 0.0}]  # fmt: skip

    result = {
        "machine": {"gpu": "NVIDIA H200"}, "profile": "gpu",
        "sets": [
            {"set": "small_serving", "batch": 4, "attention_keys": "serving_kernel",
             "differences": differences(0.0625, 0.00024, 0.0078), "ok": True},
            {"set": "small_training_kernel", "batch": 2, "attention_keys": "exact",
             "differences": differences(0.125, 0.006, 0.0078), "ok": False},
        ],
    }  # fmt: skip
    lines = reference_table(result)
    assert lines[0].endswith("measured on NVIDIA H200, profile `gpu`.")
    assert lines[-2:] == [
        "| small_serving | 4 | serving_kernel | 0.0625 / 0.00024 | 0.0078 | yes |",
        "| small_training_kernel | 2 | exact | 0.1250 / 0.00600 | 0.0078 | **no** |",
    ]
