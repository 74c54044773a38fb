"""Artifact directories whose ranker is X's production ranker (docs/production.md, "Serving
it"): seeded random weights of a preset, or the parameters of one of X's checkpoints.

    phoenix-artifacts --ranker production --preset tiny --out build/production-tiny
    phoenix-artifacts --ranker production --preset nano --out build/production-nano
    phoenix-artifacts --ranker production --preset nano --out DIR \\
        --ranker-checkpoint /checkpoints/home_direct_packed_nano \\
        --ranker-override history_seq_len=1022 --ranker-override candidate_seq_len=64

Beside the ranker, the directory holds what every artifact directory holds (the two-tower
retrieval model, its hash tables, a corpus embedded with its candidate tower, an example
request), so the whole feed runs over it. Retrieval stays the two-tower model of the original
release, at the sizes of the original preset named in ``RETRIEVAL_PRESETS``; it shares the
ranker's history length, its 64 action slots (``feed_features.ACTION_SLOTS``) and its product
surfaces, so one request's history serves both. Every array comes from a seeded stream of its
own: the same preset and seed give byte-identical files.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from phoenix import checkpoint
from phoenix.artifact_parts import (
    PRESETS,
    GenerationSummary,
    Preset,
    _file_sizes,
    preset_config,
    random_corpus,
    random_example,
    random_params,
    random_tables,
    stream,
)
from phoenix.checkpoint import Corpus, ExampleSequence
from phoenix.checkpoint.production import (
    EMB_TABLE_KEY,
    production_config_from_xai,
    with_production_ranker,
)
from phoenix.config import ArtifactConfig
from phoenix.config_parts import ENTITIES
from phoenix.feed_examples import production_features
from phoenix.feed_features import ACTION_SLOTS
from phoenix.hashing import stack_tables

# X's nano ranker shrunk for tests: every feature's table as nano's (so the ranker contract's
# ranges hold), a small trunk, a history of 30 filling one 32-key block, small hash tables.
TINY_OVERRIDES = (
    "emb_size=32",
    "num_layers=2",
    "num_q_heads=2",
    "num_kv_heads=1",
    "key_size=16",
    "ffn_base_size=8",
    "history_seq_len=30",
    "candidate_seq_len=16",
    "attention_block=32",
    "emb_table_width=16",
    "sid_embed_dim=32",
    "engagement_count_mlp_hidden_dim=8",
    "user_table_size=1000",
    "item_table_size=1000",
    "author_table_size=500",
    "ip_table_size=100",
)
PRODUCTION_PRESETS: dict[str, tuple[str, ...]] = {"tiny": TINY_OVERRIDES, "nano": ()}
# The original preset whose two-tower retrieval goes beside each.
RETRIEVAL_PRESETS = {"tiny": "tiny", "nano": "mini"}


def ranker_config(
    preset: str, checkpoint_dir: Optional[Path] = None, overrides: Sequence[str] = ()
):
    """The production ranker's config: the preset's, or an X checkpoint's (its training
    config), with ``overrides`` (X's ``key=value``) last."""
    from phoenix.production.config import NANO, apply_overrides

    if preset not in PRODUCTION_PRESETS:
        raise ValueError(f"unknown preset {preset!r}, expected one of {sorted(PRODUCTION_PRESETS)}")
    if checkpoint_dir is None:
        return apply_overrides(NANO, [*PRODUCTION_PRESETS[preset], *overrides])
    from phoenix.checkpoint.xai import load_xai_checkpoint

    found = load_xai_checkpoint(checkpoint_dir, extra=[])  # the config and step only
    return production_config_from_xai(found.config, overrides)


def ranker_params(config, seed: int, checkpoint_dir: Optional[Path] = None) -> dict:
    """Seeded random parameters at X's initial scales with a table (row 0 zero), or those of
    an X checkpoint and its ``emb_table`` (float32)."""
    from phoenix.production.params import canonical_name, init_params

    if checkpoint_dir is None:
        return init_params(config, seed, table_rows=config.hashes.num_rows)
    from phoenix.checkpoint.xai import load_xai_checkpoint

    found = load_xai_checkpoint(checkpoint_dir, extra=[EMB_TABLE_KEY])
    params = {canonical_name(k): np.asarray(v, np.float32) for k, v in found.params.items()}
    if EMB_TABLE_KEY not in found.extra:
        raise ValueError(f"{checkpoint_dir}: the checkpoint holds no '{EMB_TABLE_KEY}'")
    params[EMB_TABLE_KEY] = np.asarray(found.extra[EMB_TABLE_KEY], np.float32)
    return params


def retrieval_preset(preset: str, ranker) -> Preset:
    """The original preset whose retrieval goes beside ``ranker``, sized to share its
    histories, action slots and surfaces."""
    return dataclasses.replace(
        PRESETS[RETRIEVAL_PRESETS[preset]],
        history_seq_len=ranker.history_seq_len,
        candidate_seq_len=ranker.candidate_seq_len,
        num_actions=len(ACTION_SLOTS),
        product_surface_vocab_size=ranker.product_surface_cardinality,
        post_age_granularity_mins=ranker.post_age_granularity_mins,
    )


def artifact_config(chosen: Preset, ranker, seed: int) -> ArtifactConfig:
    config = dataclasses.replace(preset_config(chosen, seed), action_names=ACTION_SLOTS)
    if ranker.output_vocab_size != len(ACTION_SLOTS):
        raise ValueError(
            f"the ranker predicts {ranker.output_vocab_size} action slots; the artifacts name "
            f"{len(ACTION_SLOTS)} (feed_features.ACTION_SLOTS)"
        )
    return with_production_ranker(config, ranker)


# ----------------------------------------------------------------------------------------
# The example request
# ----------------------------------------------------------------------------------------


def production_example(config: ArtifactConfig, corpus: Corpus, seed: int) -> ExampleSequence:
    """The artifacts' example user with the production ranker's features."""
    example = random_example(config, corpus, seed)
    features = production_features(
        stream(seed, "example", "production"),
        example.history_post_ids,
        example.candidate_post_ids,
    )
    return dataclasses.replace(example, features=features)


# ----------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------


def generate_production(
    preset: str,
    out_dir,
    seed: int = 0,
    corpus_size: Optional[int] = None,
    progress: bool = False,
    checkpoint_dir: Optional[Path] = None,
    overrides: Sequence[str] = (),
) -> GenerationSummary:
    """Write a complete production-family artifact directory to ``out_dir``."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    ranker = ranker_config(preset, checkpoint_dir, overrides)
    chosen = retrieval_preset(preset, ranker)
    size = chosen.corpus_size if corpus_size is None else corpus_size
    if size < 2:
        raise ValueError(f"corpus_size must be >= 2 (history and candidates), got {size}")
    config = artifact_config(chosen, ranker, seed)
    params = ranker_params(ranker, seed, checkpoint_dir)
    retrieval = random_params(checkpoint.retrieval_param_shapes(config), seed, "retrieval")
    tables = random_tables(config, seed)
    checkpoint.save_artifacts(out_dir, config, params, retrieval, tables)
    stacked = stack_tables(*(tables[checkpoint.TABLE_KEYS[e]] for e in ENTITIES))
    corpus = random_corpus(config, retrieval, stacked, chosen, size, seed, progress)
    checkpoint.save_corpus(out_dir / checkpoint.CORPUS_FILE, corpus)
    checkpoint.save_example_sequence(out_dir, production_example(config, corpus, seed))
    seconds = time.perf_counter() - started
    return GenerationSummary(out_dir, config, size, seconds, _file_sizes(out_dir))
