"""X's release made importable in this process for its ranker forward: its packages first
on ``sys.path``, stubs for what its config and trainer modules import but the forward never
calls, and the shims the JAX here needs where X's code was written against its pinned 0.8.1.

Used by bench/xrex_side.py only, in a process of its own (the stubs and the patched JAX
internals must not reach a process that runs our ranker). Imports the standard library;
typing_extensions (on Python 3.11), jax and X's modules inside the functions. What this does
to X's code, and why, is listed in docs/gpu.md ("X's own forward").
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

# Imported at module level by X's config and trainer modules, never called by the forward.
UNUSED_BY_FORWARD = (
    "xai_recsys_engine",
    "aiokafka",
    "opentelemetry",
    "orbax",
    "tensorstore",
    "prometheus_client",
    "xai_checkpointing",
    "serde",
    "zstandard",
)


class _AnyMeta(type):
    """Class-level attribute reads of a stub name give further stub classes."""

    def __getattr__(cls, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _AnyMeta(name, (_Any,), {})

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator (`@serde`): leave what it decorates
        return super().__call__(*args, **kwargs)

    def __or__(cls, other):  # `Stub | None` in an annotation evaluated at import
        return cls

    __ror__ = __or__


class _Any(metaclass=_AnyMeta):
    """Any name of a stubbed module: constructible, callable (a decorator returns what it
    decorates), subclassable, subscriptable."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator (`@serde`): leave what it decorates
        return _Any()

    def __getattr__(self, name: str):
        return _Any()

    def __class_getitem__(cls, item):
        return cls


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        stub = _AnyMeta(name, (_Any,), {})
        setattr(self, name, stub)
        return stub


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import under ``roots`` (``roots`` and their submodules) with a stub."""

    def __init__(self, roots) -> None:
        self.roots = frozenset(roots)
        self.stubbed: list[str] = []

    def find_spec(self, fullname, path, target=None):
        if fullname.partition(".")[0] not in self.roots:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        self.stubbed.append(spec.name)
        return module

    def exec_module(self, module) -> None:
        pass


def release_paths(release: Path, site: Path) -> list[Path]:
    """Where X's packages lie in its release's ``phoenix/`` folder, and ``site`` (the
    generated ``xai_proto``)."""
    python = release / "python"
    return [
        release,  # xrex
        python / "common" / "xai-configlib" / "src",
        python / "common" / "xai-gimmick" / "src",
        site,
    ]


def prepare_release(release: Path, site: Path) -> StubFinder:
    """Put X's packages first on ``sys.path`` and stub what its configs import unused."""
    for path in release_paths(release, site):
        if not path.is_dir():
            raise SystemExit(f"error: --release/--site: no folder {path}")
    sys.path[:0] = [str(p) for p in release_paths(release, site)]
    import typing

    if not hasattr(typing, "TypeAliasType"):  # xai_configlib uses the Python 3.12 name
        import typing_extensions

        typing.TypeAliasType = typing_extensions.TypeAliasType  # type: ignore[attr-defined]
    finder = StubFinder(UNUSED_BY_FORWARD)
    sys.meta_path.insert(0, finder)
    for shim in (skip_training_patches, restore_pallas_names):
        try:
            shim()
        except (ImportError, AttributeError, KeyError) as error:
            import jax

            raise SystemExit(
                f"error: {shim.__name__}: X's code or JAX {jax.__version__} lacks what it "
                f"needs ({type(error).__name__}: {error}); see harness/xrex_imports.py"
            ) from None
    return finder


def restore_pallas_names() -> None:
    """``pl.load(ref, idx, ...)`` / ``pl.store(ref, idx, val, ...)``, which X's kernels call,
    left ``jax.experimental.pallas`` after X's pinned JAX 0.8.1: put them back under those
    names, JAX's own Pallas primitives where they still are (same signatures), else the
    Triton ones over ``ref.at[idx]`` (their newer form)."""
    import jax.experimental.pallas as pl

    try:
        from jax._src.pallas.primitives import load, store
    except ImportError:
        load, store = indexed_through_at()
    for name, primitive in (("load", load), ("store", store)):
        if not hasattr(pl, name):
            setattr(pl, name, primitive)


def indexed_through_at():
    """``load(ref, idx, ...)`` and ``store(ref, idx, val, ...)`` over the Triton forms that
    take the indexing on the ref (``ref.at[idx]``)."""
    from jax.experimental.pallas import triton as plt

    def load(ref, idx=None, **options):
        return plt.load(ref if idx is None else ref.at[idx], **options)

    def store(ref, idx, val, **options):
        return plt.store(ref if idx is None else ref.at[idx], val, **options)

    return load, store


def skip_training_patches() -> None:
    """X's ``jax_extensions`` patches JAX for training, written against the internals of its
    pinned JAX 0.8.1: when the trainer is imported (dot_general's transpose names, an
    ``XlaRuntimeError`` alias from ``jax.lib.xla_extension``, gone since; shard_map's
    transpose), and when it is itself imported (remat's lowering, to leave out optimization
    barriers in differentiated remat: it calls ``mlir.jaxpr_subcomp`` without an argument
    later JAX requires). A forward differentiates nothing, where X's remat lowering does what
    JAX's does: JAX's own rule goes back, and the trainer's import binds a no-op."""
    from jax._src.ad_checkpoint import remat_p
    from jax._src.interpreters import mlir

    jax_remat = mlir._lowerings[remat_p]
    from xrex.utils import jax_extensions

    mlir._lowerings[remat_p] = jax_remat
    jax_extensions.initialize_extensions = lambda: None


def use_interpreted_kernels() -> None:
    """Pallas on a CPU: X's attention kernels in interpret mode (its call sites pass
    ``interpret=False``)."""
    from xrex.pallas import ranker_attention_v2 as kernels

    for name in ("mha_inference_gqa", "mha"):
        compiled = getattr(kernels, name)

        def interpreted(*args, _compiled=compiled, **kwargs):
            kwargs["interpret"] = True
            return _compiled(*args, **kwargs)

        setattr(kernels, name, interpreted)
