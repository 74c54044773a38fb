"""The training pipeline end to end: logs, both towers trained, evaluated, saved, loaded back.

In the slow tier because the tiny preset trains for real (about 40 s on a busy 2-core CPU);
the pipeline's parts (logs, metrics, optimizer phases, CLI) are unit-tested in
tests/unit/test_training.py. The trained artifacts are built once for every test process
of this code (tests/training_helpers.py), so the integration tests that serve them reuse this
run.
"""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.checkpoint import (
    flatten_params,
    load_artifacts,
    load_config,
    load_corpus,
    load_example_sequence,
)
from phoenix.config import ACTION_NAMES
from phoenix.training.data import LogIndex
from phoenix.training.evaluate import Evaluator
from phoenix.training.presets import PRESETS
from phoenix.world import logs as log_files
from tests.training_helpers import PRESET, SEED, trained_tiny


@pytest.fixture(scope="module")
def trained():
    return trained_tiny()


def test_training_lowers_the_loss_and_beats_random_weights(trained):
    _, _, summary = trained
    for tower in ("retrieval", "ranker"):
        curve = summary["curves"][tower]["eval"][tower]  # held-out loss
        assert curve[-1] < 0.9 * curve[0], (tower, curve)
    ev = summary["evaluation"]
    trained_, random_ = ev["trained"], ev["random_weights"]
    assert trained_["recall@50"] > 2 * random_["recall@50"]
    assert trained_["recall@50"] > ev["popularity"]["recall@50"]
    for action in ("favorite", "reply", "repost"):
        assert trained_["auc"][action] > random_["auc"][action] + 0.04, action
    assert ev["ground_truth"]["recall@50"] > trained_["recall@50"]


def test_trained_checkpoint_round_trips_through_the_published_layout(trained):
    artifacts, logs, summary = trained
    config = load_config(artifacts)
    assert config.action_names == ACTION_NAMES and config.right_anchored_rope
    loaded = load_artifacts(artifacts)  # sidecars (metadata.npz, training.json) are ignored
    assert {"metadata.npz", "training.json"} <= {p.name for p in artifacts.iterdir()}
    corpus = load_corpus(artifacts, config)
    example = load_example_sequence(artifacts, config)
    assert set(example.history_post_ids).isdisjoint(example.candidate_post_ids)
    assert all(np.isfinite(v).all() for v in flatten_params(loaded.ranker_params).values())

    # the loaded weights reproduce the evaluation of the trained ones
    world, imp, _ = log_files.load_logs(logs)
    index = LogIndex(world, imp, config)
    preset = PRESETS[PRESET]
    eval_set = index.eval_set(preset.eval_users, preset.eval_candidates, SEED)
    params = {
        "ranker": loaded.ranker_params,
        "retrieval": loaded.retrieval_params,
        "tables": {e: loaded.tables[f"{e}_embeddings"] for e in ("user", "item", "author")},
    }
    evaluator = Evaluator(index, eval_set, config, summary["score_weights"])
    metrics = evaluator.model_metrics(params)
    expected = summary["evaluation"]["trained"]
    assert metrics["recall@50"] == pytest.approx(expected["recall@50"], abs=1e-6)
    assert metrics["auc"]["favorite"] == pytest.approx(expected["auc"]["favorite"], abs=1e-5)
    # the corpus holds the trained candidate tower's vectors of the held-out day's posts
    np.testing.assert_allclose(evaluator.corpus_vectors(params), corpus.embeddings, atol=1e-5)
    np.testing.assert_array_equal(world.post_ids[evaluator.corpus], corpus.post_ids)
