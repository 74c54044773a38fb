"""Read, validate and write a Phoenix artifact directory.

Layout (every path relative to the artifact directory)::

    config.json                  ArtifactConfig.to_dict()
    ranker/model_params.npz      ranker weights, keys 'module/param'
    retrieval/model_params.npz   retrieval weights, keys 'module/param'
                                 (plus the optional scalar '~/log_temperature')
    embedding_tables.npz         user_embeddings [U, D], item_embeddings [I, D],
                                 author_embeddings [A, D]
    corpus.npz                   post_ids int64 [N], candidate_representations float32 [N, D],
                                 author_ids int64 [N], optional topics int64 [N]
    example_sequence.json        one user's request, named like the servers' inputs

Expected parameter shapes come from the model definitions themselves (``jax.eval_shape`` of the
Haiku init), so a checkpoint that loads here also fits the models. Every problem raises
``ArtifactError`` naming the file, the key and what was expected versus found. Paths are
resolved and must stay inside the artifact directory, so a symlink cannot smuggle in a file
from elsewhere. Files are written atomically and byte-for-byte deterministically.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np

from phoenix.config import ENTITIES, ArtifactConfig, ArtifactError
from phoenix.hashing import HashEmbedder, stack_tables

__all__ = [
    "ArtifactError",
    "Artifacts",
    "Corpus",
    "ExampleSequence",
    "flatten_params",
    "load_artifacts",
    "load_config",
    "load_corpus",
    "load_example_sequence",
    "ranker_param_shapes",
    "retrieval_param_shapes",
    "save_artifacts",
    "save_config",
    "save_corpus",
    "save_example_sequence",
    "unflatten_params",
]

PathLike = Union[str, os.PathLike]
Params = dict[str, dict[str, np.ndarray]]

CONFIG_FILE = "config.json"
RANKER_PARAMS_FILE = "ranker/model_params.npz"
RETRIEVAL_PARAMS_FILE = "retrieval/model_params.npz"
TABLES_FILE = "embedding_tables.npz"
CORPUS_FILE = "corpus.npz"
EXAMPLE_FILE = "example_sequence.json"

TABLE_KEYS = {entity: f"{entity}_embeddings" for entity in ENTITIES}
LOG_TEMPERATURE_KEY = "~/log_temperature"  # training-only scalar of the retrieval model
CORPUS_KEYS = ("post_ids", "candidate_representations", "author_ids")
OPTIONAL_CORPUS_KEYS = ("topics",)
UNIT_NORM_TOLERANCE = 1e-3
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # fixed timestamp: identical arrays give identical files


# ----------------------------------------------------------------------------------------
# Paths
# ----------------------------------------------------------------------------------------


def _artifact_root(directory: PathLike) -> Path:
    root = Path(directory)
    if not root.is_dir():
        raise ArtifactError(f"{root}: artifact directory not found")
    return root.resolve()


def resolve_inside(root: Path, relative: str) -> Path:
    """``root / relative`` resolved; it must stay inside ``root`` (symlinks included)."""
    root = root.resolve()
    path = (root / relative).resolve()
    if not path.is_relative_to(root):
        raise ArtifactError(
            f"{relative}: resolves to {path}, which is outside the artifact directory {root}"
        )
    return path


def _existing_file(root: Path, relative: str) -> Path:
    path = resolve_inside(root, relative)
    if not path.is_file():
        raise ArtifactError(f"{relative}: file not found in {root}")
    return path


# ----------------------------------------------------------------------------------------
# Deterministic, atomic writers and a checked npz reader
# ----------------------------------------------------------------------------------------


def _atomic_write(path: Path, write) -> None:
    """Write through a temporary sibling and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _write_npz_file(tmp: Path, arrays: Mapping[str, np.ndarray]) -> None:
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=_ZIP_DATE)
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(arrays[key]), allow_pickle=False)


def write_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Uncompressed ``.npz`` readable by ``np.load``; same arrays -> same bytes."""
    _atomic_write(path, lambda tmp: _write_npz_file(tmp, arrays))


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=2) + "\n"
    _atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def read_npz(path: Path, name: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` (no pickles); errors name ``name`` and the key."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ArtifactError(f"{name}: not a readable .npz file ({err})") from err
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise ArtifactError(f"{name}: not an .npz archive (found a single .npy array)")
    arrays = {}
    with archive:
        for key in archive.files:
            try:
                arrays[key] = archive[key]
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
                raise ArtifactError(f"{name}: '{key}' cannot be read ({err})") from err
    return arrays


def read_json(path: Path, name: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ArtifactError(f"{name}: not readable JSON ({err})") from err


# ----------------------------------------------------------------------------------------
# Expected parameter shapes, from the model definitions
# ----------------------------------------------------------------------------------------


def _dummy_inputs(config: ArtifactConfig):
    """A batch of one user with the config's shapes (values are irrelevant to shapes)."""
    from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings

    S, C, D, A = (
        config.history_seq_len,
        config.candidate_seq_len,
        config.emb_size,
        config.num_actions,
    )
    nU, nI, nA = config.num_user_hashes, config.num_item_hashes, config.num_author_hashes
    ints = lambda *shape: np.zeros(shape, np.int32)
    floats = lambda *shape: np.zeros(shape, np.float32)
    batch = RecsysBatch(
        user_hashes=ints(1, nU),
        history_post_hashes=ints(1, S, nI),
        history_author_hashes=ints(1, S, nA),
        history_actions=ints(1, S, A),
        history_product_surface=ints(1, S),
        candidate_post_hashes=ints(1, C, nI),
        candidate_author_hashes=ints(1, C, nA),
        candidate_product_surface=ints(1, C),
    )
    embeddings = RecsysEmbeddings(
        user_embeddings=floats(1, nU, D),
        history_post_embeddings=floats(1, S, nI, D),
        candidate_post_embeddings=floats(1, C, nI, D),
        history_author_embeddings=floats(1, S, nA, D),
        candidate_author_embeddings=floats(1, C, nA, D),
    )
    return batch, embeddings


def _init_shapes(forward, *args) -> dict[str, tuple[int, ...]]:
    # JAX is imported here, not at module level, so corpus/example tools need no JAX
    import haiku as hk
    import jax

    init = hk.transform(forward).init
    tree = jax.eval_shape(lambda: init(jax.random.PRNGKey(0), *args))
    return {key: tuple(value.shape) for key, value in flatten_params(tree).items()}


@functools.lru_cache(maxsize=16)
def _ranker_shapes(config: ArtifactConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    model_config = config.ranker_config()
    forward = lambda batch, emb: model_config.make()(batch, emb)
    return tuple(sorted(_init_shapes(forward, *_dummy_inputs(config)).items()))


def retrieval_forward(config: ArtifactConfig):
    """Forward function that creates every retrieval parameter (both towers + temperature)."""
    import haiku as hk
    import jax.numpy as jnp

    model_config = config.retrieval_config()

    def forward(batch, embeddings, corpus, top_k):
        model = model_config.make()
        output = model(batch, embeddings, corpus, top_k)
        model.build_candidate_representation(batch, embeddings)
        # the published checkpoints carry the training temperature at top level
        hk.get_parameter("log_temperature", [], init=jnp.zeros)
        return output

    return forward


@functools.lru_cache(maxsize=16)
def _retrieval_shapes(config: ArtifactConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    corpus = np.zeros((1, config.emb_size), np.float32)
    forward = retrieval_forward(config)
    shapes = _init_shapes(lambda b, e: forward(b, e, corpus, 1), *_dummy_inputs(config))
    return tuple(sorted(shapes.items()))


def ranker_param_shapes(config: ArtifactConfig) -> dict[str, tuple[int, ...]]:
    """'module/param' -> shape of every ranker parameter."""
    return dict(_ranker_shapes(config))


def retrieval_param_shapes(config: ArtifactConfig) -> dict[str, tuple[int, ...]]:
    """'module/param' -> shape of every retrieval parameter (``~/log_temperature`` included)."""
    return dict(_retrieval_shapes(config))


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------


def flatten_params(params: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Haiku {module: {param: value}} -> {'module/param': value}."""
    return {
        f"{module}/{name}": value
        for module, group in params.items()
        for name, value in group.items()
    }


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{'module/param': value} -> Haiku {module: {param: value}} (module may contain '/')."""
    nested: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        module, _, name = key.rpartition("/")
        nested.setdefault(module, {})[name] = value
    return nested


def _describe_keys(keys: list[str], limit: int = 5) -> str:
    shown = ", ".join(f"'{k}'" for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _check_key_sets(
    found: Mapping[str, Any], expected: Mapping[str, Optional[tuple]], name: str, optional=()
) -> None:
    """Every expected key present (bar ``optional``) and nothing else; shapes may be None."""
    missing = sorted(set(expected) - set(found) - set(optional))
    if missing:
        shape = expected[missing[0]]
        detail = "" if shape is None else f" ('{missing[0]}' expected with shape {tuple(shape)})"
        raise ArtifactError(f"{name}: missing key {_describe_keys(missing)}{detail}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ArtifactError(f"{name}: unexpected key {_describe_keys(extra)}")


def _check_float_array(array: np.ndarray, key: str, name: str, shape: tuple) -> np.ndarray:
    """Exact shape, floating dtype, finite values; returns the array as float32."""
    if tuple(array.shape) != tuple(shape):
        raise ArtifactError(
            f"{name}: '{key}' has shape {tuple(array.shape)}, expected {tuple(shape)}"
        )
    if not np.issubdtype(array.dtype, np.floating):
        raise ArtifactError(f"{name}: '{key}' has dtype {array.dtype}, expected a float dtype")
    if not np.all(np.isfinite(array)):
        bad = int(np.size(array) - np.count_nonzero(np.isfinite(array)))
        raise ArtifactError(f"{name}: '{key}' has {bad} non-finite values (NaN or inf)")
    return array.astype(np.float32, copy=False)  # the models create float32 parameters


def check_params(
    flat: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    name: str,
    optional=(),
) -> dict[str, np.ndarray]:
    """Validate flat parameters against ``expected`` shapes; returns float32 copies."""
    _check_key_sets(flat, expected, name, optional)
    return {
        key: _check_float_array(np.asarray(flat[key]), key, name, expected[key])
        for key in sorted(flat)
    }


def _load_params(root: Path, relative: str, expected, optional=()) -> Params:
    flat = read_npz(_existing_file(root, relative), relative)
    return unflatten_params(check_params(flat, expected, relative, optional))


# ----------------------------------------------------------------------------------------
# Embedding tables
# ----------------------------------------------------------------------------------------


def expected_table_shapes(config: ArtifactConfig) -> dict[str, tuple[int, int]]:
    return {TABLE_KEYS[e]: (config.vocab_size(e), config.emb_size) for e in ENTITIES}


def check_tables(
    tables: Mapping[str, np.ndarray], config: ArtifactConfig, name: str = TABLES_FILE
) -> dict[str, np.ndarray]:
    """Validate the three hash tables ([vocab, emb_size], finite floats)."""
    expected = expected_table_shapes(config)
    _check_key_sets(tables, expected, name)
    return {
        key: _check_float_array(np.asarray(tables[key]), key, name, expected[key])
        for key in expected
    }


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


def load_config(directory: PathLike) -> ArtifactConfig:
    """Parse and validate ``<directory>/config.json``."""
    root = _artifact_root(directory)
    return ArtifactConfig.from_dict(read_json(_existing_file(root, CONFIG_FILE), CONFIG_FILE))


def save_config(directory: PathLike, config: ArtifactConfig) -> None:
    root = Path(directory).resolve()
    write_json(resolve_inside(root, CONFIG_FILE), config.to_dict())


# ----------------------------------------------------------------------------------------
# Artifacts (config + weights + tables)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifacts:
    """A validated artifact directory: config, both models' weights and the hash tables."""

    config: ArtifactConfig
    ranker_params: Params
    retrieval_params: Params
    tables: dict[str, np.ndarray]  # user_embeddings, item_embeddings, author_embeddings
    root: Optional[Path] = None

    def stacked_table(self) -> np.ndarray:
        """A new float32 [65 + U + I + A, D] table (see ``phoenix.hashing``)."""
        return stack_tables(*(self.tables[TABLE_KEYS[e]] for e in ENTITIES))

    def embedder(self) -> HashEmbedder:
        return HashEmbedder(self.config, self.stacked_table())


def load_artifacts(directory: PathLike) -> Artifacts:
    """Load and validate config, ranker and retrieval weights and the tables of ``directory``."""
    root = _artifact_root(directory)
    config = load_config(root)
    ranker = _load_params(root, RANKER_PARAMS_FILE, ranker_param_shapes(config))
    retrieval = _load_params(
        root, RETRIEVAL_PARAMS_FILE, retrieval_param_shapes(config), (LOG_TEMPERATURE_KEY,)
    )
    tables = check_tables(read_npz(_existing_file(root, TABLES_FILE), TABLES_FILE), config)
    return Artifacts(config, ranker, retrieval, tables, root)


def _as_numpy_tree(params: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in flatten_params(params).items()}


def save_artifacts(
    directory: PathLike,
    config: ArtifactConfig,
    ranker_params: Mapping[str, Mapping[str, Any]],
    retrieval_params: Mapping[str, Mapping[str, Any]],
    tables: Mapping[str, Any],
) -> None:
    """Validate, then write config.json, both weight files and embedding_tables.npz."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    ranker = check_params(
        _as_numpy_tree(ranker_params), ranker_param_shapes(config), RANKER_PARAMS_FILE
    )
    retrieval = check_params(
        _as_numpy_tree(retrieval_params),
        retrieval_param_shapes(config),
        RETRIEVAL_PARAMS_FILE,
        (LOG_TEMPERATURE_KEY,),
    )
    checked_tables = check_tables({k: np.asarray(v) for k, v in tables.items()}, config)
    save_config(root, config)
    write_npz(resolve_inside(root, RANKER_PARAMS_FILE), ranker)
    write_npz(resolve_inside(root, RETRIEVAL_PARAMS_FILE), retrieval)
    write_npz(resolve_inside(root, TABLES_FILE), checked_tables)


# ----------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """Retrieval corpus: unit candidate vectors of unique posts."""

    post_ids: np.ndarray  # int64 [N], unique, > 0
    embeddings: np.ndarray  # float32 [N, D], unit L2 norm
    author_ids: np.ndarray  # int64 [N]
    topics: Optional[np.ndarray] = None  # int64 [N]

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def to_arrays(self) -> dict[str, np.ndarray]:
        arrays = {
            "post_ids": self.post_ids,
            "candidate_representations": self.embeddings,
            "author_ids": self.author_ids,
        }
        if self.topics is not None:
            arrays["topics"] = self.topics
        return arrays


def _check_int_vector(array: np.ndarray, key: str, name: str, size: int) -> np.ndarray:
    if not np.issubdtype(array.dtype, np.integer):
        raise ArtifactError(f"{name}: '{key}' has dtype {array.dtype}, expected int64")
    if tuple(array.shape) != (size,):
        raise ArtifactError(f"{name}: '{key}' has shape {tuple(array.shape)}, expected ({size},)")
    return array.astype(np.int64, copy=False)


def _check_post_ids(post_ids: np.ndarray, name: str) -> np.ndarray:
    if post_ids.ndim != 1 or post_ids.shape[0] < 1:
        raise ArtifactError(
            f"{name}: 'post_ids' has shape {tuple(post_ids.shape)}, expected (N,) with N >= 1"
        )
    post_ids = _check_int_vector(post_ids, "post_ids", name, post_ids.shape[0])
    if np.any(post_ids <= 0):
        raise ArtifactError(f"{name}: 'post_ids' must be > 0, found {int(post_ids.min())}")
    unique, counts = np.unique(post_ids, return_counts=True)
    if unique.shape[0] != post_ids.shape[0]:
        duplicates = unique[counts > 1][:5].tolist()
        raise ArtifactError(f"{name}: 'post_ids' must be unique, found duplicates {duplicates}")
    return post_ids


def _check_unit_norms(embeddings: np.ndarray, name: str) -> None:
    norms = np.linalg.norm(embeddings.astype(np.float64), axis=-1)
    worst = int(np.argmax(np.abs(norms - 1.0)))
    if abs(norms[worst] - 1.0) > UNIT_NORM_TOLERANCE:
        raise ArtifactError(
            f"{name}: 'candidate_representations' row {worst} has L2 norm {norms[worst]:.6f}, "
            f"expected 1 (tolerance {UNIT_NORM_TOLERANCE})"
        )


def check_corpus(
    arrays: Mapping[str, np.ndarray], emb_size: Optional[int], name: str = CORPUS_FILE
) -> Corpus:
    """Validate corpus arrays; ``emb_size`` None skips the width check."""
    _check_key_sets(
        arrays, dict.fromkeys(CORPUS_KEYS + OPTIONAL_CORPUS_KEYS), name, OPTIONAL_CORPUS_KEYS
    )
    post_ids = _check_post_ids(np.asarray(arrays["post_ids"]), name)
    size = post_ids.shape[0]
    embeddings = np.asarray(arrays["candidate_representations"])
    width = emb_size if emb_size is not None else (embeddings.shape[-1] if embeddings.ndim else 0)
    embeddings = _check_float_array(embeddings, "candidate_representations", name, (size, width))
    _check_unit_norms(embeddings, name)
    author_ids = _check_int_vector(np.asarray(arrays["author_ids"]), "author_ids", name, size)
    topics = arrays.get("topics")
    if topics is not None:
        topics = _check_int_vector(np.asarray(topics), "topics", name, size)
    return Corpus(post_ids, embeddings, author_ids, topics)


def _corpus_location(path_or_dir: PathLike) -> tuple[Path, str]:
    """(containing directory, file name) of a corpus given as a file or a directory."""
    path = Path(path_or_dir)
    if path.is_dir():
        return path, CORPUS_FILE
    return path.parent, path.name


def load_corpus(path_or_dir: PathLike, config: Optional[ArtifactConfig] = None) -> Corpus:
    """Load ``corpus.npz`` (a file, or the one inside a directory) and validate it."""
    directory, filename = _corpus_location(path_or_dir)
    path = _existing_file(_artifact_root(directory), filename)
    emb_size = config.emb_size if config is not None else None
    return check_corpus(read_npz(path, filename), emb_size, filename)


def save_corpus(path: PathLike, corpus: Corpus) -> None:
    """Validate and write a corpus (to ``path``, or to ``path/corpus.npz`` for a directory)."""
    directory, filename = _corpus_location(path)
    directory.mkdir(parents=True, exist_ok=True)
    checked = check_corpus(corpus.to_arrays(), None, filename)
    write_npz(resolve_inside(directory, filename), checked.to_arrays())


# ----------------------------------------------------------------------------------------
# Example sequence
# ----------------------------------------------------------------------------------------

_HISTORY_FIELDS = (
    "history_post_ids",
    "history_author_ids",
    "history_actions",
    "history_product_surface",
    "history_dwell_seconds",
)
_CANDIDATE_FIELDS = ("candidate_post_ids", "candidate_author_ids", "candidate_product_surface")


@dataclass(frozen=True)
class ExampleSequence:
    """One user's request (history oldest to newest), named like the servers' inputs."""

    user_id: int
    history_post_ids: tuple[int, ...]
    history_author_ids: tuple[int, ...]
    history_actions: tuple[tuple[int, ...], ...]  # [S, num_actions] of 0/1
    history_product_surface: tuple[int, ...]
    history_dwell_seconds: tuple[float, ...]
    candidate_post_ids: tuple[int, ...]
    candidate_author_ids: tuple[int, ...]
    candidate_product_surface: tuple[int, ...]
    top_k: int

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "history_actions":
                value = [list(row) for row in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[field.name] = value
        return out

    @classmethod
    def from_dict(
        cls,
        d: Mapping[str, Any],
        source: str = EXAMPLE_FILE,
        config: Optional[ArtifactConfig] = None,
    ) -> ExampleSequence:
        """Parse and validate; with ``config``, also check action width and surfaces."""
        if not isinstance(d, Mapping):
            raise ArtifactError(f"{source}: expected a JSON object, found {type(d).__name__}")
        for field in dataclasses.fields(cls):
            if field.name not in d:
                raise ArtifactError(f"{source}: missing key '{field.name}'")
        values = {
            "user_id": _int_value(d["user_id"], "user_id", source),
            "top_k": _int_value(d["top_k"], "top_k", source, minimum=1),
            "history_actions": _action_rows(d["history_actions"], source),
            "history_dwell_seconds": _float_list(d["history_dwell_seconds"], source),
        }
        for key in _HISTORY_FIELDS + _CANDIDATE_FIELDS:
            if key not in values:
                values[key] = _int_list(d[key], key, source)
        sequence = cls(**values)
        sequence.check_lengths(source)
        if config is not None:
            sequence.check_against(config, source)
        return sequence

    def check_lengths(self, source: str) -> None:
        """History fields share one length, candidate fields another."""
        for group in (_HISTORY_FIELDS, _CANDIDATE_FIELDS):
            lengths = {key: len(getattr(self, key)) for key in group}
            if len(set(lengths.values())) > 1:
                raise ArtifactError(f"{source}: lengths differ between {lengths}")

    def check_against(self, config: ArtifactConfig, source: str) -> None:
        """Action rows of width num_actions; product surfaces inside their vocabulary."""
        for row in self.history_actions:
            if len(row) != config.num_actions:
                raise ArtifactError(
                    f"{source}: 'history_actions' rows have {len(row)} columns, "
                    f"expected num_actions = {config.num_actions}"
                )
        vocab = config.product_surface_vocab_size
        for key in ("history_product_surface", "candidate_product_surface"):
            if any(not 0 <= v < vocab for v in getattr(self, key)):
                raise ArtifactError(f"{source}: '{key}' values must lie in [0, {vocab})")


def _int_value(value: Any, key: str, source: str, minimum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArtifactError(f"{source}: '{key}' must be an integer, found {value!r}")
    if minimum is not None and value < minimum:
        raise ArtifactError(f"{source}: '{key}' must be >= {minimum}, found {value}")
    return value


def _int_list(value: Any, key: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ArtifactError(f"{source}: '{key}' must be a list, found {type(value).__name__}")
    return tuple(_int_value(v, key, source) for v in value)


def _float_list(value: Any, source: str) -> tuple[float, ...]:
    key = "history_dwell_seconds"
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) and v >= 0
        for v in value
    ):
        raise ArtifactError(f"{source}: '{key}' must be a list of finite numbers >= 0")
    return tuple(float(v) for v in value)


def _action_rows(value: Any, source: str) -> tuple[tuple[int, ...], ...]:
    key = "history_actions"
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise ArtifactError(f"{source}: '{key}' must be a list of lists of 0/1")
    rows = tuple(_int_list(row, key, source) for row in value)
    if any(v not in (0, 1) for row in rows for v in row):
        raise ArtifactError(f"{source}: '{key}' values must be 0 or 1")
    return rows


def load_example_sequence(
    directory: PathLike, config: Optional[ArtifactConfig] = None
) -> ExampleSequence:
    """Parse ``<directory>/example_sequence.json`` (checked against ``config`` if given)."""
    root = _artifact_root(directory)
    data = read_json(_existing_file(root, EXAMPLE_FILE), EXAMPLE_FILE)
    return ExampleSequence.from_dict(data, EXAMPLE_FILE, config)


def save_example_sequence(
    directory: PathLike, sequence: Union[ExampleSequence, Mapping[str, Any]]
) -> None:
    """Validate and write ``<directory>/example_sequence.json``."""
    data = sequence.to_dict() if isinstance(sequence, ExampleSequence) else dict(sequence)
    checked = ExampleSequence.from_dict(data, EXAMPLE_FILE)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    write_json(resolve_inside(root.resolve(), EXAMPLE_FILE), checked.to_dict())
