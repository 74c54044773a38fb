"""Unit tests for the config.pbtxt editing behind derived model repositories."""

import pytest

from phoenix.serving.repository import (
    PbtxtError,
    derive_config,
    derive_repository,
    find_fields,
    has_dynamic_batching,
    messages_of,
    parse_pbtxt,
    remove_fields,
    set_instance_kind,
    set_max_queue_delay,
    tokenize,
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


def test_tokenize_skips_comments_and_keeps_strings_whole():
    tokens = tokenize('a: "x } # y" # comment {\nb { }')
    assert [t.text for t in tokens] == ["a", ":", '"x } # y"', "b", "{", "}"]


def test_tokenize_rejects_unterminated_string():
    with pytest.raises(PbtxtError, match="line 2"):
        tokenize('a: 1\nb: "oops\n')


def test_parse_finds_top_level_fields_with_nested_braces():
    fields = parse_pbtxt(RANKER_CONFIG)
    names = [f.name for f in fields]
    assert names == [
        "name",
        "backend",
        "max_batch_size",
        "input",
        "output",
        "dynamic_batching",
        "instance_group",
        "parameters",
    ]
    (batching,) = find_fields(fields, "dynamic_batching")
    block = RANKER_CONFIG[batching.start : batching.end]
    assert block.startswith("dynamic_batching {") and block.endswith("REJECT } }\n}")


def test_messages_of_handles_list_and_single_message_forms():
    fields = parse_pbtxt("input [ { name: 'a' }, { name: 'b' } ] output { name: 'c' }")
    (inputs,) = find_fields(fields, "input")
    (output,) = find_fields(fields, "output")
    assert len(messages_of(inputs)) == 2
    assert len(messages_of(output)) == 1


@pytest.mark.parametrize("broken", ["a { b: 1", "a [ 1, 2", "a { b: 1 } }", "{ }", "a: "], ids=repr)
def test_parse_rejects_unbalanced_text(broken):
    with pytest.raises(PbtxtError):
        parse_pbtxt(broken)


def test_parse_accepts_separators_and_angle_brackets():
    fields = parse_pbtxt("a: 1, b: 2; c < d: 3 > e: 'x' 'y'")
    assert [f.name for f in fields] == ["a", "b", "c", "e"]


def test_set_instance_kind_gpu_replaces_only_the_kind_value():
    derived = set_instance_kind(RANKER_CONFIG, "KIND_GPU")
    assert "kind: KIND_GPU" in derived and "KIND_CPU" not in derived
    assert derived == RANKER_CONFIG.replace("KIND_CPU", "KIND_GPU")


def test_set_instance_kind_in_every_group_and_both_forms():
    text = (
        "instance_group [ { kind: KIND_CPU count: 1 }, { count: 2 } ]\n"
        "instance_group { kind: KIND_AUTO }\n"
    )
    derived = set_instance_kind(text, "KIND_GPU")
    kinds = [
        k.value
        for g in find_fields(parse_pbtxt(derived), "instance_group")
        for m in messages_of(g)
        for k in find_fields(m.fields, "kind")
    ]
    assert [derived[v.start : v.end] for v in kinds] == ["KIND_GPU"] * 3


def test_set_instance_kind_inserts_kind_with_matching_indent():
    text = "instance_group [\n  {\n    count: 2\n  }\n]\n"
    derived = set_instance_kind(text, "KIND_GPU")
    assert derived == "instance_group [\n  {\n    kind: KIND_GPU\n    count: 2\n  }\n]\n"


def test_set_instance_kind_adds_group_when_missing():
    derived = set_instance_kind('name: "m"', "KIND_GPU")
    assert derived == 'name: "m"\ninstance_group [ { kind: KIND_GPU } ]\n'
    parse_pbtxt(derived)


def test_switch_to_cpu_drops_gpu_list():
    text = "instance_group [\n  {\n    kind: KIND_GPU\n    gpus: [ 0, 1 ]\n  }\n]\n"
    derived = set_instance_kind(text, "KIND_CPU")
    assert derived == "instance_group [\n  {\n    kind: KIND_CPU\n  }\n]\n"


def test_remove_dynamic_batching_removes_whole_block_and_its_lines():
    derived = remove_fields(RANKER_CONFIG, "dynamic_batching")
    assert not has_dynamic_batching(derived)
    assert "preferred_batch_size" not in derived and "priority_queue_policy" not in derived
    assert "output [ {" in derived and "instance_group [" in derived
    assert "\n\n" not in derived  # no blank line left behind
    parse_pbtxt(derived)


def test_remove_inline_block_keeps_neighbours():
    derived = remove_fields("a: 1 dynamic_batching { } b: 2", "dynamic_batching")
    assert [f.name for f in parse_pbtxt(derived)] == ["a", "b"]


def test_remove_only_touches_top_level_fields():
    text = "m { dynamic_batching { } }\ndynamic_batching { }\n"
    assert remove_fields(text, "dynamic_batching") == "m { dynamic_batching { } }\n"


def test_set_max_queue_delay_replaces_existing_value():
    derived = set_max_queue_delay(RANKER_CONFIG, 500)
    assert "max_queue_delay_microseconds: 500\n" in derived
    assert derived == RANKER_CONFIG.replace("2000", "500")


def test_set_max_queue_delay_inserts_when_missing_and_ignores_unbatched_models():
    assert set_max_queue_delay("dynamic_batching { }", 100) == (
        "dynamic_batching { max_queue_delay_microseconds: 100 }"
    )
    assert set_max_queue_delay("max_batch_size: 8\n", 100) == "max_batch_size: 8\n"
    with pytest.raises(ValueError):
        set_max_queue_delay("dynamic_batching { }", -1)


def test_derive_config_combines_options():
    no_batching = derive_config(RANKER_CONFIG, device="gpu", dynamic_batching=False)
    assert "KIND_GPU" in no_batching and not has_dynamic_batching(no_batching)
    cpu = derive_config(RANKER_CONFIG, device="cpu", max_queue_delay_us=0)
    assert "KIND_CPU" in cpu and "max_queue_delay_microseconds: 0\n" in cpu
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
    from phoenix.serving.repository import derive_config, is_ensemble

    text = 'name: "recommend"\nplatform: "ensemble"\nmax_batch_size: 8\n'
    assert is_ensemble(text)
    assert derive_config(text, device="gpu", dynamic_batching=False) == text
    assert not is_ensemble('name: "ranker"\nbackend: "python"\n')
