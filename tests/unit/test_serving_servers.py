"""The serving benchmark's repositories (bench/serving_servers.py): the ranker's prefix cache
off, and a quick run compiling only the candidate buckets its workloads fill."""

from types import SimpleNamespace

from bench.serving_servers import ranker_parameters, repository_for
from phoenix.ops.configs import REPOSITORY, read_config


def args(tmp_path, quick: bool, workloads: list[str]) -> SimpleNamespace:
    return SimpleNamespace(instances={}, device="cpu", quick=quick, workloads=workloads,
                           build_dir=tmp_path, model_repository=REPOSITORY)  # fmt: skip


def test_a_full_run_keeps_every_candidate_bucket(tmp_path):
    values = ranker_parameters({}, args(tmp_path, False, ["ranker-64", "ranker-512"]))
    assert values == {"prefix_cache_mib": 0}


def test_a_quick_run_keeps_the_buckets_its_workloads_fill(tmp_path):
    quick = args(tmp_path, True, ["ranker-64", "ranker-512", "recommend"])
    assert ranker_parameters({}, quick)["candidate_buckets"] == (64, 512)
    gpu = {"candidate_buckets": (64, 256, 1024)}  # 512 candidates fill the 1024 bucket there
    assert ranker_parameters(gpu, quick)["candidate_buckets"] == (64, 1024)
    assert "candidate_buckets" not in ranker_parameters({}, args(tmp_path, True, ["recommend"]))


def test_the_quick_repository_serves_those_buckets_with_the_cache_off(tmp_path):
    repository = repository_for("on", args(tmp_path, True, ["ranker-64"]))
    parameters = read_config(repository / "ranker" / "config.pbtxt").parameters
    assert parameters["candidate_buckets"].string_value == "64"
    assert parameters["prefix_cache_mib"].string_value == "0"
