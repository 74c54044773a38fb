"""Compiled programs as a build product: XLA executables stored beside the artifacts.

``jax.jit`` compiles a program for every input shape the first time it sees it, in every
process. JAX's persistent cache saves the compile but still traces and lowers each program to
find its entry: 0.4 to 1.5 s per ranker bucket on 2 cores, 20 buckets, in every instance of
every start. A ``ProgramStore`` keeps the executables themselves
(``jax.experimental.serialize_executable``); loading one takes milliseconds.

A store is one directory per (JAX version, device, host, artifact config, model code) under
``<artifacts>/compiled/``; its ``manifest.json`` says what it was compiled for. A store whose
manifest differs from what this process would compile (copied from another machine, another
JAX, edited code) is foreign: it is emptied and rebuilt, never loaded. An entry that cannot be
read is compiled again. A store that cannot be written (a read-only volume) still loads what
it has and compiles the rest in memory.

When an entry becomes a live executable is a deployment choice
(``$PHOENIX_PROGRAM_LOADING``): ``start`` (the default) makes every one at start-up, so the
first request of each shape is as fast as the rest; ``first-use`` reads and checks every entry
at start-up (a missing one is compiled then, as always: nothing compiles on a request) but
makes its executable on the first batch of that shape, 20-30 ms of CPU each on 2 cores: an
instance that serves few shapes starts in about half the CPU (docs/serving.md). An entry XLA
then refuses is compiled on that batch, once, and stored again. ``phoenix-compile`` always makes
every entry it finds: a build checks them all.

Executables are pickles: load stores only from your own artifacts, never from untrusted
sources (as any checkpoint).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import platform
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import jax
import numpy as np
from jax.experimental import serialize_executable

logger = logging.getLogger("phoenix.engine.programs")

FORMAT = 2  # of the files below; a new format makes every older store foreign
STORE_DIR = "compiled"  # under the artifact directory
STORE_ENV = "PHOENIX_PROGRAM_STORE"  # set: stores live under this directory instead
MANIFEST = "manifest.json"
SUFFIX = ".xla"
LOADING_ENV = "PHOENIX_PROGRAM_LOADING"  # when stored executables are made (module docstring)
LOADING_MODES = ("start", "first-use")

PACKAGE = Path(__file__).resolve().parents[1]  # phoenix/
# The code a program is traced from: the model, the kernels and the hash formula.
CODE = (
    "config.py",
    "grok.py",
    "hashing.py",
    "recsys_model.py",
    "recsys_retrieval_model.py",
    "engine/*.py",
    "production/*.py",
)


def loading_mode() -> str:
    """``$PHOENIX_PROGRAM_LOADING``: "start" (unset) or "first-use"; anything else is refused
    naming the variable, before a program is loaded."""
    mode = os.environ.get(LOADING_ENV, "").strip() or "start"
    if mode not in LOADING_MODES:
        raise ValueError(
            f"${LOADING_ENV}={mode!r}: expected one of {', '.join(LOADING_MODES)} "
            "(when stored programs become executables: at start-up or on first use)"
        )
    return mode


class StoredProgram:
    """A stored entry read and checked but not yet made an executable (first-use loading):
    its serialized executable and its output shapes, which warm-up reads without it."""

    def __init__(self, executable: tuple, out_shapes: list):
        self.executable = executable  # serialize_executable.serialize's (bytes, in, out trees)
        self.out_shapes = out_shapes  # [(shape, dtype name, weak_type)] of each output leaf

    def out_info(self):
        """The output structure as ``jax.ShapeDtypeStruct`` leaves, without the placement and
        layout an executable's ``out_info`` carries (devices do not pickle). Warm-up keys the
        next program by shapes and dtypes alone, so it finds the same entries; a program
        compiled from these (one the store lacked) is lowered without placement annotations,
        which on the one device a model instance uses runs the same."""
        leaves = [jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), weak_type=weak)
                  for shape, dtype, weak in self.out_shapes]  # fmt: skip
        return jax.tree_util.tree_unflatten(self.executable[2], leaves)

    def load(self):
        return serialize_executable.deserialize_and_load(*self.executable)


def out_shapes(compiled) -> list:
    """What ``StoredProgram`` keeps of a compiled program's outputs: plain values."""
    return [(tuple(leaf.shape), np.dtype(leaf.dtype).name, bool(leaf.weak_type))
            for leaf in jax.tree_util.tree_leaves(compiled.out_info)]  # fmt: skip


@functools.cache
def code_digest() -> str:
    """One digest of the source files programs are traced from: edited code, new store."""
    digest = hashlib.sha256()
    for pattern in CODE:
        for path in sorted(PACKAGE.glob(pattern)):
            digest.update(path.relative_to(PACKAGE).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def host_signature() -> str:
    """The host's instruction set: XLA's CPU compiler emits code for the CPU it runs on, so an
    executable built on another CPU model may not run here."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1]
                break
    except OSError:
        pass
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:16]


def program_config(path: Path) -> bytes:
    """config.json as the programs depend on it: without ``version``, a release label (a
    retrained version of the same shapes loads the programs compiled for the one before)."""
    config = json.loads(path.read_bytes())
    config.pop("version", None)
    return json.dumps(config, sort_keys=True).encode()


def fingerprint(artifact_config: bytes, device: Optional[jax.Device] = None) -> dict[str, str]:
    """What a program compiled in this process depends on besides its inputs and settings."""
    import jaxlib

    device = device or jax.devices()[0]
    client = device.client
    return {
        "format": str(FORMAT),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "platform": client.platform,
        "platform_version": client.platform_version,
        "device_kind": device.device_kind,
        "host": host_signature() if client.platform == "cpu" else "",
        "artifact_config": hashlib.sha256(artifact_config).hexdigest()[:16],
        "code": code_digest(),
    }


def input_key(args: Sequence[Any], static: Mapping[str, Any]) -> tuple:
    """The input structure, shapes and dtypes, and static arguments a program is compiled for.

    Arrays and ``jax.ShapeDtypeStruct`` give the same key, so warm-up can prepare a program
    from shapes alone. It is computed at every call (the ranker's has 110 leaves), so it reads
    each leaf's shape and dtype and nothing else: 60 us, where formatting them took 460 us.
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    try:
        shapes = tuple((x.shape, x.dtype) for x in leaves)
    except AttributeError:  # a Python scalar among the inputs
        shapes = tuple((np.shape(x), np.result_type(x)) for x in leaves)
    return tree, shapes, tuple(sorted(static.items()))


class ProgramStore:
    """Serialized executables in ``directory``, valid for one ``fingerprint``."""

    def __init__(self, directory: Path, fingerprint: Mapping[str, str]):
        self.directory = Path(directory)
        self.fingerprint = dict(fingerprint)
        self.writable = True
        self.first_use = loading_mode() == "first-use"
        self.counts = {"loaded": 0, "compiled": 0}  # by this process's programs
        self.report: Optional[Callable[[str], None]] = None  # called with how, per program
        # Under $PHOENIX_PROGRAM_STORE: one directory holds the stores of several artifact
        # configs (versions of other shapes, other models) side by side.
        self.shared = False
        # Executables JAX's persistent cache loads fail on XLA's CPU backend when they run
        # ("Function broadcast_remainder_fusion not found" for one serialized again, "Function
        # negate_power_fusion not found" for one run as loaded): a process that fills a store
        # compiles past that cache. Set once, here: flipping the global
        # flag around each compile would race between the compiling threads.
        jax.config.update("jax_enable_compilation_cache", False)
        self._check_manifest()

    @classmethod
    def beside(cls, artifact_dir, device: Optional[jax.Device] = None) -> ProgramStore:
        """The store for this process's device and code under ``<artifact_dir>/compiled/``
        (or ``$PHOENIX_PROGRAM_STORE``)."""
        root = Path(artifact_dir)
        print_ = fingerprint(program_config(root / "config.json"), device)
        digest = hashlib.sha256(json.dumps(print_, sort_keys=True).encode()).hexdigest()[:12]
        shared = bool(os.environ.get(STORE_ENV))
        base = Path(os.environ.get(STORE_ENV) or root / STORE_DIR)
        directory = (base / f"{print_['platform']}-{digest}").resolve()
        if directory not in _OPEN:  # one per process: the models of one process share it
            _OPEN[directory] = cls(directory, print_)
            _OPEN[directory].shared = shared
        return _OPEN[directory]

    @staticmethod
    def opened() -> list[ProgramStore]:
        """The stores this process opened (none for a model without compiled programs)."""
        return list(_OPEN.values())

    @staticmethod
    def forget_open() -> None:
        """Forget the stores opened so far: the next ``beside`` reads its manifest again."""
        _OPEN.clear()

    def _check_manifest(self) -> None:
        manifest = self.directory / MANIFEST
        try:
            found = json.loads(manifest.read_text())
        except FileNotFoundError:
            found = None
        except (OSError, ValueError) as error:
            found = {"unreadable": str(error)}
        if found == self.fingerprint:
            return
        if found is not None:
            differs = sorted(
                k
                for k in set(found) | set(self.fingerprint)
                if found.get(k) != self.fingerprint.get(k)
            )
            logger.warning(
                "program store %s was compiled for another %s: rebuilding it",
                self.directory,
                ", ".join(differs),
            )
        try:
            if found is not None:
                shutil.rmtree(self.directory)
            self.directory.mkdir(parents=True, exist_ok=True)
            _atomic_write(manifest, json.dumps(self.fingerprint, indent=1).encode())
        except OSError as error:
            self._read_only(error)
            self.fingerprint = {}  # never load from a store whose manifest did not match

    def _read_only(self, error: OSError) -> None:
        if self.writable:
            logger.warning(
                "program store %s is not writable (%s): programs missing from it are compiled "
                "in memory at every start; run phoenix-compile where it can be written",
                self.directory,
                error,
            )
        self.writable = False

    def _path(self, name: str, sig: str) -> Path:
        return self.directory / f"{name}-{hashlib.sha256(sig.encode()).hexdigest()[:20]}{SUFFIX}"

    def load(self, name: str, sig: str):
        """The stored executable of ``name`` for ``sig`` (a ``StoredProgram`` under first-use
        loading), or None."""
        if not self.fingerprint:
            return None
        path = self._path(name, sig)
        try:
            with path.open("rb") as file:
                entry = pickle.load(file)
            if entry["signature"] != sig:
                return None
            stored = StoredProgram(entry["executable"], entry["out_shapes"])
            if self.first_use:
                stored.out_info()  # a torn entry fails here, at start-up, not on a request
                return stored
            return stored.load()
        except FileNotFoundError:
            return None
        except Exception as error:  # a torn or foreign file: compile it again
            logger.warning("program %s unreadable (%s): compiling it again", path, error)
            return None

    def save(self, name: str, sig: str, compiled) -> None:
        if not self.writable or not self.fingerprint:
            return
        entry = {
            "signature": sig,
            "executable": serialize_executable.serialize(compiled),
            "out_shapes": out_shapes(compiled),
        }
        try:
            _atomic_write(self._path(name, sig), pickle.dumps(entry))
        except OSError as error:
            self._read_only(error)

    def remembered(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()``'s value (plain JSON: lists, numbers, text), kept in this store as
        ``<name>.json``: a fact derived from what the store is keyed by (the artifact config,
        the model code, JAX), such as the shapes of the weights, which costs tracing the model
        to find. ``name`` must carry whatever else the value depends on. Computed again when
        missing or unreadable; kept only where the store can be written."""
        path = self.directory / f"{name}.json"
        if self.fingerprint:
            try:
                entry = json.loads(path.read_text())
                if entry["name"] == name:
                    return entry["value"]
            except FileNotFoundError:
                pass
            except (OSError, ValueError, KeyError, TypeError) as error:
                logger.warning("%s unreadable (%s): computing it again", path, error)
        value = compute()
        if self.writable and self.fingerprint:
            try:
                _atomic_write(path, json.dumps({"name": name, "value": value}).encode())
            except OSError as error:
                self._read_only(error)
        return value

    def stale_siblings(self) -> list[Path]:
        """Other stores beside this one built on this machine (same device and host) for
        another JAX, code or config: replaced by this one, never loaded again. In a shared
        directory ($PHOENIX_PROGRAM_STORE) a store of another config belongs to other
        artifacts (the version a rollout replaces, another preset): only those of this
        config are stale."""
        same_machine: tuple[str, ...] = ("platform", "device_kind", "host")
        if self.shared:
            same_machine += ("artifact_config",)
        stale = []
        for sibling in self.directory.parent.glob("*/" + MANIFEST):
            try:
                other = json.loads(sibling.read_text())
            except (OSError, ValueError):
                continue
            mine = all(other.get(k) == self.fingerprint.get(k) for k in same_machine)
            if mine and sibling.parent != self.directory:
                stale.append(sibling.parent)
        return sorted(stale)

    def entries(self) -> list[Path]:
        return sorted(self.directory.glob(f"*{SUFFIX}"))


_OPEN: dict[Path, ProgramStore] = {}


def _atomic_write(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one (instances load at once)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def prepare_all(calls: Sequence[tuple[Program, tuple]], workers: Optional[int] = None) -> None:
    """``program.prepare(*args)`` for every call, on a few threads: XLA compiles without
    holding the GIL, so an empty store fills about as many times faster as there are cores."""
    from concurrent.futures import ThreadPoolExecutor

    workers = workers or min(4, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="compile") as pool:
        for future in [pool.submit(program.prepare, *args) for program, args in calls]:
            future.result()


class Program:
    """A jitted function whose executables, one per input signature, come from a store.

    ``settings`` names whatever shapes the program besides its inputs (compute dtype, chunk
    sizes): two programs with the same inputs and other settings are stored apart.
    ``x64`` traces and runs it with 64-bit integers (the id hashes wrap in int64).
    ``compiler_options``: XLA's options for its compilation (the production ranker's rounding).
    """

    def __init__(
        self,
        name: str,
        fn: Callable,
        store: Optional[ProgramStore] = None,
        *,
        settings: Optional[Mapping[str, Any]] = None,
        static_argnames: Sequence[str] = (),
        x64: bool = False,
        compiler_options: Optional[Mapping[str, Any]] = None,
    ):
        self.name = name
        self.store = store
        self.settings = dict(settings or {})
        if compiler_options:  # compiled otherwise: stored apart
            self.settings["compiler_options"] = sorted(compiler_options.items())
        self.x64 = x64
        self._jit = jax.jit(
            fn,
            static_argnames=tuple(static_argnames),
            compiler_options=dict(compiler_options) if compiler_options else None,
        )
        self._executables: dict[tuple, Any] = {}
        self._stored: dict[tuple, StoredProgram] = {}  # first-use loading: made when called
        self._making = threading.Lock()
        self.loaded = self.compiled = 0

    def prepare(self, *args, **static) -> str:
        """Load or compile the executable for inputs like ``args`` (arrays or shapes);
        returns how: "ready", "loaded" or "compiled"."""
        key = input_key(args, static)
        if key in self._executables or key in self._stored:
            return "ready"
        executable = self.store.load(self.name, self._signature(key)) if self.store else None
        how = "loaded"
        if executable is None:
            executable, how = self._compiled(key, args, static), "compiled"
        if isinstance(executable, StoredProgram):
            self._stored[key] = executable
        else:
            self._executables[key] = executable
        self._count(how)
        return how

    def _signature(self, key: tuple) -> str:
        """The stored entry's name: inputs and settings as text (stable across processes)."""
        return f"{key}|{sorted(self.settings.items())}"

    def _compiled(self, key: tuple, args, static):
        """Compiled for ``args``, and stored (uncounted: the caller counts it)."""
        with jax.enable_x64(self.x64):
            executable = self._jit.lower(*args, **static).compile()
        if self.store:
            self.store.save(self.name, self._signature(key), executable)
        return executable

    def _count(self, how: str) -> None:
        setattr(self, how, getattr(self, how) + 1)
        if self.store:
            self.store.counts[how] += 1
            if self.store.report:
                self.store.report(how)

    def __call__(self, *args, **static):
        key = input_key(args, static)
        executable = self._executables.get(key)
        if executable is None:
            executable = self._executable(key, args, static)
        with jax.enable_x64(self.x64):
            return executable(*args)

    def _executable(self, key: tuple, args, static):
        """The executable of a key warm-up left stored (first-use loading), made now, once; a
        key warm-up did not prepare is prepared first (compiled if the store lacks it)."""
        with self._making:  # two threads on a new shape make it once
            executable = self._executables.get(key)
            if executable is None:
                if key not in self._stored:
                    self.prepare(*args, **static)
                stored = self._stored.get(key)
                if stored is not None:
                    self._executables[key] = self._made(key, stored, args, static)
                    del self._stored[key]
                executable = self._executables[key]
        return executable

    def _made(self, key: tuple, stored: StoredProgram, args, static):
        """The stored executable made; one XLA refuses (an entry that unpickles but holds a
        damaged or foreign executable, which start-up reads without making) is compiled on
        this batch instead, and stored again so that no later start compiles it."""
        try:
            return stored.load()
        except Exception as error:
            logger.warning("program %s: stored executable unusable (%s): compiling it",
                           self.name, error)  # fmt: skip
            executable = self._compiled(key, args, static)
            self._count("compiled")
            return executable

    def output_shapes(self, *args, **static):
        """The output shapes and dtypes for inputs like ``args``, read from the prepared
        executable (tracing the function again would cost a start its time)."""
        self.prepare(*args, **static)
        key = input_key(args, static)
        stored = self._stored.get(key)
        return stored.out_info() if stored is not None else self._executables[key].out_info
