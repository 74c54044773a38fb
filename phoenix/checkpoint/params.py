"""Model parameters and embedding tables: expected shapes (from the model definitions
themselves), flat 'module/param' keys, checks, and loading or saving a whole artifact directory."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np

from phoenix.checkpoint.files import (
    RANKER_PARAMS_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    PathLike,
    artifact_root,
    check_float_array,
    check_key_sets,
    existing_file,
    load_config,
    read_npz,
    resolve_inside,
    save_config,
    write_npz,
)
from phoenix.checkpoint.production import (
    ProductionRankerArtifacts,
    is_production,
    load_production_ranker,
    production_config,
    save_production_ranker,
)
from phoenix.config import ArtifactConfig
from phoenix.config_parts import ENTITIES
from phoenix.hashing import HashEmbedder, stack_tables

Params = dict[str, dict[str, np.ndarray]]

TABLE_KEYS = {entity: f"{entity}_embeddings" for entity in ENTITIES}
LOG_TEMPERATURE_KEY = "~/log_temperature"  # training-only scalar of the retrieval model


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


# (name, compute) -> compute()'s value, from the caller's cache of facts derived from the
# artifact config and the model code when it holds one under that name: a model instance
# passes its program store's (``ProgramStore.remembered``), so that it does not trace the
# model to learn the weights' shapes at every start (0.2-0.3 CPU-s each).
Remember = Callable[[str, Callable[[], Any]], Any]


@functools.cache
def _shapes_code() -> str:
    """What the expected shapes depend on besides the config and the model code (which the
    remembering cache is keyed by): this module (its dummy inputs, the retrieval forward), the
    config's parsing and Haiku's naming."""
    import haiku

    here = Path(__file__)
    source = here.read_bytes() + (here.parents[1] / "config_parts.py").read_bytes()
    source += haiku.__version__.encode()
    return hashlib.sha256(source).hexdigest()[:16]


def _remembered(kind: str, shapes: Callable[[], dict], remember: Optional[Remember]) -> dict:
    if remember is None:
        return shapes()

    def as_json() -> list:
        return sorted([key, list(shape)] for key, shape in shapes().items())

    rows = remember(f"{kind}-param-shapes-{_shapes_code()}", as_json)
    return {key: tuple(shape) for key, shape in rows}


def ranker_param_shapes(
    config: ArtifactConfig, remember: Optional[Remember] = None
) -> dict[str, tuple[int, ...]]:
    """'module/param' -> shape of every ranker parameter."""
    return _remembered("ranker", lambda: dict(_ranker_shapes(config)), remember)


def retrieval_param_shapes(
    config: ArtifactConfig, remember: Optional[Remember] = None
) -> dict[str, tuple[int, ...]]:
    """'module/param' -> shape of every retrieval parameter (``~/log_temperature`` included)."""
    return _remembered("retrieval", lambda: dict(_retrieval_shapes(config)), remember)


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


def check_params(
    flat: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    name: str,
    optional=(),
) -> dict[str, np.ndarray]:
    """Validate flat parameters against ``expected`` shapes; returns float32 copies."""
    check_key_sets(flat, expected, name, optional)
    return {
        key: check_float_array(np.asarray(flat[key]), key, name, expected[key])
        for key in sorted(flat)
    }


def _load_params(root: Path, relative: str, expected, optional=()) -> Params:
    flat = read_npz(existing_file(root, relative), relative)
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
    check_key_sets(tables, expected, name)
    return {
        key: check_float_array(np.asarray(tables[key]), key, name, expected[key])
        for key in expected
    }


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


# ----------------------------------------------------------------------------------------
# Artifacts (config + weights + tables)
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Artifacts:
    """A validated artifact directory: config, both models' weights and the hash tables (a
    part not asked of ``load_artifacts`` is None)."""

    config: ArtifactConfig
    ranker_params: Optional[Params]
    retrieval_params: Optional[Params]
    tables: Optional[dict[str, np.ndarray]]  # user_embeddings, item_embeddings, author_embeddings
    root: Optional[Path] = None
    # A production-family ranker (``checkpoint.production``), whose ranker_params are None.
    production_ranker: Optional[ProductionRankerArtifacts] = None

    def stacked_table(self) -> np.ndarray:
        """A new float32 [65 + U + I + A, D] table (see ``phoenix.hashing``)."""
        tables = self.tables
        assert tables is not None, "the hash tables were not loaded"
        return stack_tables(*(tables[TABLE_KEYS[e]] for e in ENTITIES))

    def embedder(self) -> HashEmbedder:
        return HashEmbedder(self.config, self.stacked_table())


def load_artifacts(
    directory: PathLike,
    *,
    ranker: bool = True,
    retrieval: bool = True,
    tables: bool = True,
    remember: Optional[Remember] = None,
) -> Artifacts:
    """Load and validate config, ranker and retrieval weights and the tables of ``directory``;
    a served model asks only for the parts it uses (each costs reading and shape checks). A
    production-family ranker comes as ``production_ranker`` (its ``ranker_params`` are None).
    ``remember``: where the expected shapes are kept between processes (``Remember``)."""
    root = artifact_root(directory)
    config = load_config(root)
    production = is_production(config)
    return Artifacts(
        config,
        _load_params(root, RANKER_PARAMS_FILE, ranker_param_shapes(config, remember))
        if ranker and not production
        else None,
        _load_params(
            root,
            RETRIEVAL_PARAMS_FILE,
            retrieval_param_shapes(config, remember),
            (LOG_TEMPERATURE_KEY,),
        )
        if retrieval
        else None,
        check_tables(read_npz(existing_file(root, TABLES_FILE), TABLES_FILE), config)
        if tables
        else None,
        root,
        load_production_ranker(root) if ranker and production else None,
    )


def _as_numpy_tree(params: Mapping[str, Mapping[str, Any]]) -> dict[str, np.ndarray]:
    return {key: np.asarray(value) for key, value in flatten_params(params).items()}


def save_artifacts(
    directory: PathLike,
    config: ArtifactConfig,
    ranker_params: Mapping[str, Mapping[str, Any]],
    retrieval_params: Mapping[str, Mapping[str, Any]],
    tables: Mapping[str, Any],
) -> None:
    """Validate, then write config.json, both weight files and embedding_tables.npz. A
    production-family config takes its ranker's parameters flat, by Haiku path, with its
    ``emb_table`` (``checkpoint.production``)."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    if is_production(config):
        ranker_config = production_config(config)
        ranker = None
    else:
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
    if ranker is None:
        save_production_ranker(root, ranker_config, ranker_params)  # type: ignore[arg-type]
    else:
        write_npz(resolve_inside(root, RANKER_PARAMS_FILE), ranker)
    write_npz(resolve_inside(root, RETRIEVAL_PARAMS_FILE), retrieval)
    write_npz(resolve_inside(root, TABLES_FILE), checked_tables)
