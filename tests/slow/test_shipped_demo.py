"""The demo's trained towers shipped in artifacts/trained-demo: they load, reproduce the
evaluation recorded in their training.json on the demo preset's held-out day, and meet the
offline-evaluation targets (`make train TRAIN_PRESET=demo` trains them again).

The logs are generated again from the preset and seed (about 8 s), never read from a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from phoenix.checkpoint import load_artifacts, load_config, load_corpus
from phoenix.training.data import LogIndex
from phoenix.training.evaluate import Evaluator
from phoenix.training.presets import PRESETS
from phoenix.training.report import targets
from phoenix.world import synthetic

SHIPPED = Path(__file__).resolve().parents[2] / "artifacts" / "trained-demo"


@pytest.fixture(scope="module")
def shipped():
    summary = json.loads((SHIPPED / "training.json").read_text())
    config = load_config(SHIPPED)
    loaded = load_artifacts(SHIPPED)
    preset = PRESETS[summary["preset"]]
    world, impressions = synthetic.generate_logs(preset.world, summary["seed"])
    index = LogIndex(world, impressions, config)
    eval_set = index.eval_set(preset.eval_users, preset.eval_candidates, summary["seed"])
    params = {
        "ranker": loaded.ranker_params,
        "retrieval": loaded.retrieval_params,
        "tables": {e: loaded.tables[f"{e}_embeddings"] for e in ("user", "item", "author")},
    }
    evaluator = Evaluator(index, eval_set, config, summary["score_weights"])
    return summary, config, params, evaluator, world


def test_the_shipped_towers_are_the_demo_preset(shipped):
    summary, config, *_ = shipped
    assert (summary["preset"], summary["seed"]) == ("demo", 0)
    assert config == PRESETS["demo"].config(0)


def test_the_shipped_towers_reproduce_their_evaluation_and_meet_the_targets(shipped):
    summary, _, params, evaluator, _ = shipped
    metrics = evaluator.model_metrics(params)
    recorded = summary["evaluation"]["trained"]
    assert metrics["recall@50"] == pytest.approx(recorded["recall@50"], abs=1e-4)
    for action, value in recorded["auc"].items():
        assert metrics["auc"][action] == pytest.approx(value, abs=1e-4), action
    checks = targets({**summary["evaluation"], "trained": metrics})
    failed = [text for text, ok in checks if not ok]
    assert not failed, failed


def test_the_shipped_corpus_is_the_trained_candidate_tower_of_the_recent_posts(shipped):
    _, config, params, evaluator, world = shipped
    corpus = load_corpus(SHIPPED, config)
    np.testing.assert_array_equal(world.post_ids[evaluator.corpus], corpus.post_ids)
    np.testing.assert_allclose(evaluator.corpus_vectors(params), corpus.embeddings, atol=1e-5)
