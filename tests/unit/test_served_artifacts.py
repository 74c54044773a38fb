"""Which artifacts a server serves (phoenix/client/served_artifacts.py,
phoenix/ops/served_repository.py), without a server: the served repository's configs name
them truthfully, and a client's artifacts are chosen or refused against what a server states."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from phoenix.checkpoint import TABLES_FILE
from phoenix.checkpoint.identity import ArtifactMismatch, artifact_version, config_digest
from phoenix.client.served_artifacts import ServedArtifacts, choose_artifacts, served_artifacts
from phoenix.ops.configs import REPOSITORY, read_config
from phoenix.ops.served_repository import write_served_repository
from phoenix.schema.served import CONTRACTS
from phoenix.stub.triton_adapter import check_loaded

TRAINED_DEMO_CONFIG = Path(__file__).resolve().parents[2] / "artifacts/trained-demo/config.json"


def fake_artifacts(path: Path, num_layers: int) -> Path:
    """An artifact directory as far as its identity goes: a config.json (the trained demo's,
    with ``num_layers`` and no version label: named by its content)."""
    path.mkdir(parents=True)
    config = json.loads(TRAINED_DEMO_CONFIG.read_text())
    config.pop("version", None)
    (path / "config.json").write_text(json.dumps({**config, "num_layers": num_layers}))
    return path


@pytest.fixture
def one(tmp_path):
    return fake_artifacts(tmp_path / "one", 2)


@pytest.fixture
def other(tmp_path):
    return fake_artifacts(tmp_path / "other", 3)


def test_the_config_digest_is_the_sha256_of_config_json(one, other):
    expected = hashlib.sha256((one / "config.json").read_bytes()).hexdigest()
    assert config_digest(one) == expected
    assert config_digest(other) != expected
    shutil.copy(one / "config.json", other / "config.json")
    assert config_digest(other) == expected  # the config's identity, not the folder's


def test_the_served_repository_names_the_artifacts_in_every_config(tmp_path, one):
    dest = write_served_repository(REPOSITORY, tmp_path / "served", one)
    digest, version = config_digest(one), artifact_version(one)
    assert version.startswith("sha256-")  # no "version" in its config.json: named by content
    for name, contract in CONTRACTS.items():
        files = [dest / name / "config.pbtxt", *sorted((dest / name / "configs").glob("*.pbtxt"))]
        for path in files:
            config = read_config(path)
            original = read_config(REPOSITORY / path.relative_to(dest))
            parameters = {k: v.string_value for k, v in config.parameters.items()}
            if contract.is_ensemble:
                assert config == original
                continue
            assert parameters["artifact_dir"] == str(one.resolve())
            assert parameters["config_digest"] == digest
            assert parameters["artifact_version"] == version
            # everything else as committed
            for key in ("artifact_dir", "artifact_version", "config_digest"):
                del config.parameters[key], original.parameters[key]
            assert config == original, path
    # every other file (the model code) is served as committed
    committed = {
        path.relative_to(REPOSITORY): path.read_bytes()
        for path in REPOSITORY.rglob("*")
        if path.is_file() and path.suffix == ".py" and "__pycache__" not in path.parts
    }
    assert committed and all((dest / p).read_bytes() == text for p, text in committed.items())
    # the committed configs do not say which artifacts (relative default, no version, no digest)
    as_committed = read_config(REPOSITORY / "ranker" / "config.pbtxt").parameters
    assert as_committed["config_digest"].string_value == ""
    assert as_committed["artifact_version"].string_value == ""


def test_a_model_refuses_to_start_on_artifacts_its_config_does_not_state(one, other):
    stated = {"artifact_dir": str(one), "config_digest": config_digest(one)}
    assert check_loaded(stated, one) == artifact_version(one)  # what its metrics are labelled
    check_loaded({"artifact_dir": "../../artifacts/demo", "config_digest": ""}, other)
    with pytest.raises(ArtifactMismatch, match=f"{other}"):
        check_loaded(stated, other)


def test_a_model_refuses_to_start_on_another_version_of_the_same_config(one, tmp_path):
    """Retrained weights keep the config digest: the stated version label tells them apart."""
    retrained = Path(shutil.copytree(one, tmp_path / "retrained"))
    (retrained / TABLES_FILE).write_bytes(b"retrained tables")
    stated = {"artifact_dir": str(one), "artifact_version": artifact_version(one),
              "config_digest": config_digest(one)}  # fmt: skip
    assert config_digest(retrained) == config_digest(one)
    with pytest.raises(ArtifactMismatch, match=f"is version {artifact_version(retrained)}"):
        check_loaded(stated, retrained)


def test_a_client_without_artifacts_uses_the_served_ones(one, tmp_path):
    served = ServedArtifacts(str(one), config_digest(one))
    assert choose_artifacts(None, served, fallback=tmp_path / "demo") == one
    # a server whose configs do not say: the default
    unsaid = ServedArtifacts("../../artifacts/demo", "")
    assert choose_artifacts(None, unsaid, fallback=tmp_path / "demo") == tmp_path / "demo"


def test_a_client_with_other_artifacts_is_refused_naming_both(one, other, tmp_path):
    served = ServedArtifacts(str(one), config_digest(one))
    assert choose_artifacts(one, served, fallback=tmp_path) == one
    with pytest.raises(ArtifactMismatch) as refused:
        choose_artifacts(other, served, fallback=tmp_path)
    message = str(refused.value)
    assert str(one) in message and str(other) in message
    assert config_digest(one)[:12] in message and config_digest(other)[:12] in message
    # a server that does not say cannot refuse
    assert choose_artifacts(other, ServedArtifacts("x", ""), fallback=tmp_path) == other


def test_served_artifacts_this_machine_lacks_or_changed_are_refused(one, tmp_path):
    missing = ServedArtifacts(str(tmp_path / "elsewhere"), "ab" * 32)
    with pytest.raises(ArtifactMismatch, match="does not have"):
        choose_artifacts(None, missing, fallback=tmp_path)
    changed = ServedArtifacts(str(one), "ab" * 32)
    with pytest.raises(ArtifactMismatch, match="changed since"):
        choose_artifacts(None, changed, fallback=tmp_path)


class FakeClient:
    """tritonclient's HTTP client as far as get_model_config goes."""

    def __init__(self, configs):
        self.configs, self.asked = configs, []

    def get_model_config(self, model):
        self.asked.append(model)
        if model not in self.configs:
            raise RuntimeError(f"{model} is not loaded")
        return self.configs[model]


def test_the_served_artifacts_are_read_from_the_first_loaded_model():
    parameters = {"artifact_dir": {"string_value": "/a"}, "config_digest": {"string_value": "d"}}
    client = FakeClient({"ranker": {"parameters": parameters}})
    assert served_artifacts(client, "http") == ServedArtifacts("/a", "d")
    assert client.asked[-1] == "ranker"
    with pytest.raises(RuntimeError, match="not loaded"):
        served_artifacts(FakeClient({}), "http")
