"""The parts every generated artifact directory is made of, whatever its ranker family:
presets, seeded streams, random weights, hash tables, a corpus and an example request
(``phoenix.artifacts`` assembles the original family's directory from them,
``phoenix.production_artifacts`` the production family's). Each array comes from its own
seeded stream, so the same preset and seed always give byte-identical arrays.
"""

from __future__ import annotations

import dataclasses
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phoenix import checkpoint
from phoenix.checkpoint import Corpus, ExampleSequence
from phoenix.config import ArtifactConfig, action_names_for
from phoenix.config_parts import ENTITIES, EntityHashParams, HashParams
from phoenix.engine.candidate_tower import CandidateTower

HASH_MODULUS = 2**61 - 1  # a Mersenne prime
HASH_TABLE_STD = 0.3  # large enough that candidates' own features move the scores
SCALE_NOISE_STD = 0.05
NUM_TOPICS = 16
MAX_TOP_K = 100

# Feature tables looked up by index rather than matrices applied to activations.
FEATURE_TABLES = (
    "action_projection",
    "product_surface_embedding_table",
    "post_age_embedding_table",
)


@dataclass(frozen=True)
class Preset:
    """Model shape, vocabularies and corpus size of a generated artifact set."""

    emb_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    key_size: int
    history_seq_len: int
    candidate_seq_len: int
    user_vocab_size: int
    item_vocab_size: int
    author_vocab_size: int
    corpus_size: int
    num_authors: int  # distinct authors in the corpus
    num_actions: int = 19
    num_hashes: int = 2
    widening_factor: float = 2.0
    attn_output_multiplier: float = 0.125
    product_surface_vocab_size: int = 16
    post_age_granularity_mins: int = 60


PRESETS = {
    # fields in order: emb, layers, heads, kv heads, key size, history, candidates,
    # user / item / author vocabulary, corpus posts, corpus authors
    "tiny": Preset(32, 2, 2, 2, 16, 12, 6, 1_000, 1_000, 1_000, 500, 100),  # golden's shapes
    "mini": Preset(128, 4, 4, 4, 32, 127, 64, 20_000, 100_000, 20_000, 20_000, 2_000),  # published
}


# ----------------------------------------------------------------------------------------
# Seeded streams
# ----------------------------------------------------------------------------------------


def stream(seed: int, *names: str) -> np.random.Generator:
    """An independent generator per (seed, name...): adding an array never shifts the others."""
    return np.random.default_rng([seed] + [zlib.crc32(name.encode()) for name in names])


# ----------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------


def random_entity_hash(rng: np.random.Generator, num_hashes: int) -> EntityHashParams:
    """Odd scales and biases below the modulus (odd scales keep the map a bijection mod 2**64)."""
    draw = lambda: tuple(int(v) * 2 + 1 for v in rng.integers(0, HASH_MODULUS // 2, num_hashes))
    return EntityHashParams(scales=draw(), biases=draw(), modulus=HASH_MODULUS)


def preset_config(preset: Preset, seed: int) -> ArtifactConfig:
    """The artifact config of ``preset`` (its fields of the same name; each entity gets
    ``num_hashes`` hash functions) with hash functions drawn from ``seed``."""
    hashes = {
        entity: random_entity_hash(stream(seed, "hash", entity), preset.num_hashes)
        for entity in ENTITIES
    }
    config_fields = {field.name for field in dataclasses.fields(ArtifactConfig)}
    same_named = {k: v for k, v in dataclasses.asdict(preset).items() if k in config_fields}
    per_entity: dict[str, Any] = {f"num_{entity}_hashes": preset.num_hashes for entity in ENTITIES}
    return ArtifactConfig(
        **same_named,
        **per_entity,
        action_names=action_names_for(preset.num_actions),
        hash_params=HashParams(**hashes),
    )


# ----------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


def random_param(key: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """One parameter: scalars 0, norm scales ~1, feature tables and matrices ~N(0, 1/fan)."""
    if not shape:
        return np.zeros((), np.float32)  # log_temperature: unused at inference
    if len(shape) == 1:
        return 1.0 + _normal(rng, shape, SCALE_NOISE_STD)
    if key.rpartition("/")[2] in FEATURE_TABLES:
        # a looked-up row should have roughly unit norm, like a projected activation
        return _normal(rng, shape, 1.0 / np.sqrt(shape[-1]))
    return _normal(rng, shape, 1.0 / np.sqrt(shape[0]))  # keeps activations' scale


def random_params(shapes: dict[str, tuple[int, ...]], seed: int, model: str):
    """Haiku-nested parameters for every 'module/param' of ``shapes``."""
    flat = {
        key: random_param(key, shape, stream(seed, model, key)) for key, shape in shapes.items()
    }
    return checkpoint.unflatten_params(flat)


def random_tables(config: ArtifactConfig, seed: int) -> dict[str, np.ndarray]:
    """Hash embedding tables ~ N(0, HASH_TABLE_STD), one stream per table."""
    return {
        key: _normal(stream(seed, "table", key), shape, HASH_TABLE_STD)
        for key, shape in checkpoint.expected_table_shapes(config).items()
    }


# ----------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------


def unique_positive_ids(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` distinct int64 ids in [1, 2**62), in random order."""
    ids = np.zeros(0, np.int64)
    while ids.shape[0] < count:
        drawn = np.concatenate([ids, rng.integers(1, 2**62, count, dtype=np.int64)])
        _, first = np.unique(drawn, return_index=True)
        ids = drawn[np.sort(first)]  # drop repeats, keep draw order
    return ids[:count]


def _posts_bar(total: int, shown: bool):
    from tqdm import tqdm

    return tqdm(
        total=total, desc="embedding corpus", unit="post", file=sys.stderr, disable=not shown
    )


def random_corpus(
    config: ArtifactConfig,
    retrieval_params,
    stacked_table: np.ndarray,
    preset: Preset,
    size: int,
    seed: int,
    progress: bool = False,
) -> Corpus:
    """Unique posts by a smaller pool of authors (each with a home topic), embedded."""
    rng = stream(seed, "corpus")
    post_ids = unique_positive_ids(rng, size)
    authors = unique_positive_ids(rng, min(preset.num_authors, size))
    author_topics = rng.integers(0, NUM_TOPICS, len(authors), dtype=np.int64)
    which = rng.integers(0, authors.shape[0], size)
    tower = CandidateTower.from_weights(config, retrieval_params, stacked_table)
    with _posts_bar(size, progress) as bar:
        vectors = tower(post_ids, authors[which], bar.update)
    return Corpus(post_ids, vectors, authors[which], author_topics[which])


# ----------------------------------------------------------------------------------------
# Example request
# ----------------------------------------------------------------------------------------


def _random_actions(rng: np.random.Generator, length: int, num_actions: int) -> np.ndarray:
    """Sparse multi-hot engagements: every history item has at least one action."""
    actions = (rng.random((length, num_actions)) < 0.1).astype(np.int64)
    actions[np.arange(length), rng.integers(0, num_actions, length)] = 1
    return actions


def random_example(config: ArtifactConfig, corpus: Corpus, seed: int) -> ExampleSequence:
    """One user: a history of corpus posts (oldest first) and unseen candidates."""
    rng = stream(seed, "example")
    num_candidates = min(config.candidate_seq_len, max(len(corpus) // 2, 1))
    max_history = min(config.history_seq_len, len(corpus) - num_candidates)
    history_len = int(rng.integers((max_history + 1) // 2, max_history + 1))
    picks = rng.permutation(len(corpus))[: history_len + num_candidates]
    history, candidates = picks[:history_len], picks[history_len:]
    surfaces = config.product_surface_vocab_size
    return ExampleSequence(
        user_id=int(rng.integers(1, 2**62)),
        history_post_ids=tuple(corpus.post_ids[history].tolist()),
        history_author_ids=tuple(corpus.author_ids[history].tolist()),
        history_actions=tuple(
            tuple(row) for row in _random_actions(rng, history_len, config.num_actions).tolist()
        ),
        history_product_surface=tuple(rng.integers(0, surfaces, history_len).tolist()),
        history_dwell_seconds=tuple(np.round(rng.exponential(8.0, history_len), 2).tolist()),
        candidate_post_ids=tuple(corpus.post_ids[candidates].tolist()),
        candidate_author_ids=tuple(corpus.author_ids[candidates].tolist()),
        candidate_product_surface=tuple(rng.integers(0, surfaces, num_candidates).tolist()),
        top_k=min(MAX_TOP_K, len(corpus)),
    )


# ----------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationSummary:
    out_dir: Path
    config: ArtifactConfig
    corpus_size: int
    seconds: float
    file_sizes: dict[str, int]


def _file_sizes(out_dir: Path) -> dict[str, int]:
    return {
        str(path.relative_to(out_dir)): path.stat().st_size
        for path in sorted(out_dir.rglob("*"))
        if path.is_file()
    }
