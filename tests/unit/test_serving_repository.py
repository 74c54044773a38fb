"""The serving benchmark's repositories (harness/serving_repository.py): the ranker's prefix
cache off, a quick run compiling only the candidate buckets its workloads fill, and only the
programs of the models a server loads."""

from harness.serving_repository import (
    compiled_models,
    ranker_parameters,
    serving_repository,
    workload_widths,
)
from phoenix.ops.configs import REPOSITORY, read_config


def test_a_full_run_keeps_every_candidate_bucket():
    assert ranker_parameters({}, None) == {"prefix_cache_mib": 0}


def test_a_quick_run_keeps_the_buckets_its_workloads_fill():
    assert ranker_parameters({}, [64, 512])["candidate_buckets"] == (64, 512)
    gpu = {"candidate_buckets": (64, 256, 1024)}  # 512 candidates fill the 1024 bucket there
    assert ranker_parameters(gpu, [64, 512])["candidate_buckets"] == (64, 1024)
    assert "candidate_buckets" not in ranker_parameters({}, [])


def test_a_quick_run_of_recommend_compiles_the_bucket_its_retrieval_fills(tmp_path):
    """Its ranker stage takes the ranker's parameters: 8 cache-off programs where the five
    buckets made 40 (most of the GPU bench smoke's recommend step)."""
    for widths, buckets in ((workload_widths(["recommend"]), "256"), (None, "16,64,256,512,1024")):
        repository = serving_repository(
            tmp_path / buckets, REPOSITORY, device="cpu", batching=True, instances={},
            ranker_widths=widths,
        )  # fmt: skip
        chain = read_config(repository / "recommend_chain" / "config.pbtxt")
        assert chain.parameters["ranker.candidate_buckets"].string_value == buckets
        assert chain.parameters["ranker.prefix_cache_mib"].string_value == "0"


def test_the_quick_repository_serves_those_buckets_with_the_cache_off(tmp_path):
    repository = serving_repository(
        tmp_path, REPOSITORY, device="cpu", batching=True, instances={}, ranker_widths=[64]
    )
    parameters = read_config(repository / "ranker" / "config.pbtxt").parameters
    assert parameters["candidate_buckets"].string_value == "64"
    assert parameters["prefix_cache_mib"].string_value == "0"
    assert read_config(repository / "ranker" / "config.pbtxt").HasField("dynamic_batching")


def test_a_server_of_the_ensemble_alone_compiles_its_chain_only():
    assert compiled_models(["recommend"]) == ["recommend_chain"]  # not the ranker model's
    assert compiled_models(["ranker", "recommend", "ranker"]) == ["ranker", "recommend_chain"]
    assert compiled_models([]) == []
