"""Every config.pbtxt is generated from its contract and a deployment profile."""

import json
import shutil

import pytest
from tritonclient.grpc import model_config_pb2

from phoenix.ops import configs, serve
from phoenix.ops.configs import ConfigError, model_config, read_config
from phoenix.ops.profiles import CPU, GPU, PROFILES, instance_counts
from phoenix.schema.contracts import FEED_POLICY, LIMITS, RANKER, RANKER_SCORE_WEIGHTS
from phoenix.schema.recommend import RECOMMEND, RECOMMEND_CHAIN
from phoenix.schema.served import CONTRACTS

CPU_KIND = model_config_pb2.ModelInstanceGroup.Kind.Value("KIND_CPU")

KIND = configs.model_config_pb2.ModelInstanceGroup.Kind.Name


def instances(config) -> list[tuple[str, int]]:
    return [(KIND(g.kind), g.count) for g in config.instance_group]


def test_committed_configs_are_the_generated_ones():
    assert list(configs.stale_files()) == [], "run `make configs`"


def test_every_model_has_a_config_and_every_backend_model_a_gpu_variant():
    files = configs.generated_files()
    for name, contract in CONTRACTS.items():
        assert f"{name}/config.pbtxt" in files
        assert (f"{name}/configs/gpu.pbtxt" in files) == (not contract.is_ensemble)


def test_a_generated_config_says_what_the_contract_says():
    config = read_config(configs.REPOSITORY / "ranker" / "config.pbtxt")
    assert config.name == "ranker" and config.backend == "python"
    assert config.max_batch_size == RANKER.max_batch_size
    inputs = {t.name: t for t in config.input}
    assert list(inputs) == list(RANKER.input_names)
    actions = inputs["history_actions"]
    assert list(actions.dims) == [-1, -1] and actions.allow_ragged_batch
    assert inputs["history_dwell_seconds"].optional and not inputs["user_id"].optional
    assert [t.name for t in config.output] == list(RANKER.output_names)
    parameters = {k: v.string_value for k, v in config.parameters.items()}
    assert parameters["candidate_buckets"] == "16,64,256,512,1024"
    assert parameters["batch_buckets"] == "1,2,4,8"
    assert parameters["score_weights"] == json.dumps(RANKER_SCORE_WEIGHTS)
    assert instances(config) == [("KIND_CPU", 2)]


def test_the_ensemble_config_wires_the_contract_steps():
    config = read_config(configs.REPOSITORY / "recommend" / "config.pbtxt")
    assert config.platform == "ensemble" and not config.instance_group
    steps = [
        (s.model_name, dict(s.input_map), dict(s.output_map))
        for s in config.ensemble_scheduling.step
    ]
    assert steps == [(s.model, dict(s.input_map), dict(s.output_map)) for s in RECOMMEND.steps]


def test_the_gpu_variant_batches_more_with_few_buckets():
    ranker = read_config(configs.REPOSITORY / "ranker" / "configs" / "gpu.pbtxt")
    parameters = {k: v.string_value for k, v in ranker.parameters.items()}
    assert ranker.max_batch_size == 64
    assert instances(ranker) == [("KIND_GPU", 2)]
    assert parameters["batch_buckets"] == "1,8,64"
    assert parameters["candidate_buckets"] == "64,256,1024"
    assert parameters["score_weights"] == json.dumps(RANKER_SCORE_WEIGHTS)
    assert ranker.dynamic_batching.default_queue_policy.max_queue_size == 1024


@pytest.mark.parametrize("profile", list(PROFILES.values()), ids=list(PROFILES))
def test_every_profile_compiles_what_it_may_be_sent(profile):
    """Batch buckets reach the batch size, the largest candidate bucket is the request limit
    (a larger limit would compile new shapes while serving), and the ensemble never sends a
    step more rows than that step takes."""
    for contract in CONTRACTS.values():
        if contract.is_ensemble:
            continue
        config = model_config(contract, profile)
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        if "batch_buckets" in parameters:
            assert int(parameters["batch_buckets"].split(",")[-1]) == config.max_batch_size
        elif contract.stages:  # every stage compiled for every batch the chain can take
            stage_buckets = [v for k, v in parameters.items() if k.endswith(".batch_buckets")]
            assert len(stage_buckets) == 3  # the user tower, the retriever, the ranker
            for buckets in stage_buckets:
                assert int(buckets.split(",")[-1]) >= config.max_batch_size
        elif contract.name in ("feed_policy", "user_state", "served_log"):
            assert "candidate_buckets" not in parameters  # numpy and Redis: nothing compiled
        else:
            assert int(parameters["rows_per_call"]) >= 1
    ranker = {k: v.string_value for k, v in model_config(RANKER, profile).parameters.items()}
    # the policy runs on the host whatever the profile's device
    assert model_config(FEED_POLICY, profile).instance_group[0].kind == CPU_KIND
    assert int(ranker["candidate_buckets"].split(",")[-1]) == LIMITS.max_candidates
    for step in RECOMMEND.steps:
        assert RECOMMEND.max_batch_size <= profile.models[step.model].batch_size(step.model)
    chain = model_config(RECOMMEND_CHAIN, profile)
    chained = {k: v.string_value for k, v in chain.parameters.items()}
    assert chained["ranker.candidate_buckets"] == ranker["candidate_buckets"]  # one fact


def test_a_variant_repository_is_generated_not_edited(tmp_path):
    dest = configs.write_repository(tmp_path / "nobatch", CPU, dynamic_batching=False)
    for name in CONTRACTS:
        config = read_config(dest / name / "config.pbtxt")
        assert not config.HasField("dynamic_batching")
        assert not (dest / name / "configs").exists()
    assert (dest / "ranker" / "1" / "model.py").read_text() == (
        configs.REPOSITORY / "ranker" / "1" / "model.py"
    ).read_text()
    slow = configs.write_repository(tmp_path / "gpu-slow", GPU.with_queue_delay(0))
    ranker = read_config(slow / "ranker" / "config.pbtxt")
    assert ranker.dynamic_batching.max_queue_delay_microseconds == 0
    assert ranker.max_batch_size == 64
    with pytest.raises(ValueError, match="must lie outside"):
        configs.write_repository(configs.REPOSITORY / "x", CPU)


def test_a_profile_with_more_instances_changes_only_those_models(tmp_path):
    eight = GPU.with_instances({"ranker": 8})
    dest = configs.write_repository(tmp_path / "ranker8", eight)
    assert instances(read_config(dest / "ranker" / "config.pbtxt")) == [("KIND_GPU", 8)]
    for name in ("retriever", "feed_policy"):
        assert eight.models[name] == GPU.models[name]
    assert eight.models["ranker"].queue == GPU.models["ranker"].queue
    with pytest.raises(ValueError, match="no served model"):
        GPU.with_instances({"rankr": 2})
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="whole number >= 1"):
            GPU.with_instances({"ranker": bad})


def test_a_profile_with_other_parameters_gives_them_to_the_model_and_its_chain():
    off = CPU.with_parameters("ranker", {"prefix_cache_mib": 0})
    assert off.parameter_values("ranker")["prefix_cache_mib"] == 0
    assert off.parameter_values("recommend_chain")["ranker.prefix_cache_mib"] == 0
    assert "prefix_cache_mib" not in CPU.models["ranker"].parameters  # the profile unchanged
    assert off.models["retriever"] == CPU.models["retriever"]
    with pytest.raises(ValueError, match="no served model"):
        CPU.with_parameters("rankr", {})


def test_instance_counts_parse_the_command_line_form():
    assert instance_counts("ranker=8, retriever=2") == {"ranker": 8, "retriever": 2}
    assert instance_counts("") == {}
    for bad in ("ranker", "ranker=0", "ranker=x", "ranker=-1"):
        with pytest.raises(ValueError, match="expected MODEL=N with N >= 1"):
            instance_counts(bad)
    with pytest.raises(ValueError, match="'ranker' is given twice"):
        instance_counts("ranker=8,ranker=2")
    with pytest.raises(SystemExit):  # argparse names the unknown model at once
        serve.build_parser().parse_args(["--instances", "rankr=2"])


def test_serve_instances_writes_a_copy_with_those_counts(tmp_path):
    dest = configs.variant_repository(configs.REPOSITORY, tmp_path, "gpu", instances={"ranker": 8})
    assert dest != configs.REPOSITORY.resolve()
    assert instances(read_config(dest / "ranker" / "config.pbtxt")) == [("KIND_GPU", 8)]
    assert instances(read_config(dest / "retriever" / "config.pbtxt")) == [("KIND_GPU", 1)]
    with pytest.raises(ConfigError, match="--instances: no served model \\['rankr'\\]"):
        configs.variant_repository(configs.REPOSITORY, tmp_path, "cpu", instances={"rankr": 2})
    args = serve.build_parser().parse_args(["--instances", "ranker=4"])
    assert args.instances == {"ranker": 4}


def test_check_reports_a_stale_config_and_make_configs_mends_it(tmp_path, capsys):
    repository = tmp_path / "repo"
    shutil.copytree(configs.REPOSITORY, repository)
    path = repository / "ranker" / "config.pbtxt"
    path.write_text(path.read_text().replace("max_batch_size: 8", "max_batch_size: 16"))
    (repository / "retriever" / "configs" / "gpu.pbtxt").unlink()
    assert configs.main(["--check", "--repository", str(repository)]) == 1
    err = capsys.readouterr().err
    assert "ranker/config.pbtxt" in err and "retriever/configs/gpu.pbtxt" in err
    assert configs.main(["--repository", str(repository)]) == 0
    assert configs.main(["--check", "--repository", str(repository)]) == 0


def test_a_broken_config_file_is_named(tmp_path):
    broken = tmp_path / "config.pbtxt"
    broken.write_text('name: "ranker"\nmax_batch_sise: 8\n')
    with pytest.raises(ConfigError, match=f"{broken}:.*max_batch_sise"):
        read_config(broken)
