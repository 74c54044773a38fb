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

The package splits along the files' seams: ``files`` (paths, writers, readers, shared array
checks), ``params`` (parameter shapes and checks, tables, config, whole artifact directories),
``corpus`` and ``example`` (the example request). This module re-exports their names.

``xai`` (with ``xai_integrity``) reads another layout, the checkpoints of X's production ranker
(xrex: an Orbax state, checksums, the run's config); import it as ``phoenix.checkpoint.xai``
(also ``python -m phoenix.checkpoint.xai DIR``). It imports orbax-checkpoint and tensorstore
only when it loads.

May import the model layer (``phoenix.config``, the original-compatible modules) only, and
``xai`` orbax-checkpoint and tensorstore.
"""

from phoenix.checkpoint.corpus import (
    CORPUS_KEYS,
    OPTIONAL_CORPUS_KEYS,
    UNIT_NORM_TOLERANCE,
    Corpus,
    check_corpus,
    load_corpus,
    load_post_dates,
    save_corpus,
)
from phoenix.checkpoint.example import (
    ExampleSequence,
    load_example_sequence,
    save_example_sequence,
)
from phoenix.checkpoint.files import (
    CONFIG_FILE,
    CORPUS_FILE,
    EXAMPLE_FILE,
    RANKER_PARAMS_FILE,
    RETRIEVAL_PARAMS_FILE,
    TABLES_FILE,
    PathLike,
    read_json,
    read_npz,
    resolve_inside,
    write_json,
    write_npz,
)
from phoenix.checkpoint.params import (
    LOG_TEMPERATURE_KEY,
    TABLE_KEYS,
    Artifacts,
    Params,
    check_params,
    check_tables,
    expected_table_shapes,
    flatten_params,
    load_artifacts,
    load_config,
    ranker_param_shapes,
    retrieval_forward,
    retrieval_param_shapes,
    save_artifacts,
    save_config,
    unflatten_params,
)
from phoenix.config import ArtifactError

# Every name the single-module checkpoint had, so its importers keep working.
__all__ = [
    "ArtifactError",
    "Artifacts",
    "CONFIG_FILE",
    "CORPUS_FILE",
    "CORPUS_KEYS",
    "Corpus",
    "EXAMPLE_FILE",
    "ExampleSequence",
    "LOG_TEMPERATURE_KEY",
    "OPTIONAL_CORPUS_KEYS",
    "Params",
    "PathLike",
    "RANKER_PARAMS_FILE",
    "RETRIEVAL_PARAMS_FILE",
    "TABLES_FILE",
    "TABLE_KEYS",
    "UNIT_NORM_TOLERANCE",
    "check_corpus",
    "check_params",
    "check_tables",
    "expected_table_shapes",
    "flatten_params",
    "load_artifacts",
    "load_config",
    "load_corpus",
    "load_post_dates",
    "load_example_sequence",
    "ranker_param_shapes",
    "read_json",
    "read_npz",
    "resolve_inside",
    "retrieval_forward",
    "retrieval_param_shapes",
    "save_artifacts",
    "save_config",
    "save_corpus",
    "save_example_sequence",
    "unflatten_params",
    "write_json",
    "write_npz",
]
