"""Reloading served models with changed parameters (phoenix/ops/reload.py), against a fake
server that keeps each model's config: a corpus switch moves every loaded model whose contract
reads the corpus, and keeps their other parameters."""

from __future__ import annotations

import json

import pytest

from phoenix.ops.configs import REPOSITORY
from phoenix.ops.reload import reload_model, reload_with_chains, switch_corpus
from phoenix.schema.served import CONTRACTS, CORPUS_READERS


class FakeServer:
    """The load API of a server with explicit model control (HTTP client's JSON configs)."""

    def __init__(self, loaded, refuse=()):
        self.configs = {
            model: {"name": model, "parameters": {"artifact_dir": {"string_value": "a"}}}
            for model in loaded
        }
        for model, config in self.configs.items():
            if "corpus_file" in CONTRACTS[model].parameter_names:
                config["parameters"]["corpus_file"] = {"string_value": "corpus.npz"}
        self.refuse = set(refuse)
        self.loads = []

    def get_model_config(self, model):
        return json.loads(json.dumps(self.configs[model]))

    def is_model_ready(self, model):
        return model in self.configs

    def load_model(self, model, headers=None, config=None):
        if model in self.refuse:
            raise RuntimeError(f"load of {model} refused")
        self.loads.append((model, headers))
        self.configs[model] = json.loads(config)

    def corpus_of(self, model):
        return self.configs[model]["parameters"]["corpus_file"]["string_value"]


CORPUS_KEY = 'key: "corpus_file"'


def test_the_corpus_readers_are_the_models_declaring_corpus_file():
    assert set(CORPUS_READERS) == {"user_state", "retriever", "feed_policy", "recommend_chain"}
    # the generated configs carry the parameter a switch rewrites, and no other model's does
    carrying = {
        c.parent.name for c in REPOSITORY.glob("*/config.pbtxt") if CORPUS_KEY in c.read_text()
    }
    assert carrying == set(CORPUS_READERS)


def test_a_corpus_switch_moves_every_loaded_reader_and_keeps_the_other_parameters():
    server = FakeServer(["user_encoder", "retriever", "ranker", "feed_policy"])
    assert switch_corpus(server, "http", "store", "key") == ["retriever", "feed_policy"]
    assert server.corpus_of("retriever") == server.corpus_of("feed_policy") == "store"
    assert [model for model, _ in server.loads] == ["retriever", "feed_policy"]
    assert all(headers for _, headers in server.loads)  # the admin key went along
    assert server.configs["feed_policy"]["parameters"]["artifact_dir"] == {"string_value": "a"}
    assert "corpus_file" not in server.configs["ranker"]["parameters"]  # never loaded again


def test_a_reader_the_server_has_not_loaded_is_left_alone():
    server = FakeServer(["user_encoder", "retriever"])
    assert switch_corpus(server, "http", "store", None) == ["retriever"]
    assert "feed_policy" not in server.configs


def test_a_server_without_readers_and_a_half_switch_are_named():
    with pytest.raises(RuntimeError, match="none of"):
        switch_corpus(FakeServer(["ranker"]), "http", "store", None)
    server = FakeServer(["retriever", "feed_policy"], refuse=["feed_policy"])
    with pytest.raises(RuntimeError, match="retriever now serve 'store' but reloading feed_"):
        switch_corpus(server, "http", "store", None)
    refused = FakeServer(["retriever", "feed_policy"], refuse=["retriever"])
    with pytest.raises(RuntimeError, match="serves what it served"):
        switch_corpus(refused, "http", "store", None)
    assert refused.corpus_of("feed_policy") == "corpus.npz"


def test_a_load_the_server_does_not_report_is_an_error():
    server = FakeServer(["feed_policy"])
    server.load_model = lambda model, headers=None, config=None: None  # accepted, not applied
    with pytest.raises(RuntimeError, match="after the load feed_policy serves"):
        reload_model(server, "http", "feed_policy", {"corpus_file": "store"}, None)


def test_a_policy_change_moves_recommends_chain_with_it():
    """recommend runs its own policy stage: a change to feed_policy is made in the chain too,
    under the chain's names, and only what changed is sent there."""
    server = FakeServer(["feed_policy", "recommend_chain"])
    server.configs["feed_policy"]["parameters"]["author_diversity_floor"] = {"string_value": "0.1"}
    changes = {"author_diversity_floor": "0.5", "artifact_dir": "a"}  # artifact_dir as served
    done = reload_with_chains(server, "http", "feed_policy", changes, "key")
    assert done == ["feed_policy", "recommend_chain"]
    chain = server.configs["recommend_chain"]["parameters"]
    assert chain["feed_policy.author_diversity_floor"] == {"string_value": "0.5"}
    assert chain["artifact_dir"] == {"string_value": "a"} and "author_diversity_floor" not in chain
    alone = FakeServer(["feed_policy"])  # no chain loaded: the model alone
    assert reload_with_chains(alone, "http", "feed_policy", changes, None) == ["feed_policy"]


def test_a_chain_that_refuses_the_change_is_named():
    server = FakeServer(["feed_policy", "recommend_chain"], refuse=["recommend_chain"])
    with pytest.raises(RuntimeError, match="feed_policy now serve the change but reloading rec"):
        reload_with_chains(server, "http", "feed_policy", {"negative_scores_offset": "0.2"}, None)
    refused = FakeServer(["feed_policy", "recommend_chain"], refuse=["feed_policy"])
    with pytest.raises(RuntimeError, match="serves what it served"):
        reload_with_chains(refused, "http", "feed_policy", {"negative_scores_offset": "0.2"}, None)
