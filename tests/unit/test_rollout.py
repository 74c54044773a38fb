"""The pure parts of a rollout (phoenix.ops.rollout, rank_agreement): the gate, the rank
agreement maths, and the config rewriting the switch and the shadow ensembles rest on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import json_format
from scipy import stats

from phoenix.checkpoint import TABLES_FILE
from phoenix.checkpoint.identity import artifact_version
from phoenix.client.rank_agreement import compare_rankings, kendall_tau, spearman_rho, summarize
from phoenix.ops import model_control, rollout
from phoenix.ops.configs import read_config
from tests.integration.conftest import MODEL_REPOSITORY


def served_json(model: str) -> dict:
    """A committed config in the JSON form the server answers."""
    return json_format.MessageToDict(
        read_config(MODEL_REPOSITORY / model / "config.pbtxt"), preserving_proto_field_name=True
    )


# -- the gate ------------------------------------------------------------------------------


def test_a_missing_gate_is_allowed_with_a_warning(tmp_path):
    said = []
    assert rollout.check_gate(tmp_path, force=False, say=said.append) is None
    assert "gate.json does not exist" in said[0]


def test_a_failed_gate_refuses_unless_forced(tmp_path):
    gate = {  # as phoenix.training.gate writes it
        "passed": False,
        "metric": "ndcg@20",
        "rule": "ndcg@20 of the new version >= the old one's - 0.01",
        "candidate": {"ndcg@20": 0.21},
        "baseline": {"ndcg@20": 0.257},
    }
    (tmp_path / "gate.json").write_text(json.dumps(gate))
    refusal = r"failed its offline gate.*baseline.*0\.257.*candidate.*0\.21.*--force"
    with pytest.raises(rollout.GateRefused, match=refusal):
        rollout.check_gate(tmp_path, force=False, say=print)
    said = []
    assert rollout.check_gate(tmp_path, force=True, say=said.append) == gate
    assert "forced" in said[0]


def test_a_passed_gate_says_nothing(tmp_path):
    (tmp_path / "gate.json").write_text('{"passed": true, "metrics": {}}')
    said = []
    assert rollout.check_gate(tmp_path, force=False, say=said.append)["passed"] is True
    assert said == []


@pytest.mark.parametrize("text", ["{not json", '{"passed": "no"}', "[true]"])
def test_a_malformed_gate_is_an_error_naming_the_file(tmp_path, text):
    (tmp_path / "gate.json").write_text(text)
    with pytest.raises(rollout.RolloutError, match=str(tmp_path / "gate.json")):
        rollout.check_gate(tmp_path, force=True, say=print)


# -- rank agreement ------------------------------------------------------------------------


def test_tau_and_rho_agree_with_scipy_ties_included():
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 6, 15).astype(float)  # ties on purpose
        b = a + rng.normal(0, 2, 15)
        assert kendall_tau(a, b) == pytest.approx(stats.kendalltau(a, b).statistic)
        assert spearman_rho(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)


def test_the_same_ranking_agrees_fully_and_a_reversed_one_not_at_all():
    ids, scores = [5, 4, 3, 2], [0.9, 0.5, 0.2, 0.1]
    same = compare_rankings(ids, scores, ids, scores)
    assert same["top_k_overlap"] == 1.0 and same["kendall_tau"] == 1.0
    assert same["max_abs_score_delta"] == 0.0
    reversed_ = compare_rankings(ids, scores, ids[::-1], scores)
    assert reversed_["kendall_tau"] == -1.0 and reversed_["spearman_rho"] == pytest.approx(-1.0)


def test_rankings_of_different_posts_compare_over_the_common_ones():
    result = compare_rankings(
        [1, 2, 3, 4], [4.0, 3.0, 2.0, 1.0], [2, 9, 1, 8], [5.0, 4.0, 3.0, 0.0]
    )
    assert result["common"] == 2 and result["top_k_overlap"] == 0.5
    assert result["kendall_tau"] == -1.0  # post 1 above 2 in A, below it in B
    assert result["mean_score_delta"] == pytest.approx(((3.0 - 4.0) + (5.0 - 3.0)) / 2)
    summary = summarize([result, compare_rankings([1], [1.0], [1], [1.0])])
    assert summary["requests"] == 2 and summary["kendall_tau"] == -1.0  # nan left out


# -- configs -------------------------------------------------------------------------------


def test_retargeted_changes_only_the_artifacts_and_the_name(tmp_path):
    ranker = served_json("ranker")
    stated = {"artifact_dir": str(tmp_path), "artifact_version": "v2", "config_digest": "ab" * 32}
    new = model_control.retargeted(ranker, stated)
    assert {key: model_control.parameter(new, key) for key in stated} == stated
    assert model_control.parameter(ranker, "artifact_dir") == "../../artifacts/demo"  # a copy
    for key in set(ranker) - {"parameters"}:
        assert new[key] == ranker[key]
    assert set(new["parameters"]) == set(ranker["parameters"])


def test_a_renamed_config_leaves_triton_to_name_its_instances():
    config = {"name": "ranker", "instance_group": [{"name": "ranker_0", "count": 2}]}
    assert model_control.renamed(config, "ranker__next") == {
        "name": "ranker__next",
        "instance_group": [{"count": 2}],
    }
    assert config["instance_group"][0]["name"] == "ranker_0"


def test_the_switch_renames_the_steps_it_is_given():
    recommend = served_json("recommend")
    switched = model_control.with_step_models(
        recommend, {"recommend_chain": "recommend_chain__next"}
    )
    assert model_control.step_models(switched) == ["recommend_chain__next"]
    assert switched["name"] == "recommend" and model_control.step_models(recommend) == [
        "recommend_chain"
    ]


def test_a_shadow_loads_the_chain_and_the_rolled_ranker_beside_and_asks_for_no_record():
    served = {m: served_json(m) for m in ("recommend", "recommend_chain", "ranker", "retriever")}
    plan = rollout.Plan(served, {m: dict(c) for m, c in served.items()})
    assert plan.steps == ["recommend_chain"]
    assert plan.shadowed == ["recommend_chain", "ranker"]
    without_ranker = {m: c for m, c in served.items() if m != "ranker"}
    assert rollout.Plan(without_ranker, without_ranker).shadowed == ["recommend_chain"]
    assert rollout.QUIET["record"].tolist() == [[0]]  # the chain's side effects off


def test_a_model_folder_holds_its_config_the_services_model_file_and_bytecode(tmp_path):
    from tritonclient.grpc import model_config_pb2

    served_file = MODEL_REPOSITORY / "ranker" / "1" / "model.py"
    (tmp_path / "ranker" / "1").mkdir(parents=True)
    shutil.copyfile(served_file, tmp_path / "ranker" / "1" / "model.py")
    config = model_control.renamed(served_json("ranker"), "ranker__next")
    folder = model_control.write_model_folder(tmp_path, "ranker", config)
    written = read_config(folder / "config.pbtxt")
    assert isinstance(written, model_config_pb2.ModelConfig) and written.name == "ranker__next"
    # the ranker's own entry point, byte for byte: the service it runs is named in the file
    assert (folder / "1" / "model.py").read_bytes() == served_file.read_bytes()
    assert 'service_name = "ranker"' in served_file.read_text()
    assert list((folder / "1" / "__pycache__").glob("model.*.pyc"))


def test_the_shadow_metrics_are_prometheus_gauges():
    report = {
        "previous": {"version": "1"},
        "target": {"version": "2"},
        "shadow": {"recommend": {"kendall_tau": 0.5, "requests": 3}, "ranker": None},
    }
    text = rollout.shadow_metrics(report)
    labels = 'compared="recommend",from_version="1",to_version="2"'
    line = f"phoenix_rollout_shadow_kendall_tau{{{labels}}} 0.5"
    assert line in text.splitlines()


def test_the_command_refuses_a_failed_gate_before_it_touches_the_server(tmp_path, capsys):
    from clients import rollout as command

    (tmp_path / "gate.json").write_text('{"passed": false, "metrics": {"auc": 0.5}}')
    url = "127.0.0.1:9"  # nothing listens: the refusal comes first
    status = command.main([str(tmp_path), "--url", url, "--repository", str(tmp_path)])
    assert status != 0
    assert "failed its offline gate" in capsys.readouterr().err


def test_the_command_names_a_missing_repository(tmp_path, capsys):
    from clients import rollout as command

    missing = tmp_path / "nowhere"
    assert command.main([str(tmp_path), "--repository", str(missing)]) != 0
    assert f"{missing} is no folder here" in capsys.readouterr().err


# -- one label per version -----------------------------------------------------------------

TRAINED_DEMO_CONFIG = MODEL_REPOSITORY.parent / "artifacts" / "trained-demo" / "config.json"


def artifacts_labelled(path, version=None, tables: bytes = b"tables"):
    """An artifact directory as far as its identity goes: a config.json (``version`` when
    given) and the tables its content label covers."""
    path.mkdir(parents=True)
    config = {
        k: v for k, v in json.loads(TRAINED_DEMO_CONFIG.read_text()).items() if k != "version"
    }
    (path / "config.json").write_text(
        json.dumps({**config, **({"version": version} if version else {})})
    )
    (path / TABLES_FILE).write_bytes(tables)
    return path


def served_description(directory) -> dict:
    """``describe`` of configs serving ``directory`` (stating its version label)."""
    stated = {"artifact_dir": str(directory), "artifact_version": artifact_version(directory)}
    return rollout.describe({"ranker": model_control.retargeted(served_json("ranker"), stated)})


def test_the_served_version_is_the_label_its_configs_state(tmp_path):
    ranker = served_json("ranker")
    stated = model_control.retargeted(ranker, {"artifact_dir": "/a/v7", "artifact_version": "7"})
    assert rollout.describe({"recommend": served_json("recommend"), "ranker": stated}) == {
        "artifact_dir": "/a/v7",
        "version": "7",
    }
    unstated = model_control.retargeted(ranker, {"artifact_dir": str(tmp_path / "gone")})
    assert rollout.describe({"ranker": unstated})["version"] == "unknown"  # not readable here


def test_a_copy_of_the_served_artifacts_is_refused_unless_forced(tmp_path):
    served = artifacts_labelled(tmp_path / "v1")
    copy = Path(shutil.copytree(served, tmp_path / "v2"))
    label = artifact_version(copy)
    assert label == artifact_version(served) and label.startswith("sha256-")
    with pytest.raises(rollout.SameVersion) as refused:
        rollout.check_new_version(served_description(served), copy, label, False, print)
    message = str(refused.value)
    for part in (str(copy), label, str(served), "same content", "--force", "nothing was loaded"):
        assert part in message, message
    said = []
    rollout.check_new_version(served_description(served), copy, label, True, said.append)
    assert said[0].startswith("warning: ") and said[0].endswith("; forced")


def test_a_new_version_under_the_served_label_is_refused_and_another_one_passes(tmp_path):
    served = artifacts_labelled(tmp_path / "v1", version="2025-06")
    relabelled = artifacts_labelled(tmp_path / "v2", version="2025-06", tables=b"retrained")
    with pytest.raises(rollout.SameVersion, match='same "version" in config.json'):
        rollout.check_new_version(served_description(served), relabelled, "2025-06", False, print)
    said = []
    for new in (artifacts_labelled(tmp_path / "v3", version="2025-07"),
                artifacts_labelled(tmp_path / "v4", tables=b"retrained")):  # fmt: skip
        rollout.check_new_version(
            served_description(served), new, artifact_version(new), False, said.append
        )
    assert said == []
