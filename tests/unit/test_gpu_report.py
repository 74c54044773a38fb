"""The GPU section of docs/performance.md and the files it is rendered from
(harness/gpu_bench/report.py), and the command and machine every GPU result file records
(harness/gpu_bench/stamp.py, profiles.py)."""

import json
import re
import shutil
from pathlib import Path

from harness.gpu_bench import profiles, report, stamp

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "bench" / "results" / "gpu"
DOCS = REPO_ROOT / "docs" / "performance.md"


def served(workload, batching, concurrency, throughput, p99=10.0):
    return {"workload": workload, "model": "ranker", "protocol": "http", "batching": batching,
            "concurrency": concurrency, "throughput": throughput, "p50_ms": p99 / 2,
            "p99_ms": p99, "avg_batch": 1.0, "unstable": False, "error": None}  # fmt: skip


def test_the_committed_section_is_what_the_committed_files_give(capsys):
    assert report.main(["--check"]) == 0, capsys.readouterr().out


# Suites of the GPU benchmark that no GPU has run yet: their tables say "not yet measured".
NOT_YET_ON_A_GPU = {"production", "prefix_cache", "reference", "xrex"}


def test_every_suite_has_its_file_and_each_names_its_command_and_machine():
    found = report.load_results(RESULTS)
    assert set(report.FILES) - set(found) == NOT_YET_ON_A_GPU
    for key, result in found.items():
        assert result["command"].startswith(("python -m ", "JAX_PLATFORMS=cuda python -m ")), key
        assert result["machine"]["gpu"] == "NVIDIA H200", key
        assert result["machine"]["jax"] and result["machine"]["cpu_count"], key


def test_check_fails_on_a_changed_figure_and_passes_once_rendered(tmp_path, capsys):
    docs = tmp_path / "performance.md"
    shutil.copy(DOCS, docs)
    text = docs.read_text()
    section = report.section(text)
    changed = section.replace("| 58.8 s |", "| 57.0 s |", 1)
    assert changed != section  # the start-up figure is in the committed section
    docs.write_text(text.replace(section, changed))
    assert report.main(["--check", "--docs", str(docs)]) == 1
    assert "57.0 s" in capsys.readouterr().out  # says which line differs
    assert report.main(["--docs", str(docs)]) == 0
    assert report.main(["--check", "--docs", str(docs)]) == 0
    assert docs.read_text() == text  # rendered back to the committed page, the rest untouched


def test_missing_steps_say_not_yet_measured_and_other_suites_stay_out():
    body = report.render({})
    for title in ("**Engine against", "**Retrieval**", "**Server start-up**", "**Served ranker**",
                  "**recommend end to end**", "**X's production ranker served**",
                  "**The prefix cache**", "**X's outputs, reproduced"):  # fmt: skip
        block = body.split(title, 1)[1].split("\n\n**", 1)[0]
        assert report.NOT_MEASURED in block, title
    for absent in ("more instances", "host work", "Top 100", "Where a call's time goes"):
        assert absent not in body


def test_engine_points_the_file_lacks_are_listed_unmeasured():
    point = {"config": "mini", "users": 1, "candidates": 64, "original_jit_cands_per_s": 1000.0,
             "engine_cands_per_s": 500.0, "engine_vs_original": 0.5,
             "device_ranker_cands_per_s": 2000.0, "device_ranker_vs_original": 2.0}  # fmt: skip
    lines = report.engine_table({"profile": "gpu", "ranking": [point]})
    assert "| mini | 1 x 64 | 1,000 | 500 | 0.50x | 2,000 | 2.00x |" in lines
    unmeasured = [line for line in lines if report.NOT_MEASURED in line]
    expected = sum(len(points) for points in profiles.GPU.ranking_points.values()) - 1
    assert len(unmeasured) == expected
    assert "| large | 64 x 1024 | not yet measured |" in "\n".join(lines)


def test_more_instances_show_batching_on_and_off_at_each_concurrency():
    two = {"served": [served("ranker-64", "on", 16, 1188.0), served("ranker-64", "off", 16, 537.0)]}
    eight = {
        "settings": {"instances": {"ranker": 8}},
        "served": [served("ranker-64", "on", 16, 1236.0), served("ranker-64", "off", 16, 1456.0),
                   served("ranker-64", "on", 64, 4316.0)],
    }  # fmt: skip
    body = report.render({"serving": two, "serving_instances": eight})
    assert "**Served ranker, more instances**" in body and "instances: ranker 8)" in body
    assert "| ranker-64 | the profile's | 1,188 / 537 | - / - |" in body
    assert "| ranker-64 | ranker 8 | 1,236 / 1,456 | 4,316 / - |" in body


def test_the_section_holds_no_date():
    body = report.render(report.load_results(RESULTS))
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", body)
    assert "first run" not in body.lower() and "before and after" not in body.lower()


def test_a_step_records_its_command_as_a_reader_types_it():
    argv = [str(REPO_ROOT / "bench" / "gpu" / "retrieval.py"), "--profile", "gpu",
            "--out", str(REPO_ROOT / "bench" / "results" / "gpu" / "retrieval.json")]  # fmt: skip
    expected = "python -m bench.gpu.retrieval --profile gpu --out bench/results/gpu/retrieval.json"
    assert profiles.command_line(argv) == expected


def test_stamp_adds_the_command_and_machine_and_keeps_what_the_file_has(tmp_path):
    path = tmp_path / "serving-ranker8.json"
    path.write_text(json.dumps({"machine": {"cpu_count": 16}, "served": []}))
    store = "build/gpu-bench/programs-gpu"
    result = stamp.stamp(path, f"env STORE={REPO_ROOT}/{store} python3 -m x", machine={"gpu": "G"})
    assert result["command"] == f"env STORE={store} python3 -m x"  # no path of this machine
    assert result["machine"] == {"cpu_count": 16, "gpu": "G"}  # what the file had, kept
    assert json.loads(path.read_text()) == result
    assert stamp.stamp(path, "another", machine={})["command"] == result["command"]
