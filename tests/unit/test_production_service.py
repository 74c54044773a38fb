"""Serving X's production ranker, in process and without compiling: its artifacts (config in
config.json, checks, X's checkpoint config), the host's half of the engine (ids hashed as X
hashes them, a padded contract batch to X's batch) and the buckets a batch is padded to. The
programs themselves run against a real server in tests/integration/test_production_serving.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from phoenix.checkpoint import ArtifactError, load_artifacts, load_config
from phoenix.checkpoint.production import (
    EMB_TABLE_FILE,
    load_production_ranker,
    production_config,
    production_config_dict,
    production_config_from_dict,
    production_config_from_xai,
)
from phoenix.client.client import ranker_inputs
from phoenix.engine.production_serving import (
    REFERENCE_TIME,
    STALE_AFTER_S,
    ProductionBatchRanker,
    candidate_sequence,
    history_sequence,
    user_features,
)
from phoenix.feed_examples import post_semantic_ids
from phoenix.feed_features import ACTION_SLOTS
from phoenix.production.config import NANO, apply_overrides
from phoenix.production.hashing import hash_author_ids, hash_item_ids, hash_user_ids
from phoenix.production.params import init_params
from phoenix.production_artifacts import TINY_OVERRIDES, generate_production
from phoenix.schema.batches import pad_batch
from phoenix.schema.request_types import RankerRequest
from phoenix.schema.requests import parse
from phoenix.stub.services.ranker import batch_widths
from tests.conftest import DATA_DIR

DAY = 86_400


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("production-tiny")
    generate_production("tiny", out, seed=2, corpus_size=40)
    return out


def test_the_artifacts_name_their_family_and_hold_the_rankers_config(artifacts):
    config = load_config(artifacts)
    ranker = production_config(config)
    assert config.ranker_family == "production" and config.action_names == ACTION_SLOTS
    assert (ranker.emb_size, ranker.num_layers, ranker.history_seq_len) == (32, 2, 30)
    assert config.history_seq_len == ranker.history_seq_len == 30
    assert production_config_from_dict(production_config_dict(ranker)) == ranker
    loaded = load_artifacts(artifacts)
    assert loaded.ranker_params is None and loaded.production_ranker is not None
    assert loaded.production_ranker.params["emb_table"].shape == (ranker.hashes.num_rows, 16)


def test_an_original_config_json_stays_what_it_was(tiny_artifacts):
    text = (tiny_artifacts / "config.json").read_text()
    assert "ranker_family" not in text and "production_ranker" not in text
    assert load_config(tiny_artifacts).ranker_family == "original"


def ranker_key(key, value):
    return lambda d: d["production_ranker"].update({key: value})


@pytest.mark.parametrize(
    "edit, message",
    [
        (ranker_key("num_layers", "4"), "'production_ranker.num_layers' must be an integer"),
        (ranker_key("history_seq_len", 31), "must fill whole attention blocks"),
        (ranker_key("widening", 2), "unknown keys ['widening']"),
        (lambda d: d.update(history_seq_len=20), "is 20 but the production ranker's is 30"),
        (lambda d: d.update(ranker_family="grok"), "'ranker_family' must be one of"),
        (lambda d: d.pop("production_ranker"), "needs its config in 'production_ranker'"),
    ],
)
def test_a_bad_production_config_is_named(artifacts, tmp_path, edit, message):
    data = json.loads((artifacts / "config.json").read_text())
    edit(data)
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(ArtifactError) as error:
        production_config(load_config(tmp_path))
    assert message in str(error.value)


def test_a_hashed_table_too_small_for_the_hashes_is_refused(artifacts, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(artifacts, copy)
    np.savez(copy / EMB_TABLE_FILE, emb_table=np.zeros((64, 16), np.float32))
    with pytest.raises(
        ArtifactError, match=r"'emb_table' has shape \(64, 16\), expected \[at least"
    ):
        load_production_ranker(copy)


def test_an_x_checkpoints_training_config_maps_onto_the_rankers_fields():
    run = DATA_DIR / "xai_checkpoint" / "home_direct_packed_nano_offline_kafka_dump"
    training = json.loads(next(run.rglob("config.json")).read_text())
    with pytest.raises(ValueError, match="2 \\+ 14 = 16\\) must fill whole attention blocks"):
        production_config_from_xai(training)
    config = production_config_from_xai(training, ["history_seq_len=30", "attention_block=32"])
    assert (config.emb_size, config.num_layers, config.key_size) == (16, 2, 64)
    assert (config.num_q_heads, config.num_kv_heads, config.sid_embed_dim) == (2, 1, 8)
    assert (config.emb_table_width, config.candidate_seq_len) == (32, 4)
    assert config.hashes.user_table_size == 100_000 and config.attention_keys == "serving_kernel"


# -- the host's half of the engine -------------------------------------------------------------


def request(history: int, candidates: int, production: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    posts = rng.integers(1, 2**62, history + candidates)
    user = {
        "user_id": int(rng.integers(1, 2**62)),
        "history_post_ids": posts[:history].tolist(),
        "history_author_ids": rng.integers(1, 2**40, history).tolist(),
        "history_actions": (rng.random((history, 64)) < 0.1).astype(int).tolist(),
        "history_product_surface": rng.integers(0, 16, history).tolist(),
        "history_dwell_seconds": rng.exponential(5, history).tolist(),
        "candidate_post_ids": posts[history:].tolist(),
        "candidate_author_ids": rng.integers(1, 2**40, candidates).tolist(),
    }
    if production:
        ages = [-1.0, 3600.0, float(STALE_AFTER_S + 5)] + [60.0] * (candidates - 3)
        user.update({
            "candidate_post_age_seconds": ages[:candidates],
            "history_semantic_ids": post_semantic_ids(posts[:history]).tolist(),
            "history_impression_time": [REFERENCE_TIME - 100] * history,
            "history_timezone": [7] * history,
            "timezone": 12, "country": 4, "installed_apps": [1, 0] * 32, "age_years": 33.0,
        })  # fmt: skip
    return parse(RankerRequest, ranker_inputs(user), _CONFIG)


class _Config:  # what the request checks read of an artifact config
    num_actions, emb_size, product_surface_vocab_size, history_seq_len = 64, 32, 16, 30


_CONFIG = _Config()
TINY = apply_overrides(NANO, list(TINY_OVERRIDES))  # the tiny preset's ranker


def test_a_padded_batch_becomes_xs_batch_hashed_as_x_hashes():
    with_features, without = request(5, 4, True, seed=1), request(3, 2, False, seed=2)
    batch = pad_batch([with_features, without], 4, batch_widths(_CONFIG, 16))
    user = user_features(batch, TINY)
    history = history_sequence(batch, TINY)
    candidates = candidate_sequence(batch, TINY)
    ids = batch.user_id
    np.testing.assert_array_equal(user.hashes, hash_user_ids(ids, TINY.hashes))
    assert (user.hashes[2:] == 0).all()  # padding rows: no user
    np.testing.assert_array_equal(
        history.post_hashes, hash_item_ids(batch.history_post_ids, TINY.hashes)
    )
    np.testing.assert_array_equal(
        candidates.author_hashes, hash_author_ids(batch.candidate_author_ids, TINY.hashes)
    )
    assert history.post_hashes.shape == (4, 30, 2) and candidates.post_hashes.shape == (4, 16, 2)
    # the profile where sent, X's unknown (0) where not
    assert user.country.tolist() == [4, 0, 0, 0] and user.installed_apps[0, :4].tolist() == [
        True, False, True, False
    ]  # fmt: skip
    assert history.timezone[0, :5].tolist() == [7] * 5 and (history.timezone[1] == 0).all()
    np.testing.assert_array_equal(
        history.semantic_ids[0, :5], post_semantic_ids(batch.history_post_ids[0, :5])
    )
    assert history.actions.dtype == bool and history.actions.shape == (4, 30, 64)
    # ages: unknown (negative), an hour, past 14 days (stale); a request without ages: unknown
    assert candidates.impression_time[0, :3].tolist() == [0, REFERENCE_TIME, REFERENCE_TIME]
    assert candidates.creation_time[0, 1] == REFERENCE_TIME - 3600
    assert candidates.stale[0, :4].tolist() == [False, False, True, False]
    assert (candidates.impression_time[1] == 0).all() and not candidates.stale[1].any()
    # candidates' timezone: the home one where none is sent; padding none
    assert candidates.timezone[0, :4].tolist() == [12] * 4 and candidates.timezone[0, 4] == 0
    assert (candidates.timezone[1] == 0).all()


@pytest.mark.parametrize(
    "candidates, expected", [(1, 16), (16, 16), (17, 64), (64, 64), (65, 128), (1000, 1024)]
)
def test_wide_candidate_lists_pad_to_whole_chunks(candidates, expected):
    config = dataclasses.replace(TINY, candidate_seq_len=64)
    ranker = ProductionBatchRanker(
        config,
        init_params(config, 0, table_rows=config.hashes.num_rows),
        np.ones(64, np.float32),
        batch_buckets=(1, 2, 4, 8),
        candidate_buckets=(16, 64, 256, 512, 1024),
    )
    assert ranker.candidate_buckets == (16, 64)  # compiled: nothing wider than a chunk
    assert ranker.padded_shape(3, candidates) == (4, expected)


def test_semantic_ids_by_post_id_are_stable_and_in_range():
    ids = np.array([0, 1, 2**62, -5])
    codes = post_semantic_ids(ids)
    assert codes.shape == (4, 6) and (codes[0] == 0).all()
    assert ((codes[1:] >= 1) & (codes[1:] <= 256)).all()
    np.testing.assert_array_equal(codes, post_semantic_ids(ids))


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("history_timezone", [40], "'history_timezone' values must lie in [0, 31], found 40"),
        ("history_semantic_ids", [[1, 2, 3]], "'history_semantic_ids' needs lists of 6 values"),
        ("country", 1.5, "'country' values must be an integer, found 1.5"),
        ("installed_apps", [2] * 64, "'installed_apps' values must lie in [0, 1], found 2"),
        ("candidate_hour_of_day", [1, 2], "lengths differ between"),
    ],
)
def test_a_request_file_with_a_bad_feature_is_refused_by_name(artifacts, key, value, message):
    from phoenix.checkpoint import ExampleSequence, load_example_sequence

    data = load_example_sequence(artifacts).to_dict()
    if key.startswith("history_") and not isinstance(value[0], list):
        value = value * len(data["history_post_ids"])
    if key == "history_semantic_ids":
        value = value * len(data["history_post_ids"])
    data[key] = value
    with pytest.raises(ArtifactError) as error:
        ExampleSequence.from_dict(data, "user.json")
    assert message in str(error.value)
    assert str(error.value).startswith("user.json: ")
