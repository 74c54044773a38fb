"""Batch and candidate buckets, padding and the per-platform defaults of the engines.

Every jitted program is compiled for a few bucketed shapes, so requests are padded up to the
nearest bucket; these helpers pick the bucket, pad, take a batch's users, and make example
inputs of a config's shapes (what warm-up compiles for).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.recsys_model import NUM_CONTINUOUS, REFERENCE_TIME, RecsysBatch, RecsysEmbeddings

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_TOP_K_BUCKETS = (64, 256, 1024, 2048)


def default_max_rows_per_call() -> Optional[int]:
    """Users x candidates per chunk call on CPUs (None: no limit on accelerators).

    Measured on 2 cores (mini config, 8 users, 1024 candidates): 161 ms in calls of two users
    against 206 ms in one call; past ~2048 rows the [users, heads, rows, T] attention arrays
    spill the caches.
    """
    return 2048 if jax.default_backend() == "cpu" else None


def default_joint_rows() -> int:
    """Users x candidates at or under which the ranker runs context and candidates as one pass
    (``DeviceRanker``'s joint pass); 0: never. Not yet chosen by a measurement: off."""
    return 0


def default_compute_dtype() -> Any:
    """bfloat16 on accelerators (the original forward dtype), float32 on CPUs."""
    return jnp.float32 if jax.default_backend() == "cpu" else jnp.bfloat16


def bucket_for(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= size (the largest bucket if none is)."""
    for bucket in buckets:
        if size <= bucket:
            return bucket
    return buckets[-1]


def batch_slices(n: int, buckets: Sequence[int]):
    """Split n rows into slices of at most the largest bucket, each with its padded size."""
    largest = buckets[-1]
    for start in range(0, n, largest):
        stop = min(n, start + largest)
        yield slice(start, stop), bucket_for(stop - start, buckets)


def pad_axis(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """Zero-pad ``x`` along ``axis`` up to ``size``."""
    missing = size - x.shape[axis]
    if missing <= 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, missing)
    return np.pad(x, widths)


def take_users(
    batch: RecsysBatch, emb: RecsysEmbeddings, rows: slice
) -> tuple[RecsysBatch, RecsysEmbeddings]:
    """The users ``rows`` of a batch and its embeddings (absent fields stay None)."""
    take = lambda x: None if x is None else np.asarray(x)[rows]  # noqa: E731
    emb_fields: dict[str, Any] = {
        f.name: take(getattr(emb, f.name)) for f in dataclasses.fields(emb)
    }
    return RecsysBatch._make(take(x) for x in batch), RecsysEmbeddings(**emb_fields)


def example_inputs(
    config,
    users: int,
    candidates: int,
    *,
    with_continuous=False,
    with_timestamps=False,
    seed=0,
    num_actions: Optional[int] = None,
) -> tuple[RecsysBatch, RecsysEmbeddings]:
    """Random valid (batch, embeddings) of the config's shapes, for warm-up and tests; a config
    without ``num_actions`` (the retrieval model's) takes ``num_actions``, else 19."""
    rng = np.random.default_rng(seed)
    hashes = config.hash_config
    S, D = config.history_seq_len, config.emb_size
    width: int = num_actions if num_actions is not None else getattr(config, "num_actions", 19)
    ints = lambda *shape: rng.integers(1, 1000, size=shape).astype(np.int32)  # noqa: E731
    normal = lambda *shape: rng.normal(size=shape + (D,)).astype(np.float32)  # noqa: E731
    batch = RecsysBatch(
        user_hashes=ints(users, hashes.num_user_hashes),
        history_post_hashes=ints(users, S, hashes.num_item_hashes),
        history_author_hashes=ints(users, S, hashes.num_author_hashes),
        history_actions=(rng.random((users, S, width)) > 0.7).astype(np.float32),
        history_product_surface=rng.integers(0, config.product_surface_vocab_size, (users, S)),
        candidate_post_hashes=ints(users, candidates, hashes.num_item_hashes),
        candidate_author_hashes=ints(users, candidates, hashes.num_author_hashes),
        candidate_product_surface=rng.integers(
            0, config.product_surface_vocab_size, (users, candidates)
        ),
        history_continuous_actions=(
            rng.exponential(10.0, (users, S, NUM_CONTINUOUS)).astype(np.float32)
            if with_continuous
            else None
        ),
        candidate_impr_ts=(
            np.full((users, candidates), REFERENCE_TIME, np.int64) if with_timestamps else None
        ),
        candidate_post_creation_ts=(
            REFERENCE_TIME - rng.integers(0, 100 * 3600, (users, candidates))
            if with_timestamps
            else None
        ),
    )
    emb = RecsysEmbeddings(
        user_embeddings=normal(users, hashes.num_user_hashes),
        history_post_embeddings=normal(users, S, hashes.num_item_hashes),
        candidate_post_embeddings=normal(users, candidates, hashes.num_item_hashes),
        history_author_embeddings=normal(users, S, hashes.num_author_hashes),
        candidate_author_embeddings=normal(users, candidates, hashes.num_author_hashes),
    )
    return batch, emb
