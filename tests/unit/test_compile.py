"""phoenix-compile builds what the instances load: the same settings as the generated configs,
every program once, then nothing until something changes."""

from __future__ import annotations

import pytest

from phoenix.artifacts import generate
from phoenix.engine.programs import ProgramStore
from phoenix.ops import compile as compile_cli
from phoenix.ops.configs import REPOSITORY, read_config
from phoenix.ops.profiles import PROFILES
from phoenix.stub.services.catalog import SERVED_BY_SERVICES


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=5, corpus_size=64)
    return out


@pytest.mark.parametrize("device", sorted(PROFILES))
@pytest.mark.parametrize("model", sorted(SERVED_BY_SERVICES))
def test_compiled_settings_are_the_generated_configs(tiny, model, device):
    """An instance reads its config file; phoenix-compile must build the very same programs."""
    settings = compile_cli.service_settings(model, tiny, device)
    config = read_config(REPOSITORY / PROFILES[device].config_path(model))
    assert settings.max_batch_size == config.max_batch_size
    assert settings.parameter_texts == {k: v.string_value for k, v in config.parameters.items()}


def test_a_second_run_is_up_to_date_and_force_loads_everything(tiny, capsys):
    run = ["--artifacts", str(tiny), "--models", "candidate_tower,retriever"]  # the quick ones
    ProgramStore.forget_open()
    assert compile_cli.main(run) == 0
    first = [line for line in capsys.readouterr().out.splitlines() if "loaded" in line]
    assert len(first) == 2 and all(" 0 loaded" in row for row in first), first
    assert compile_cli.main(run) == 0
    assert "programs up to date" in capsys.readouterr().out
    ProgramStore.forget_open()
    assert compile_cli.main([*run, "--force"]) == 0
    again = [line for line in capsys.readouterr().out.splitlines() if "loaded" in line]
    assert len(again) == 2 and all(" 0 compiled" in row for row in again), again


def test_a_build_under_first_use_loading_makes_every_entry_and_repairs_a_bad_one(
    tiny, capsys, monkeypatch
):
    """$PHOENIX_PROGRAM_LOADING=first-use does not reach a build: --force makes every stored
    executable, so one XLA refuses is compiled and stored again here, not on a request."""
    import pickle

    run = ["--artifacts", str(tiny), "--models", "candidate_tower"]
    ProgramStore.forget_open()
    assert compile_cli.main(run) == 0
    (path,) = ProgramStore.beside(tiny).directory.glob("candidate_tower-*.xla")
    entry = pickle.loads(path.read_bytes())
    entry["executable"] = (b"not an executable", *entry["executable"][1:])
    path.write_bytes(pickle.dumps(entry))
    capsys.readouterr()
    monkeypatch.setenv("PHOENIX_PROGRAM_LOADING", "first-use")
    ProgramStore.forget_open()
    assert compile_cli.main([*run, "--force"]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if "loaded" in line]
    assert " 1 compiled" in row, row
    assert pickle.loads(path.read_bytes())["executable"][0] != b"not an executable"
    ProgramStore.forget_open()


def test_unknown_models_and_missing_artifacts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        compile_cli.main(["--models", "nope"])
    assert "unknown models ['nope']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        compile_cli.main(["--artifacts", str(tmp_path)])
    assert "has no config.json" in capsys.readouterr().err


def test_a_repositorys_configs_decide_what_is_compiled(tiny, tmp_path, capsys):
    """--model-repository: the settings of that repository's config files (here the ranker
    with its prefix cache off, as the serving benchmark serves it), its models by default."""
    from phoenix.ops.configs import write_repository
    from phoenix.ops.profiles import profile
    from phoenix.schema.contracts import RANKER

    variant = profile("cpu").with_parameters(RANKER.name, {"prefix_cache_mib": 0})
    repository = write_repository(tmp_path / "repository", variant)
    settings = compile_cli.service_settings("ranker", tiny, "cpu", repository)
    assert settings.parameter_texts["prefix_cache_mib"] == "0"
    assert (
        compile_cli.service_settings("ranker", tiny, "cpu").parameter_texts["prefix_cache_mib"]
        != "0"
    )  # the profile's: the cache on
    args = compile_cli.parse_args(["--artifacts", str(tiny), "--model-repository", str(repository)])
    assert args.models == [m for m in SERVED_BY_SERVICES if (repository / m).is_dir()]

    (repository / "retriever" / "config.pbtxt").write_text("max_batch_size: [")
    run = ["--artifacts", str(tiny), "--model-repository", str(repository), "--models", "retriever"]
    assert compile_cli.main(run) == 2
    err = capsys.readouterr().err
    assert f"error: {repository / 'retriever' / 'config.pbtxt'}: " in err


def test_a_model_repository_that_is_not_a_folder_is_refused(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        compile_cli.parse_args(
            ["--artifacts", str(tiny), "--model-repository", str(tmp_path / "x")]
        )
    assert stopped.value.code == 2
    assert f"--model-repository {tmp_path / 'x'}: not a folder" in capsys.readouterr().err
