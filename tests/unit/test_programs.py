"""Compiled programs stored beside the artifacts: loaded, not compiled, by a second process's
programs; a foreign or torn store is rebuilt, never loaded; a read-only one still serves."""

from __future__ import annotations

import json
import logging
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from phoenix.artifacts import generate
from phoenix.engine import programs
from phoenix.engine.programs import MANIFEST, STORE_ENV, Program, ProgramStore
from phoenix.stub.services.ranker import RankerService
from phoenix.stub.services.resources import PhoenixResources

FINGERPRINT = {"jax": jax.__version__, "device": "test", "code": "abc"}


@pytest.fixture(autouse=True)
def default_loading(monkeypatch):
    """The default, making every program at start-up, unless a test says otherwise (the suite
    runs first-use: tests/conftest.py)."""
    monkeypatch.setenv(programs.LOADING_ENV, "start")


def affine(w, x):
    return jnp.tanh(x @ w) + 1.0  # [n, d]


def inputs(rows=4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(8, 8)).astype(np.float32), rng.normal(size=(rows, 8)).astype(np.float32)


def test_a_second_store_loads_what_the_first_compiled(tmp_path):
    first = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    expected = np.asarray(first(*inputs()))
    assert (first.compiled, first.loaded) == (1, 0)
    second = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    assert second.prepare(*inputs()) == "loaded"
    np.testing.assert_array_equal(np.asarray(second(*inputs())), expected)
    assert (second.compiled, second.loaded) == (0, 1)
    np.testing.assert_allclose(expected, np.asarray(jax.jit(affine)(*inputs())), rtol=1e-6)


def test_prepare_from_shapes_alone_serves_arrays_of_those_shapes(tmp_path):
    program = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in inputs()]
    assert program.prepare(*shapes) == "compiled"
    program(*inputs())
    assert program.compiled == 1  # the call found the prepared executable


def test_each_shape_and_each_setting_is_its_own_entry(tmp_path):
    store = ProgramStore(tmp_path, FINGERPRINT)
    Program("affine", affine, store)(*inputs(4))
    Program("affine", affine, store)(*inputs(16))
    Program("affine", affine, store, settings={"chunk": 2})(*inputs(4))
    assert len(store.entries()) == 3
    assert store.counts == {"loaded": 0, "compiled": 3}


def test_a_store_compiled_for_something_else_is_rebuilt_not_loaded(tmp_path, caplog):
    Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))(*inputs())
    foreign = {**FINGERPRINT, "jax": "0.0.1"}
    (tmp_path / MANIFEST).write_text(json.dumps(foreign))
    with caplog.at_level(logging.WARNING, "phoenix.engine.programs"):
        store = ProgramStore(tmp_path, FINGERPRINT)
    assert "compiled for another jax: rebuilding" in caplog.text
    assert store.entries() == []
    program = Program("affine", affine, store)
    assert program.prepare(*inputs()) == "compiled"
    assert json.loads((tmp_path / MANIFEST).read_text()) == FINGERPRINT


def test_a_torn_entry_is_compiled_again_and_rewritten(tmp_path, caplog):
    Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))(*inputs())
    (entry,) = ProgramStore(tmp_path, FINGERPRINT).entries()
    entry.write_bytes(entry.read_bytes()[:100])
    with caplog.at_level(logging.WARNING, "phoenix.engine.programs"):
        again = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
        assert again.prepare(*inputs()) == "compiled"
    assert "unreadable" in caplog.text
    assert (
        Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT)).prepare(*inputs())
        == "loaded"
    )


def test_a_store_that_cannot_be_written_still_serves(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, "phoenix.engine.programs"):
        store = ProgramStore(blocker / "store", FINGERPRINT)
        program = Program("affine", affine, store)
        out = program(*inputs())
    assert not store.writable and "not writable" in caplog.text
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(affine)(*inputs())))


@pytest.fixture
def made(monkeypatch):
    """Counts the stored executables made live (deserialized) from here on."""
    calls = []
    real = programs.serialize_executable.deserialize_and_load

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(programs.serialize_executable, "deserialize_and_load", counted)
    return calls


def test_first_use_loading_makes_an_executable_on_its_first_call(tmp_path, monkeypatch, made):
    monkeypatch.setenv(programs.LOADING_ENV, "start")
    eager = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    expected = np.asarray(eager(*inputs()))
    eager_shapes = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT)).output_shapes(
        *inputs()
    )
    assert len(made) == 1  # at start-up: prepared, made
    monkeypatch.setenv(programs.LOADING_ENV, "first-use")
    lazy = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    assert lazy.prepare(*inputs()) == "loaded" and lazy.prepare(*inputs()) == "ready"
    shapes = lazy.output_shapes(*inputs())  # warm-up chains these into the next program
    assert (
        (shapes.shape, shapes.dtype)
        == (eager_shapes.shape, eager_shapes.dtype)
        == ((4, 8), np.float32)
    )
    assert len(made) == 1  # read and checked, not made
    np.testing.assert_array_equal(np.asarray(lazy(*inputs())), expected)
    np.testing.assert_array_equal(np.asarray(lazy(*inputs())), expected)
    assert len(made) == 2 and (lazy.loaded, lazy.compiled) == (1, 0)  # made once, on first use


def test_first_use_loading_compiles_what_the_store_lacks_at_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv(programs.LOADING_ENV, "first-use")
    program = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    assert program.prepare(*inputs()) == "compiled"
    np.testing.assert_allclose(
        np.asarray(program(*inputs())), np.asarray(jax.jit(affine)(*inputs()))
    )
    assert (program.loaded, program.compiled) == (0, 1)


def test_an_entry_xla_refuses_is_compiled_on_its_first_use_and_stored_again(
    tmp_path, monkeypatch, caplog
):
    """An entry that unpickles but holds an executable XLA refuses: start-up reads it without
    making it, so its first batch compiles it, once, and the store holds a good one again."""
    Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))(*inputs())
    (path,) = ProgramStore(tmp_path, FINGERPRINT).entries()
    entry = pickle.loads(path.read_bytes())
    entry["executable"] = (b"not an executable", *entry["executable"][1:])
    path.write_bytes(pickle.dumps(entry))
    monkeypatch.setenv(programs.LOADING_ENV, "first-use")
    store = ProgramStore(tmp_path, FINGERPRINT)
    lazy = Program("affine", affine, store)
    assert lazy.prepare(*inputs()) == "loaded"
    with caplog.at_level(logging.WARNING, "phoenix.engine.programs"):
        out = lazy(*inputs())
        lazy(*inputs())
    assert caplog.text.count("stored executable unusable") == 1
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.jit(affine)(*inputs())))
    assert (lazy.loaded, lazy.compiled) == (1, 1) and store.counts == {"loaded": 1, "compiled": 1}
    monkeypatch.setenv(programs.LOADING_ENV, "start")
    again = Program("affine", affine, ProgramStore(tmp_path, FINGERPRINT))
    assert again.prepare(*inputs()) == "loaded"  # made at start-up: the entry is good again


@pytest.mark.parametrize("value", ["lazy", "START"])
def test_an_unknown_loading_mode_is_refused_naming_the_variable(tmp_path, monkeypatch, value):
    monkeypatch.setenv(programs.LOADING_ENV, value)
    with pytest.raises(
        ValueError, match=r"\$PHOENIX_PROGRAM_LOADING=.*expected one of start, first-use"
    ):
        ProgramStore(tmp_path, FINGERPRINT)


def test_a_remembered_value_is_computed_once_per_store_and_kept_as_json(tmp_path, caplog):
    calls = []

    def compute():
        calls.append(1)
        return [["layer/w", [8, 4]]]

    assert ProgramStore(tmp_path, FINGERPRINT).remembered("shapes-1", compute) == compute()
    assert ProgramStore(tmp_path, FINGERPRINT).remembered("shapes-1", compute) == compute()
    assert len(calls) == 3  # once by the first store, twice here: the second store read it
    (tmp_path / "shapes-1.json").write_text("{torn")
    with caplog.at_level(logging.WARNING, "phoenix.engine.programs"):
        assert ProgramStore(tmp_path, FINGERPRINT).remembered("shapes-1", compute) == compute()
    assert "unreadable" in caplog.text and len(calls) == 5
    assert json.loads((tmp_path / "shapes-1.json").read_text())["value"] == compute()
    # a store rebuilt for something else forgets it
    (tmp_path / MANIFEST).write_text(json.dumps({**FINGERPRINT, "code": "other"}))
    ProgramStore(tmp_path, FINGERPRINT)
    assert not (tmp_path / "shapes-1.json").exists()


def wrap_hash(ids):
    return ids * jnp.int64(6364136223846793005) + 1  # wraps in int64


def test_an_x64_program_keeps_int64_through_the_store(tmp_path):
    ids = np.array([1, 2**62, -(2**63) + 5], np.int64)
    expected = ids * np.int64(6364136223846793005) + 1  # numpy wraps the same way
    Program("wrap", wrap_hash, ProgramStore(tmp_path, FINGERPRINT), x64=True)(ids)
    loaded = Program("wrap", wrap_hash, ProgramStore(tmp_path, FINGERPRINT), x64=True)
    assert loaded.prepare(ids) == "loaded"
    np.testing.assert_array_equal(np.asarray(loaded(ids)), expected)


@pytest.fixture(scope="module")
def tiny_artifacts(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    generate("tiny", out, seed=3, corpus_size=64)
    return out


def test_the_store_beside_artifacts_follows_config_and_env(tiny_artifacts, tmp_path, monkeypatch):
    store = ProgramStore.beside(tiny_artifacts)
    assert store.directory.parent == (tiny_artifacts / programs.STORE_DIR).resolve()
    assert store.fingerprint["platform"] == "cpu" and store.fingerprint["host"]
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "elsewhere"))
    moved = ProgramStore.beside(tiny_artifacts)
    assert moved.directory.parent == (tmp_path / "elsewhere").resolve()
    assert moved.directory.name == store.directory.name
    other = tmp_path / "other"
    generate("tiny", other, seed=4, corpus_size=64)  # other hash seeds: other programs
    assert ProgramStore.beside(other).directory.name != store.directory.name


@pytest.mark.parametrize("cache_mib", [0, 64], ids=["cache-off", "cache-on"])
def test_a_ranker_started_again_loads_every_bucket(tiny_artifacts, cache_mib):
    weights = {"favorite": 1.0, "reply": 13.5}
    # two buckets: each program of each compiled by the first, loaded by the second
    buckets = dict(batch_buckets=(1, 2), candidate_buckets=(8,), prefix_cache_mib=cache_mib)

    def ranker():
        resources = PhoenixResources(tiny_artifacts)
        return RankerService(resources, weights, **buckets)

    assert ranker().warm_up() == 2
    service = ranker()
    service.warm_up()
    second = service.ranker
    if cache_mib:  # the prefix cache's four programs, and no other
        prefix = second.prefix
        assert prefix is not None
        runs = [prefix._prefix_hash, prefix._prefix, prefix._candidate_hash, prefix._candidates]
        assert (second._rank.loaded, second._rank.compiled) == (0, 0)
    else:
        runs = [second._rank, second._hash]
    assert [(run.loaded, run.compiled) for run in runs] == [(2, 0)] * len(runs)


def test_stale_siblings_beside_artifacts_and_in_a_shared_store(tmp_path):
    """Beside artifacts every other store of this machine is stale (the artifacts changed);
    under $PHOENIX_PROGRAM_STORE, stores of other configs belong to other artifacts and stay."""

    def store(name: str, **changed: str) -> ProgramStore:
        machine = {"platform": "cpu", "device_kind": "cpu", "host": "h1"}
        made = {**machine, "artifact_config": "c1", "code": "k1", **changed}
        return ProgramStore(tmp_path / name, made)

    served = store("served")
    older_code = store("older-code", code="k0")
    other_config = store("other-config", artifact_config="c2")
    store("other-device", platform="gpu", device_kind="H200", host="")
    store("other-host", host="h2")
    assert served.stale_siblings() == sorted([older_code.directory, other_config.directory])
    served.shared = True
    assert served.stale_siblings() == [older_code.directory]


def test_a_store_under_the_env_directory_is_shared(tiny_artifacts, tmp_path, monkeypatch):
    ProgramStore.forget_open()
    assert not ProgramStore.beside(tiny_artifacts).shared
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "shared"))
    assert ProgramStore.beside(tiny_artifacts).shared
    ProgramStore.forget_open()
