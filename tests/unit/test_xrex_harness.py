"""The pure parts of the harness that runs X's own forward beside ours (bench/bench_xrex.py):
the stubs X's configs import through, the release archive packed and laid out again, the
benchmark's options, the step's place in the GPU benchmark and its table; and a missing
release refused as a user meets it. X's code itself is not here (it is the
user's checkout): docs/gpu.md says how a run against it was checked."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import types
from pathlib import Path

import numpy as np
import pytest

from harness import REPO_ROOT, xrex_release
from harness.bench_options import NANO_SHAPE, xrex_args
from harness.gpu_bench import profiles, steps
from harness.gpu_bench.production_tables import xrex_table
from harness.xrex_imports import StubFinder, prepare_release
from phoenix.production.reference import Tolerances, compare

ROOT = "phoenix_test_stubbed"


@pytest.fixture
def stubbed():
    finder = StubFinder([ROOT])
    sys.meta_path.insert(0, finder)
    yield finder
    sys.meta_path.remove(finder)
    for name in [n for n in sys.modules if n.partition(".")[0] == ROOT]:
        del sys.modules[name]


def test_a_stubbed_module_answers_every_use_an_import_time_makes(stubbed):
    from phoenix_test_stubbed.engine import Client, serde  # type: ignore[import-not-found]

    @serde
    class Config:  # a decorator leaves what it decorates
        size: int = 3

    assert Config().size == 3
    assert isinstance(Client(1, key=2).connect().anything, object)  # built, called, read
    assert (Client | None) is Client  # an annotation evaluated at import

    class Derived(Client):  # subclassed
        pass

    assert Derived.Nested.Deeper is not None and Client["int"] is Client
    with pytest.raises(AttributeError):
        Client.__wrapped__  # noqa: B018 (dunder lookups must fail, as inspect expects)
    assert stubbed.stubbed == ["phoenix_test_stubbed", "phoenix_test_stubbed.engine"]


def test_only_the_named_roots_are_stubbed(stubbed):
    assert stubbed.find_spec("json", None) is None
    assert stubbed.find_spec("phoenix_test_stubbed_not", None) is None


def test_a_release_folder_without_xs_packages_is_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--release/--site: no folder .*xrex_missing"):
        prepare_release(tmp_path / "xrex_missing", tmp_path)


def release_tree(root: Path) -> Path:
    """A folder laid out as the phoenix/ folder of X's release, with one proto."""
    for part in ("xrex/models", "python/common/xai-configlib/src/xai_configlib",
                 "python/common/xai-gimmick/src/xai_gimmick", xrex_release.PROTOS):  # fmt: skip
        (root / part).mkdir(parents=True)
    (root / "xrex/__init__.py").write_text("")
    (root / "xrex/models/model.py").write_text("WIDTH = 4\n")
    (root / "xrex/models/__pycache__").mkdir()
    (root / "xrex/models/__pycache__/model.cpython-311.pyc").write_bytes(b"stale")
    (root / "NOTICE").write_text("X's notice\n")
    (root / xrex_release.PROTOS / "recsys.proto").write_text('syntax = "proto3";\n')
    return root


def fake_protoc(tools: Path) -> Path:
    """A grpc_tools whose protoc writes, for each proto, the two modules protoc would, each
    importing a sibling as protoc's output does (a fake: the real one is pip's)."""
    package = tools / "grpc_tools"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "protoc.py").write_text(
        "import sys, pathlib\n"
        "args = sys.argv[1:]\n"
        "out = pathlib.Path(next(a for a in args if a.startswith('--python_out=')).split('=')[1])\n"
        "for proto in (a for a in args if a.endswith('.proto')):\n"
        "    stem = pathlib.Path(proto).stem\n"
        "    (out / f'{stem}_pb2.py').write_text('import copy_pb2 as copy__pb2\\nNAME = 1\\n')\n"
        "    (out / f'{stem}_pb2_grpc.py').write_text(f'import grpc\\nimport {stem}_pb2 as m\\n')\n"
    )
    return tools


def test_the_release_packs_and_lays_out_again_with_relative_proto_imports(tmp_path):
    release = release_tree(tmp_path / "phoenix")
    archive = tmp_path / "payload" / xrex_release.ARCHIVE
    size = xrex_release.pack(release, archive, fake_protoc(tmp_path / "tools"))
    assert size == archive.stat().st_size > 0
    names = tarfile.open(archive).getnames()
    assert "release/xrex/models/model.py" in names and "release/NOTICE" in names
    assert not any("__pycache__" in name for name in names)
    laid_out, site = xrex_release.unpack(archive, tmp_path / "out")
    assert (laid_out / "xrex/models/model.py").read_text() == "WIDTH = 4\n"
    generated = site / "xai_proto"
    assert (generated / "__init__.py").read_text() == ""
    assert (generated / "recsys_pb2.py").read_text().splitlines()[0] == (
        "from . import copy_pb2 as copy__pb2"
    )
    grpc_lines = (generated / "recsys_pb2_grpc.py").read_text().splitlines()
    assert grpc_lines == ["import grpc", "from . import recsys_pb2 as m"]
    (release / "xrex/models/model.py").write_text("WIDTH = 8\n")  # another checkout's
    xrex_release.pack(release, archive, tmp_path / "tools")
    (laid_out / "xrex/models/stale.py").write_text("")
    assert xrex_release.unpack(archive, tmp_path / "out") == (laid_out, site)
    assert (laid_out / "xrex/models/model.py").read_text() == "WIDTH = 8\n"
    assert not (laid_out / "xrex/models/stale.py").exists()  # laid out anew, not over


def test_a_folder_that_is_not_xs_release_is_refused_by_name(tmp_path):
    (tmp_path / "xrex").mkdir()
    with pytest.raises(xrex_release.ReleaseError, match="no python/common/xai-configlib/src"):
        xrex_release.check_release(tmp_path)
    assert xrex_release.main([str(tmp_path), "--out", str(tmp_path / "x.tar.xz")]) == 1


def test_a_missing_archive_says_how_to_make_one(tmp_path):
    with pytest.raises(xrex_release.ReleaseError, match="python -m harness.xrex_release"):
        xrex_release.unpack(tmp_path / xrex_release.ARCHIVE, tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "-m", "bench.bench_xrex", "--payload", str(tmp_path),
         "--work", str(tmp_path / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.startswith(f"error: no {tmp_path / xrex_release.ARCHIVE}: build it"), (
        done.stderr
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--batches", "1,x"], "--batches: comma-separated whole numbers"),
        (["--batches", "0"], "--batches and --repeats: 1 or more"),
        (["--repeats", "0"], "--batches and --repeats: 1 or more"),
        (["--small", "--history", "100"], "--small takes its shapes from its reference set"),
    ],
)
def test_the_benchmark_refuses_incomplete_options(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        xrex_args(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_shapes_default_to_the_nano_and_paths_are_made_absolute(monkeypatch, tmp_path):
    """The side runs from the checkout's root: relative paths must not change meaning."""
    monkeypatch.chdir(tmp_path)
    args = xrex_args(["--payload", "p", "--work", "w", "--out", "o.json"])
    assert (args.history, args.candidates) == NANO_SHAPE
    assert (args.payload, args.work, args.out) == (
        tmp_path / "p",
        tmp_path / "w",
        tmp_path / "o.json",
    )
    small = xrex_args(["--small"])
    assert (small.history, small.candidates) == (254, 16)  # tests/data/production's


def test_values_past_the_limit_are_counted_in_bfloat16_steps():
    """-16.5 and -16.375 are one bfloat16 step (0.125) apart, past the 0.08 limit; near zero a
    difference under the limit is not counted, however many steps it spans."""
    theirs = np.array([[[-16.5, -1e-6], [-2.0, 0.0]]], np.float32)  # [B=1, R=2, 2]
    ours = np.array([[[-16.375, -2e-6], [-2.0, 9.0]]], np.float32)  # the padded row differs
    outputs = {"log_probs": theirs, "logits": theirs, "continuous": theirs}
    reference = types.SimpleNamespace(candidate_len=np.array([1]), expected=outputs)
    found = compare(dict.fromkeys(outputs, ours), reference, Tolerances())
    by_output = {d.output: (d.over, d.over_steps) for d in found}
    assert by_output == {"log_probs": (1, 1.0), "logits": (0, 0.0), "continuous": (1, 1.0)}


def test_the_step_is_skipped_without_xs_release_and_runs_with_one(tmp_path):
    args = steps.parse_args(["--cpu", "--steps", "xrex", "--build-dir", str(tmp_path)])
    assert steps.skipped("xrex", args).startswith("no --payload")
    args = steps.parse_args(["--steps", "xrex", "--payload", str(tmp_path)])
    assert steps.skipped("xrex", args).startswith(f"no {tmp_path / xrex_release.ARCHIVE}")
    (tmp_path / xrex_release.ARCHIVE).write_bytes(b"")
    assert steps.skipped("xrex", args) == ""
    command = steps.step_command("xrex", args)
    assert command[1:3] == ["-m", "bench.bench_xrex"]
    assert command[command.index("--payload") + 1] == str(tmp_path)
    assert command[-len(profiles.GPU.xrex_args) :] == profiles.GPU.xrex_args
    assert "--device" in command and command[command.index("--device") + 1] == "gpu"


def xrex_result(ok: bool) -> dict:
    def side(ms):
        return {"median_ms": ms}

    log_probs = {"output": "log_probs", "max": 0.125 if not ok else 0.06, "mean": 0.0018,
                 "over": 0 if ok else 3, "over_steps": 0.0 if ok else 1.0,
                 "limit": "max <= 0.08, mean <= 0.005"}  # fmt: skip
    continuous = {"output": "continuous", "limit": "max <= 0.1 or 2 bfloat16 steps"}
    return {
        "settings": {"model": "nano", "history": 1022, "candidates": 64},
        "x": {"jax": "0.11.2", "kernel": "Pallas, compiled"},
        "machine": {"gpu": "NVIDIA H200"},
        "rows": [
            {
                "batch": 8,
                "x": side(4.0),
                "x_over_ours": 2.0,
                "ours": {
                    "median_ms": 2.0,
                    "ok": ok,
                    "differences": [log_probs, continuous],
                },
            }
        ],  # fmt: skip
        "replay": {
            "set": "tests/data/production/small_serving.npz",
            "x_here_against_stored": [{"output": "log_probs", "max": 0.125, "mean": 0.009}],
        },  # fmt: skip
    }


def test_the_table_shows_time_agreement_and_xs_own_drift():
    text = "\n".join(xrex_table(xrex_result(ok=False)))
    assert "| 8 | 4.00 | 2.00 | 2.00x | 0.1250 / 0.00180 | 3 (1) | **no** |" in text
    assert "X on JAX 0.11.2, its kernel: Pallas, compiled" in text
    assert "log-probs max <= 0.08, mean <= 0.005, continuous max <= 0.1 or 2 bfloat16" in text
    assert "`small_serving.npz`" in text and "log-probs max 0.1250, mean 0.00900" in text
    assert "| 8 | 4.00 | 2.00 | 2.00x | 0.0600 / 0.00180 | 0 | yes |" in "\n".join(
        xrex_table(xrex_result(ok=True))
    )
    assert xrex_table(None)[0].endswith("*not yet measured*.")


def test_the_ref_at_forms_of_load_and_store_index_as_xs_kernels_expect():
    """The fallback for a JAX without the old primitives, in Pallas interpret mode: a slice
    read at an offset and written at another, as ``pl.load(ref, idx)`` / ``pl.store``."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl

    from harness.xrex_imports import indexed_through_at

    load, store = indexed_through_at()

    def kernel(x_ref, o_ref):
        store(o_ref, (pl.dslice(0, 4),), load(x_ref, (pl.dslice(2, 4),)) * 2)
        store(o_ref, (pl.dslice(4, 4),), load(x_ref, (pl.dslice(0, 4),)))

    x = jnp.arange(8, dtype=jnp.float32)
    out = pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32),
                         interpret=True)(x)  # fmt: skip
    assert out.tolist() == [4, 6, 8, 10, 0, 1, 2, 3]
