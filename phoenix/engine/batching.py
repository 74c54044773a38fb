"""Batch and candidate buckets, padding and the per-platform defaults of the engine.

Every jitted program is compiled for a few bucketed shapes, so requests are padded up to the
nearest bucket; these helpers pick the bucket and pad.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16)
DEFAULT_TOP_K_BUCKETS = (64, 256, 1024, 2048)


def default_max_rows_per_call() -> Optional[int]:
    """Users x candidates per chunk call on CPUs (None: no limit on accelerators).

    Measured on 2 cores (mini config, 8 users, 1024 candidates): 161 ms in calls of two users
    against 206 ms in one call; past ~2048 rows the [users, heads, rows, T] attention arrays
    spill the caches.
    """
    return 2048 if jax.default_backend() == "cpu" else None


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
