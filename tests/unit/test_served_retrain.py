"""The next version from served traffic: the pure parts (time split, world clock, dropped
rows, version, config check, warm start, the gate rule) and, against a real redis-server,
served feeds and engagements written through phoenix.user_state -> served-logs export ->
pipeline --init -> gate.json."""

import dataclasses

import numpy as np
import pytest

from phoenix import checkpoint
from phoenix.training.gate import GateRule, gate_result, gate_table
from phoenix.training.presets import PRESETS
from phoenix.training.retrain import (
    RetrainError,
    check_same_config,
    next_version,
    warm_start_params,
)
from phoenix.training.served_logs import TimeSplit, WorldTime, complete_rows

# -- pure parts ----------------------------------------------------------------------------


def test_the_last_fraction_of_the_time_range_is_held_out():
    split = TimeSplit.of([100.0, 130.0, 200.0, 110.0], held_out_fraction=0.25)
    assert (split.first, split.split, split.last) == (100.0, 175.0, 200.0)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(ValueError, match="held_out_fraction"):
            TimeSplit.of([1.0, 2.0], bad)
    with pytest.raises(ValueError, match="no served requests"):
        TimeSplit.of([], 0.25)


def test_served_seconds_go_onto_the_worlds_clock_from_the_first_request():
    to_world = WorldTime(origin_wall=1000.0, origin_world=5000)
    assert to_world([1000.0, 1000.9, 1061.2]).tolist() == [5000, 5000, 5061]


def test_rows_shown_before_the_history_cap_dropped_engagements_are_left_out():
    rows = {"user_id": np.array([1, 1, 2, 3]), "impression_ts": np.array([10, 20, 10, 10])}
    kept = complete_rows(rows, {1: 15.0, 2: -np.inf})  # user 3: not read, nothing dropped
    assert kept.tolist() == [False, True, True, True]


def test_the_next_version_is_one_more():
    assert next_version(None) == 2  # unversioned artifacts are version 1
    assert next_version(3) == 4
    assert next_version("7") == 8
    with pytest.raises(RetrainError, match="'2025-06'.*--version"):
        next_version("2025-06")


def test_a_config_of_other_shapes_is_refused_naming_the_keys():
    tiny = PRESETS["tiny"].config(0)
    check_same_config(tiny, dataclasses.replace(tiny, version=5), "x")  # the label aside
    with pytest.raises(RetrainError, match="emb_size.*history_seq_len|emb_size"):
        check_same_config(tiny, PRESETS["demo"].config(0), "--preset demo")
    with pytest.raises(RetrainError, match="hash_params"):
        check_same_config(tiny, PRESETS["tiny"].config(1), "--seed 1")


def test_the_warm_start_is_the_served_weights(tiny_artifacts):
    served = checkpoint.load_artifacts(tiny_artifacts)
    params = warm_start_params(served)
    for module, values in served.ranker_params.items():
        for name, value in values.items():
            np.testing.assert_array_equal(params["ranker"][module][name], value)
    for module, values in served.retrieval_params.items():
        for name, value in values.items():
            np.testing.assert_array_equal(params["retrieval"][module][name], value)
    np.testing.assert_array_equal(params["tables"]["item"], served.tables["item_embeddings"])
    assert np.isfinite(params["retrieval"]["~"]["log_temperature"])


def test_the_gate_passes_within_the_tolerance_and_fails_beyond_it():
    old = {"ndcg@20": 0.50, "auc": {"favorite": 0.7}, "log_loss": {"favorite": 0.30}}
    rule = GateRule("ndcg@20", 0.01)
    assert rule.passes({"ndcg@20": 0.495}, old)
    assert rule.passes({"ndcg@20": 0.60}, old)
    assert not rule.passes({"ndcg@20": 0.485}, old)
    assert not rule.passes({"ndcg@20": float("nan")}, old)  # nothing measured: no pass
    loss = GateRule("log_loss.favorite", 0.0)  # lower is better
    assert loss.passes({"log_loss": {"favorite": 0.29}}, old)
    assert not loss.passes({"log_loss": {"favorite": 0.31}}, old)
    gate = gate_result({"ndcg@20": 0.40}, old, rule, {"rows": 3, "from": 1, "to": 2})
    assert gate["passed"] is False and ">= baseline ndcg@20 - 0.01" in gate["rule"]
    assert "FAILED" in gate_table(gate) and "-0.1000" in gate_table(gate)
    with pytest.raises(KeyError, match="recall@7"):
        GateRule("recall@7").passes(old, old)
