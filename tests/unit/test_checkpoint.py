"""phoenix.config + phoenix.checkpoint: round trips and one readable error per failure."""

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from phoenix import checkpoint
from phoenix.artifacts import PRESETS, generate, preset_config
from phoenix.checkpoint import (
    ArtifactError,
    Corpus,
    ExampleSequence,
    flatten_params,
    load_artifacts,
    load_config,
    load_corpus,
    load_example_sequence,
    ranker_param_shapes,
    retrieval_param_shapes,
    save_artifacts,
    save_corpus,
    save_example_sequence,
)
from phoenix.config import ArtifactConfig
from tests.conftest import reference_file

ARTIFACT_FILES = (
    "config.json",
    "ranker/model_params.npz",
    "retrieval/model_params.npz",
    "embedding_tables.npz",
)
W0 = "transformer/decoder_layer_0/linear/w"


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=0, corpus_size=64)
    return out


@pytest.fixture
def artifact_dir(generated, tmp_path) -> Path:
    """A private copy of the generated artifacts that a test may break."""
    return Path(shutil.copytree(generated, tmp_path / "artifacts"))


@pytest.fixture(scope="module")
def config(generated) -> ArtifactConfig:
    return load_config(generated)


def read_arrays(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as npz:
        return {key: npz[key] for key in npz.files}


def rewrite_npz(path: Path, edit) -> None:
    """Load, edit (a function of the dict) and save with numpy's own writer."""
    arrays = read_arrays(path)
    edit(arrays)
    path.unlink()
    np.savez(path, **arrays)


def rewrite_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def expect_error(fn, *fragments: str) -> str:
    with pytest.raises(ArtifactError) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


# ----------------------------------------------------------------------------------------
# Expected shapes
# ----------------------------------------------------------------------------------------


def test_mini_shapes_match_the_published_param_tree():
    reference = json.loads(reference_file("param_tree.json").read_text())
    config = preset_config(PRESETS["mini"], seed=0)
    ranker = {k: tuple(v) for k, v in reference["ranker"].items()}
    retrieval = {k: tuple(v) for k, v in reference["retrieval"].items()}
    assert ranker_param_shapes(config) == ranker
    assert retrieval_param_shapes(config) == retrieval


def test_remembered_shapes_are_the_traced_ones_and_are_traced_once():
    """A model instance keeps the expected shapes in its program store: the value kept is the
    traced one, and a second start reads it (the store's own tests: test_programs.py)."""
    config = preset_config(PRESETS["mini"], seed=0)
    kept: dict = {}
    computed: list[str] = []

    def remember(name, compute):
        if name not in kept:
            computed.append(name)
            kept[name] = json.loads(json.dumps(compute()))  # as the store keeps it: JSON
        return kept[name]

    for _ in range(2):
        assert ranker_param_shapes(config, remember) == ranker_param_shapes(config)
        assert retrieval_param_shapes(config, remember) == retrieval_param_shapes(config)
    assert [name.split("-param-shapes-")[0] for name in computed] == ["ranker", "retrieval"]
    kept[computed[0]][0][1] = [1, 1]  # a kept value is what the check then uses
    assert ranker_param_shapes(config, remember) != ranker_param_shapes(config)


# ----------------------------------------------------------------------------------------
# Round trips
# ----------------------------------------------------------------------------------------


def assert_same_params(a, b):
    flat_a, flat_b = flatten_params(a), flatten_params(b)
    assert flat_a.keys() == flat_b.keys()
    for key in flat_a:
        np.testing.assert_array_equal(flat_a[key], flat_b[key])


def test_save_load_round_trip(generated, tmp_path):
    loaded = load_artifacts(generated)
    assert "~" in loaded.retrieval_params  # log_temperature kept at top level
    save_artifacts(
        tmp_path, loaded.config, loaded.ranker_params, loaded.retrieval_params, loaded.tables
    )
    again = load_artifacts(tmp_path)
    assert again.config == loaded.config
    assert_same_params(again.ranker_params, loaded.ranker_params)
    assert_same_params(again.retrieval_params, loaded.retrieval_params)
    for key in loaded.tables:
        np.testing.assert_array_equal(again.tables[key], loaded.tables[key])
    for name in ARTIFACT_FILES:  # the writer is deterministic
        assert (tmp_path / name).read_bytes() == (generated / name).read_bytes()


def test_artifacts_expose_nested_params_and_stacked_table(generated, config):
    loaded = load_artifacts(generated)
    assert loaded.ranker_params[W0.rpartition("/")[0]]["w"].dtype == np.float32
    table = loaded.stacked_table()
    assert (
        table.shape[0]
        == 65 + config.user_vocab_size + config.item_vocab_size + config.author_vocab_size
    )
    assert loaded.embedder().table.shape == table.shape


def test_corpus_and_example_round_trip(generated, config, tmp_path):
    corpus = load_corpus(generated, config)
    save_corpus(tmp_path / "c.npz", corpus)
    again = load_corpus(tmp_path / "c.npz", config)
    for name in ("post_ids", "embeddings", "author_ids", "topics"):
        np.testing.assert_array_equal(getattr(again, name), getattr(corpus, name))
    assert again.post_ids.dtype == np.int64 and again.embeddings.dtype == np.float32

    example = load_example_sequence(generated, config)
    save_example_sequence(tmp_path, example)
    assert load_example_sequence(tmp_path, config) == example


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


def published_style(config: ArtifactConfig) -> dict:
    """The published config.json keys only (no optional keys)."""
    data = config.to_dict()
    for key in (
        "num_kv_heads",
        "widening_factor",
        "attn_output_multiplier",
        "right_anchored_rope",
        "enable_linear_proj",
        "action_names",
    ):
        data.pop(key)
    return data


def test_config_round_trip_and_published_defaults(config):
    assert ArtifactConfig.from_dict(config.to_dict(), "x") == config
    parsed = ArtifactConfig.from_dict(published_style(config), "config.json")
    assert parsed.num_kv_heads == parsed.num_heads
    assert parsed.widening_factor == 2.0 and parsed.attn_output_multiplier == 0.125
    assert parsed.right_anchored_rope is False and parsed.enable_linear_proj is True
    names = parsed.action_names
    assert len(names) == 19
    assert {names[1], names[4], names[5], names[6], names[11], names[13]} == {
        "favorite", "reply", "quote", "repost", "dwell", "vqv",
    }  # fmt: skip
    assert (names[1], names[13], names[0], names[18]) == (
        "favorite",
        "vqv",
        "action_0",
        "action_18",
    )
    assert parsed.action_index("reply") == 4


def _set(path: str, value):
    def edit(data):
        *parents, last = path.split(".")
        for part in parents:
            data = data[part]
        data[last] = value

    return edit


def _drop(key: str):
    return lambda data: data.pop(key)


BAD_CONFIGS = [
    (_drop("num_layers"), ["missing key 'num_layers'"]),
    (_drop("hash_params"), ["missing key 'hash_params'"]),
    (_set("emb_size", "32"), ["'emb_size'", "integer", "str"]),
    (_set("num_heads", True), ["'num_heads'", "integer"]),
    (_set("emb_size", 0), ["'emb_size'", "positive", "found 0"]),
    (_set("history_seq_len", -3), ["'history_seq_len'", "positive"]),
    (_set("item_vocab_size", 1), ["'item_vocab_size'", ">= 2"]),
    (_set("widening_factor", 0), ["'widening_factor'", "positive"]),
    (_set("right_anchored_rope", "no"), ["'right_anchored_rope'", "true or false"]),
    (_set("num_kv_heads", 3), ["'num_heads' (2)", "multiple", "'num_kv_heads' (3)"]),
    (_set("key_size", 15), ["'key_size'", "even"]),
    (_set("action_names", ["a"] * 18), ["'action_names'", "18 names", "num_actions = 19"]),
    (_set("action_names", ["a"] * 19), ["'action_names'", "duplicate", "'a'"]),
    (_set("action_names", "favorite"), ["'action_names'", "list"]),
    (_set("hash_params.user.scales", [1, 3, 5]), ["'hash_params.user.scales'", "3 entries",
                                                  "num_user_hashes = 2"]),
    (_set("hash_params.item.biases", [1]), ["'hash_params.item.biases'", "1 entries"]),
    (_set("hash_params.author.modulus", 0), ["'hash_params.author.modulus'", "positive"]),
    (_set("hash_params.author.modulus", -7), ["'hash_params.author.modulus'", "positive"]),
    (_set("hash_params.user.scales", [1.5, 2]), ["'hash_params.user.scales'", "integers"]),
    (_set("hash_params.user.scales", [2**64, 1]), ["'hash_params.user.scales'", "int64"]),
    ((lambda data: data["hash_params"].pop("item")), ["'hash_params'", "'item'"]),
]  # fmt: skip


@pytest.mark.parametrize("edit, fragments", BAD_CONFIGS)
def test_bad_config_values_name_the_file_and_key(config, edit, fragments):
    data = config.to_dict()
    edit(data)
    expect_error(lambda: ArtifactConfig.from_dict(data, "config.json"), "config.json", *fragments)


def test_bad_config_file_fails_load(artifact_dir):
    rewrite_config(artifact_dir, _set("num_layers", 0))
    expect_error(lambda: load_artifacts(artifact_dir), "config.json", "'num_layers'")
    (artifact_dir / "config.json").write_text("{not json")
    expect_error(lambda: load_artifacts(artifact_dir), "config.json", "JSON")


def test_config_mismatching_the_weights_is_caught(artifact_dir):
    rewrite_config(artifact_dir, _set("num_layers", 3))
    expect_error(
        lambda: load_artifacts(artifact_dir),
        "ranker/model_params.npz",
        "missing key 'transformer/decoder_layer_2/",
    )


# ----------------------------------------------------------------------------------------
# Weights and tables
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ARTIFACT_FILES)
def test_missing_file_is_named(artifact_dir, name):
    (artifact_dir / name).unlink()
    expect_error(lambda: load_artifacts(artifact_dir), name, "not found")


def test_missing_directory(tmp_path):
    expect_error(lambda: load_artifacts(tmp_path / "nope"), "nope", "not found")


def test_missing_key(artifact_dir):
    rewrite_npz(artifact_dir / "ranker/model_params.npz", lambda a: a.pop(W0))
    expect_error(
        lambda: load_artifacts(artifact_dir),
        "ranker/model_params.npz",
        f"missing key '{W0}'",
        "expected with shape (32, 48)",
    )


def test_extra_key(artifact_dir):
    rewrite_npz(
        artifact_dir / "retrieval/model_params.npz",
        lambda a: a.update({"phoenix_retrieval_model/bogus": np.zeros(3, np.float32)}),
    )
    expect_error(
        lambda: load_artifacts(artifact_dir),
        "retrieval/model_params.npz",
        "unexpected key 'phoenix_retrieval_model/bogus'",
    )


def test_wrong_shape_names_found_and_expected(artifact_dir):
    key = "phoenix_model/proj_mat_2"
    rewrite_npz(artifact_dir / "ranker/model_params.npz", lambda a: a.update({key: a[key][:-32]}))
    message = expect_error(lambda: load_artifacts(artifact_dir))
    assert message == (f"ranker/model_params.npz: '{key}' has shape (160, 32), expected (192, 32)")


def test_nan_is_rejected(artifact_dir):
    def poison(arrays):
        arrays[W0] = arrays[W0].copy()
        arrays[W0][3, 4] = np.nan

    rewrite_npz(artifact_dir / "ranker/model_params.npz", poison)
    expect_error(
        lambda: load_artifacts(artifact_dir), "ranker/model_params.npz", f"'{W0}'", "non-finite"
    )


def test_integer_weights_are_rejected(artifact_dir):
    key = "phoenix_retrieval_model/proj_mat_1"
    rewrite_npz(
        artifact_dir / "retrieval/model_params.npz",
        lambda a: a.update({key: a[key].astype(np.int32)}),
    )
    expect_error(lambda: load_artifacts(artifact_dir), f"'{key}'", "dtype int32", "float")


def test_log_temperature_is_optional(artifact_dir):
    rewrite_npz(artifact_dir / "retrieval/model_params.npz", lambda a: a.pop("~/log_temperature"))
    assert "~" not in load_artifacts(artifact_dir).retrieval_params


def test_table_shape_mismatch(artifact_dir, config):
    rewrite_npz(
        artifact_dir / "embedding_tables.npz",
        lambda a: a.update({"item_embeddings": a["item_embeddings"][:10]}),
    )
    expect_error(
        lambda: load_artifacts(artifact_dir),
        "embedding_tables.npz",
        "'item_embeddings' has shape (10, 32)",
        f"expected ({config.item_vocab_size}, 32)",
    )


def test_garbage_npz(artifact_dir):
    (artifact_dir / "embedding_tables.npz").write_bytes(b"definitely not a zip")
    expect_error(lambda: load_artifacts(artifact_dir), "embedding_tables.npz", "npz")


def test_save_refuses_invalid_params(generated, tmp_path):
    loaded = load_artifacts(generated)
    ranker = flatten_params(loaded.ranker_params)
    ranker[W0] = ranker[W0][:, :3]
    expect_error(
        lambda: save_artifacts(
            tmp_path,
            loaded.config,
            checkpoint.unflatten_params(ranker),
            loaded.retrieval_params,
            loaded.tables,
        ),
        "ranker/model_params.npz",
        "(32, 3)",
    )
    assert not (tmp_path / "ranker").exists()


# ----------------------------------------------------------------------------------------
# Paths must stay inside the artifact directory
# ----------------------------------------------------------------------------------------


def test_symlinked_subdirectory_escaping_is_rejected(artifact_dir, tmp_path):
    outside = tmp_path / "outside"
    shutil.move(artifact_dir / "ranker", outside)
    os.symlink(outside, artifact_dir / "ranker")
    expect_error(
        lambda: load_artifacts(artifact_dir),
        "ranker/model_params.npz",
        "outside the artifact directory",
    )


def test_symlinked_file_escaping_is_rejected(artifact_dir, tmp_path, config):
    outside = tmp_path / "corpus-elsewhere.npz"
    shutil.move(artifact_dir / "corpus.npz", outside)
    os.symlink(outside, artifact_dir / "corpus.npz")
    expect_error(lambda: load_corpus(artifact_dir, config), "corpus.npz", "outside")
    expect_error(lambda: load_corpus(artifact_dir / "corpus.npz", config), "outside")


def test_symlink_inside_the_directory_is_fine(artifact_dir, config):
    shutil.move(artifact_dir / "corpus.npz", artifact_dir / "real.npz")
    os.symlink("real.npz", artifact_dir / "corpus.npz")
    assert len(load_corpus(artifact_dir, config)) == 64


# ----------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------


def _corpus_edit(key, fn):
    return lambda a: a.update({key: fn(a[key])})


def _duplicate_first(ids):
    ids = ids.copy()
    ids[1] = ids[0]
    return ids


def _zero_first(ids):
    ids = ids.copy()
    ids[0] = 0
    return ids


def _scale_row(vectors):
    vectors = vectors.copy()
    vectors[5] *= 1.01
    return vectors


BAD_CORPORA = [
    (lambda a: a.pop("author_ids"), ["missing key 'author_ids'"]),
    (lambda a: a.update({"extra": np.zeros(64)}), ["unexpected key 'extra'"]),
    (_corpus_edit("candidate_representations", lambda v: v[:, :16]),
     ["'candidate_representations' has shape (64, 16), expected (64, 32)"]),
    (_corpus_edit("author_ids", lambda v: v[:-1]),
     ["'author_ids' has shape (63,), expected (64,)"]),
    (_corpus_edit("topics", lambda v: v[:-2]), ["'topics' has shape (62,)"]),
    (_corpus_edit("candidate_representations", _scale_row),
     ["row 5", "L2 norm 1.01", "expected 1"]),
    (_corpus_edit("post_ids", _duplicate_first), ["'post_ids' must be unique"]),
    (_corpus_edit("post_ids", _zero_first), ["'post_ids' must be > 0", "found 0"]),
    (_corpus_edit("post_ids", lambda v: v.astype(np.float64)), ["'post_ids'", "dtype float64"]),
    (_corpus_edit("author_ids", lambda v: v.astype(np.float32)), ["'author_ids'", "dtype float32"]),
    (lambda a: a.update({k: v[:0] for k, v in a.items()}), ["'post_ids'", "N >= 1"]),
]  # fmt: skip


@pytest.mark.parametrize("edit, fragments", BAD_CORPORA)
def test_bad_corpus(artifact_dir, config, edit, fragments):
    rewrite_npz(artifact_dir / "corpus.npz", edit)
    expect_error(lambda: load_corpus(artifact_dir, config), "corpus.npz: ", *fragments)


def test_corpus_nan(artifact_dir, config):
    def poison(arrays):
        arrays["candidate_representations"] = arrays["candidate_representations"].copy()
        arrays["candidate_representations"][0, 0] = np.nan

    rewrite_npz(artifact_dir / "corpus.npz", poison)
    expect_error(lambda: load_corpus(artifact_dir, config), "corpus.npz", "non-finite")


def test_corpus_of_another_width_is_rejected_by_config(generated, tmp_path, config):
    vectors = np.eye(3, 16, dtype=np.float32)
    save_corpus(tmp_path, Corpus(np.arange(1, 4), vectors, np.arange(3)))
    assert len(load_corpus(tmp_path)) == 3  # fine without a config
    expect_error(lambda: load_corpus(tmp_path, config), "expected (3, 32)")


# ----------------------------------------------------------------------------------------
# Example sequence
# ----------------------------------------------------------------------------------------


def _example(generated, config) -> dict:
    return load_example_sequence(generated, config).to_dict()


def test_example_sequence_fields(generated, config):
    data = json.loads((generated / "example_sequence.json").read_text())
    assert set(data) == {
        "user_id", "history_post_ids", "history_author_ids", "history_actions",
        "history_product_surface", "history_dwell_seconds", "candidate_post_ids",
        "candidate_author_ids", "candidate_product_surface", "top_k",
    }  # fmt: skip
    assert all(len(row) == config.num_actions for row in data["history_actions"])


@pytest.mark.parametrize(
    "edit, fragments",
    [
        (_drop("top_k"), ["missing key 'top_k'"]),
        (_set("top_k", 0), ["'top_k' must be >= 1"]),
        (lambda d: d["history_author_ids"].pop(), ["lengths differ", "history_post_ids"]),
        (lambda d: d["candidate_product_surface"].append(1), ["lengths differ"]),
        (lambda d: d["history_actions"][0].__setitem__(0, 2), ["'history_actions'", "0 or 1"]),
        (lambda d: d["history_actions"][0].pop(), ["'history_actions'", "num_actions = 19"]),
        (lambda d: d["candidate_product_surface"].__setitem__(0, 99), ["[0, 16)"]),
        (lambda d: d["history_dwell_seconds"].__setitem__(0, -1.0), ["'history_dwell_seconds'"]),
        (_set("user_id", "42"), ["'user_id' must be an integer"]),
    ],
)
def test_bad_example_sequence(generated, config, tmp_path, edit, fragments):
    data = _example(generated, config)
    edit(data)
    (tmp_path / "example_sequence.json").write_text(json.dumps(data))
    expect_error(
        lambda: load_example_sequence(tmp_path, config), "example_sequence.json", *fragments
    )


def test_example_sequence_saves_from_a_dict(generated, config, tmp_path):
    data = _example(generated, config)
    save_example_sequence(tmp_path, data)
    assert load_example_sequence(tmp_path) == ExampleSequence.from_dict(data)
    assert re.search(r'"top_k": \d+', (tmp_path / "example_sequence.json").read_text())
