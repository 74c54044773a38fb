"""Unit tests for reading config.pbtxt and deriving model repositories from it."""

import pytest

from phoenix.serving.repository import (
    InstanceKind,
    PbtxtError,
    derive_config,
    derive_repository,
    has_dynamic_batching,
    is_ensemble,
    parse_config,
    set_instance_kind,
    set_max_queue_delay,
)

RANKER_CONFIG = """\
name: "ranker"
backend: "python"
max_batch_size: 64
# braces in comments { must not count
input [
  {
    name: "user_history"
    data_type: TYPE_INT32
    dims: [ -1, 3 ]
    allow_ragged_batch: true
  },
  {
    name: "candidates"
    data_type: TYPE_INT32
    dims: [ -1 ]
  }
]
output [ { name: "scores", data_type: TYPE_FP32, dims: [ -1, 19 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 2000
  priority_queue_policy { key: 1 value: { timeout_action: REJECT } }
}
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
parameters { key: "note" value: { string_value: "a } brace in a string" } }
"""


def test_parse_reads_the_whole_config_into_model_config():
    config = parse_config(RANKER_CONFIG)
    assert config.name == "ranker" and config.max_batch_size == 64
    assert [i.name for i in config.input] == ["user_history", "candidates"]
    assert list(config.input[0].dims) == [-1, 3] and config.input[0].allow_ragged_batch
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 16]
    assert config.parameters["note"].string_value == "a } brace in a string"


@pytest.mark.parametrize(
    "broken", ["a { b: 1", "input [ {", "name: 'x' }", "{ }", "nmae: 'typo'"], ids=repr
)
def test_parse_rejects_broken_text_and_unknown_fields(broken):
    with pytest.raises(PbtxtError):
        parse_config(broken)


def kinds(config) -> list[str]:
    return [InstanceKind.Name(group.kind) for group in config.instance_group]


def test_set_instance_kind_gpu_changes_only_the_kind():
    config = parse_config(RANKER_CONFIG)
    set_instance_kind(config, "KIND_GPU")
    assert kinds(config) == ["KIND_GPU"]
    assert config == parse_config(RANKER_CONFIG.replace("KIND_CPU", "KIND_GPU"))


def test_set_instance_kind_in_every_group():
    config = parse_config(
        "instance_group [ { kind: KIND_CPU count: 1 }, { count: 2 } ]\n"
        "instance_group { kind: KIND_AUTO }\n"
    )
    set_instance_kind(config, "KIND_GPU")
    assert kinds(config) == ["KIND_GPU"] * 3
    assert [group.count for group in config.instance_group] == [1, 2, 0]


def test_set_instance_kind_adds_group_when_missing():
    config = parse_config('name: "m"')
    set_instance_kind(config, "KIND_GPU")
    assert kinds(config) == ["KIND_GPU"]


def test_switch_to_cpu_drops_gpu_list():
    config = parse_config("instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] count: 2 } ]")
    set_instance_kind(config, "KIND_CPU")
    assert kinds(config) == ["KIND_CPU"]
    assert list(config.instance_group[0].gpus) == [] and config.instance_group[0].count == 2


def test_derive_without_batching_removes_the_whole_block_and_nothing_else():
    derived = parse_config(derive_config(RANKER_CONFIG, dynamic_batching=False))
    assert not has_dynamic_batching(derived)
    expected = parse_config(RANKER_CONFIG)
    expected.ClearField("dynamic_batching")
    assert derived == expected


def test_set_max_queue_delay_replaces_existing_value():
    config = parse_config(RANKER_CONFIG)
    set_max_queue_delay(config, 500)
    assert config == parse_config(RANKER_CONFIG.replace("2000", "500"))


def test_set_max_queue_delay_sets_it_when_missing_and_ignores_unbatched_models():
    config = parse_config("dynamic_batching { }")
    set_max_queue_delay(config, 100)
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    unbatched = parse_config("max_batch_size: 8\n")
    set_max_queue_delay(unbatched, 100)
    assert not has_dynamic_batching(unbatched)
    with pytest.raises(ValueError):
        set_max_queue_delay(config, -1)


def test_derive_config_combines_options():
    no_batching = parse_config(derive_config(RANKER_CONFIG, device="gpu", dynamic_batching=False))
    assert kinds(no_batching) == ["KIND_GPU"] and not has_dynamic_batching(no_batching)
    cpu = parse_config(derive_config(RANKER_CONFIG, device="cpu", max_queue_delay_us=0))
    assert kinds(cpu) == ["KIND_CPU"] and cpu.dynamic_batching.max_queue_delay_microseconds == 0
    assert cpu.HasField("dynamic_batching")
    with pytest.raises(ValueError, match="device"):
        derive_config(RANKER_CONFIG, device="tpu")


def test_derive_repository_copies_files_and_rewrites_configs(tmp_path):
    source = tmp_path / "model_repository"
    (source / "ranker" / "1").mkdir(parents=True)
    (source / "ranker" / "config.pbtxt").write_text(RANKER_CONFIG)
    (source / "ranker" / "1" / "model.py").write_text("# model\n")
    (source / "ranker" / "1" / "__pycache__").mkdir()
    (source / "retriever" / "1").mkdir(parents=True)
    (source / "retriever" / "config.pbtxt").write_text('name: "retriever"\n')

    dest = derive_repository(source, tmp_path / "build" / "repo-gpu", device="gpu")

    assert (dest / "ranker" / "1" / "model.py").read_text() == "# model\n"
    assert not (dest / "ranker" / "1" / "__pycache__").exists()
    assert "KIND_GPU" in (dest / "ranker" / "config.pbtxt").read_text()
    assert "KIND_GPU" in (dest / "retriever" / "config.pbtxt").read_text()
    assert (source / "ranker" / "config.pbtxt").read_text() == RANKER_CONFIG

    again = derive_repository(source, dest, device="cpu", dynamic_batching=False)
    assert "KIND_CPU" in (again / "ranker" / "config.pbtxt").read_text()


def test_derive_repository_refuses_destination_inside_source(tmp_path):
    (tmp_path / "repo").mkdir()
    with pytest.raises(ValueError):
        derive_repository(tmp_path / "repo", tmp_path / "repo" / "gpu")
    with pytest.raises(FileNotFoundError):
        derive_repository(tmp_path / "missing", tmp_path / "out")


def test_derive_repository_names_the_broken_config(tmp_path):
    (tmp_path / "repo" / "bad").mkdir(parents=True)
    (tmp_path / "repo" / "bad" / "config.pbtxt").write_text("input [ {")
    with pytest.raises(PbtxtError, match="bad/config.pbtxt"):
        derive_repository(tmp_path / "repo", tmp_path / "out")


def test_ensembles_are_left_unchanged():
    text = 'name: "recommend"\nplatform: "ensemble"\nmax_batch_size: 8\n'
    assert is_ensemble(parse_config(text))
    assert derive_config(text, device="gpu", dynamic_batching=False) == text
    assert not is_ensemble(parse_config('name: "ranker"\nbackend: "python"\n'))


def test_gpu_repository_serves_bigger_batches_with_few_buckets(tmp_path):
    from pathlib import Path

    from phoenix.serving.contracts import CONTRACTS
    from phoenix.serving.repository import (
        CONFIG_NAME,
        GPU_SERVING,
        read_config,
        string_parameters,
    )
    from phoenix.serving.triton_adapter import batch_buckets_of

    source = Path(__file__).resolve().parents[2] / "model_repository"
    dest = derive_repository(source, tmp_path / "gpu", device="gpu")
    ranker = read_config(dest / "ranker" / CONFIG_NAME)
    assert ranker.max_batch_size == 64
    assert [g.count for g in ranker.instance_group] == [2]
    params = string_parameters(ranker)
    assert batch_buckets_of(params, ranker.max_batch_size) == (1, 8, 64)
    assert params["candidate_buckets"] == "64,256,1024"
    assert (
        params["score_weights"]
        == string_parameters(read_config(source / "ranker" / CONFIG_NAME))["score_weights"]
    )  # artifact-facing parameters untouched
    assert ranker.dynamic_batching.default_queue_policy.max_queue_size == 1024
    for model, serving in GPU_SERVING.items():
        config = read_config(dest / model / CONFIG_NAME)
        assert config.max_batch_size == serving.max_batch_size
        assert batch_buckets_of(string_parameters(config), config.max_batch_size)
    recommend = read_config(dest / "recommend" / CONFIG_NAME)
    assert recommend.max_batch_size == CONTRACTS["recommend"].max_batch_size  # unchanged
    assert all(
        recommend.max_batch_size <= GPU_SERVING[s.model].max_batch_size
        for s in CONTRACTS["recommend"].steps
    )
