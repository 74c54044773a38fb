"""The GPU benchmark's CPU mode end to end: `bench/gpu/run.sh --cpu`, every step, real servers.

Checks that each step ran and wrote its figures with the expected keys and sane values, and
that the GPU section of a copy of docs/performance.md was rewritten from them. No timings are
asserted: they are smoke figures on a shared CPU.
"""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from phoenix.engine.programs import STORE_DIR

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN = REPO_ROOT / "bench" / "gpu" / "run.sh"
CPU_POINTS = {("mini", 1, 64), ("small-gqa", 2, 64)}


@pytest.fixture(scope="module")
def shared_cache(tiny_artifacts) -> Path:
    """The tiny artifacts' program store, which their fixture filled: the CPU profile serves
    the same preset, so the serving step loads those programs instead of compiling them again
    (half a minute of 2 cores)."""
    return tiny_artifacts / STORE_DIR


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory, tiny_artifacts, shared_cache):
    """One CPU-mode run into a temporary folder: (exit code, results folder, docs copy, log)."""
    tmp = tmp_path_factory.mktemp("gpu-bench-cpu")
    docs = tmp / "performance.md"
    shutil.copy(REPO_ROOT / "docs" / "performance.md", docs)
    results = tmp / "results"
    done = subprocess.run(
        ["bash", str(RUN), "--cpu", "--results", str(results), "--docs", str(docs),
         "--build-dir", str(tmp / "build"), "--artifacts", str(tiny_artifacts),
         "--cache", str(shared_cache)],
        capture_output=True, text=True, timeout=900, cwd=REPO_ROOT,
    )  # fmt: skip
    return done.returncode, results, docs, done.stdout + done.stderr


def read(results: Path, step: str) -> dict:
    return json.loads((results / f"{step}.json").read_text())


def test_every_step_succeeds(cpu_run):
    code, results, _, log = cpu_run
    assert code == 0, log[-4000:]
    run = read(results, "run")
    assert run["profile"] == "cpu"
    assert list(run["steps"]) == [
        "engine", "retrieval", "startup", "serving", "recommend", "production", "prefix-cache",
        "reference", "xrex",
    ]  # fmt: skip
    assert all(step["exit_code"] == 0 for step in run["steps"].values()), run


def test_x_own_forward_is_skipped_without_a_payload(cpu_run):
    """X's release comes only from a payload built with --xrex; a CPU run is given none."""
    results = cpu_run[1]
    step = read(results, "run")["steps"]["xrex"]
    assert step["skipped"].startswith("no --payload"), step
    assert not (results / "xrex.json").exists()


def test_engine_matches_the_original_at_every_point(cpu_run):
    engine = read(cpu_run[1], "engine")
    assert engine["machine"]["backend"] == "cpu"
    rows = engine["ranking"]
    assert {(r["config"], r["users"], r["candidates"]) for r in rows} == CPU_POINTS
    for r in rows:
        assert r["original_jit_cands_per_s"] > 0 and r["engine_cands_per_s"] > 0
        assert r["device_ranker_cands_per_s"] > 0  # the served path was timed too
        assert r["max_abs_prob_diff"] < 1e-4  # float32 on both sides: the same probabilities


def test_retrieval_reports_queries_per_second_for_each_corpus(cpu_run):
    rows = read(cpu_run[1], "retrieval")["retrieval"]
    assert [r["corpus"] for r in rows] == [1_000, 5_000]
    for r in rows:
        assert r["batch"] == 8 and r["top_k"] == 100
        assert r["top_k_queries_per_s"] > 0 and r["end_to_end_queries_per_s"] > 0


def test_startup_times_both_starts(cpu_run, shared_cache):
    startup = read(cpu_run[1], "startup")["startup"]
    assert startup["empty_cache_s"] > 0 and startup["filled_cache_s"] > 0
    assert startup["models"] == ["candidate_tower"]
    assert Path(startup["cache"]) != shared_cache  # emptied: never the shared cache


def test_serving_measured_batching_on_and_off_without_failures(cpu_run):
    results = cpu_run[1]
    serving = read(results, "serving")
    assert serving["settings"]["device"] == "cpu"
    served = serving["served"]
    assert {r["batching"] for r in served} == {"on", "off"}
    assert all(r["error"] is None and r["throughput"] > 0 for r in served), served
    assert all(v == 0 for counts in serving["failed_requests"].values() for v in counts.values())
    assert serving["in_process"]["ranker-64"]["batch_1"]["throughput"] > 0
    assert (results / "serving.png").stat().st_size > 0


def test_recommend_is_served_end_to_end_over_its_larger_corpus(cpu_run):
    results = cpu_run[1]
    recommend = read(results, "recommend")
    assert recommend["settings"]["artifacts"].endswith("artifacts-tiny-corpus2000")
    served = recommend["served"]
    assert {(r["workload"], r["batching"]) for r in served} == {("recommend", "on")}
    assert all(r["error"] is None and r["throughput"] > 0 for r in served), served
    assert all(v == 0 for counts in recommend["failed_requests"].values() for v in counts.values())
    assert recommend["in_process"]["recommend"]["batch_1"]["throughput"] > 0


def test_the_production_ranker_is_served_against_its_service_in_process(cpu_run):
    production = read(cpu_run[1], "production")
    settings = production["settings"]
    assert settings["profile"] == "cpu" and production["profile"] == "cpu"
    assert settings["artifacts"].endswith("production-tiny") and settings["candidates"] == 16
    assert production["failed_requests"] == 0
    (row,) = production["summary"]["rows"]
    assert (row["concurrency"], row["protocol"]) == (1, "grpc")
    assert row["served_req_s"] > 0 and row["in_process_req_s"] > 0
    assert production["summary"]["matmul_dtype"] == "float32"
    assert production["command"].startswith("python -m bench.bench_production --device cpu")


def test_the_prefix_cache_is_timed_in_every_mode_and_its_entry_matches_the_formula(cpu_run):
    cache = read(cpu_run[1], "prefix-cache")
    assert cache["profile"] == "cpu" and cache["production"] is None  # nano left to a GPU
    engine = cache["engine"]
    assert engine["config"]["dtype"] == "float32"
    assert sorted(engine["points"]) == ["1x64", "8x64"]
    for point in engine["points"].values():
        assert all(point["call_ms"][mode] > 0 for mode in ("off", "miss", "hit")), point
    formula = next(
        r["bytes"] for r in cache["memory_per_user"]
        if (r["config"], r["history"], r["dtype"]) == ("mini", 1022, "float32")
    )  # fmt: skip
    assert engine["entry_bytes"] == formula


def test_xs_outputs_are_reproduced_within_the_tolerances(cpu_run):
    reference = read(cpu_run[1], "reference")
    assert reference["ok"] and reference["profile"] == "cpu"
    assert [s["set"] for s in reference["sets"]] == ["small_serving", "small_training_kernel"]
    assert reference["command"].startswith("python -m phoenix.ops.check_reference ")


def test_docs_gpu_section_is_rewritten_from_the_results(cpu_run):
    text = cpu_run[2].read_text()
    section = text.split("<!-- gpu-table:start -->", 1)[1].split("<!-- gpu-table:end -->", 1)[0]
    assert "profile `cpu`" in section
    assert "| small-gqa | 2 x 64 |" in section
    # Every step's table but X's own forward, which a CPU run skips without a payload.
    unmeasured = [line for line in section.splitlines() if "not yet measured" in line]
    assert [line.split("**")[1] for line in unmeasured] == [
        "X's own forward against ours, same device, same inputs"
    ]
    assert "| ranker-64 requests/s at its best concurrency, batching on | not" not in section
    assert "## Results" in text  # the rest of the page is left as it was
