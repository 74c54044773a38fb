"""Raw ids to rows of the hashed embedding table, and the gather of those rows.

Hash j of an entity (user, item, author, IP; ``HashConfig`` holds each one's scales, biases,
modulus and table size) maps a raw id to the table row

    0                                                            if id == 0 (padding)
    offset + ((id * scale_j + bias_j) mod modulus) mod (size - 1) + 1    otherwise

where ``id * scale_j + bias_j`` wraps around in int64 and ``mod`` is the non-negative remainder
(X's Python and Rust code compute it so). ``offset`` is the row before the entity's table
(``HashConfig.offset``). A user table of size 0 gives [1, 0, ...] for any nonzero id, an IP
table of size 0 all zeros, as X's code does.

The gather (``gather_rows``) is a separate step: reference data and X's own serving path
hand the forward the rows already gathered on the host (``HashedRows``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.production.config import HashConfig
from phoenix.production.inputs import HashedRows, RankingInputs


def _hash(ids, scales, biases, modulus: int, table_size: int, offset: int) -> np.ndarray:
    """int32 [..., len(scales)] rows for int64 ``ids`` [...]."""
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64)[..., None]  # uint64 above 2**63 wraps, as the int64 wire does
    with np.errstate(over="ignore"):  # wrapping is the definition
        mixed = ids * np.asarray(scales, np.int64) + np.asarray(biases, np.int64)
    buckets = np.remainder(mixed, np.int64(modulus))  # the divisor's sign: [0, modulus)
    rows = np.remainder(buckets, np.int64(table_size - 1)) + 1 + offset
    return np.where(ids == 0, 0, rows).astype(np.int32)


def hash_user_ids(ids, config: HashConfig) -> np.ndarray:
    """User ids [...] -> rows int32 [..., num_user_hashes]."""
    if config.user_table_size == 0:  # one marker row for any user
        rows = np.zeros(np.shape(ids) + (config.num_user_hashes,), np.int32)
        rows[..., 0] = np.asarray(ids) != 0
        return rows
    return _hash(
        ids, config.user_scales, config.user_biases, config.user_modulus,
        config.user_table_size, config.offset("user"),
    )  # fmt: skip


def hash_item_ids(ids, config: HashConfig) -> np.ndarray:
    """Post ids [...] -> rows int32 [..., num_item_hashes]."""
    buckets = config.item_hash_vocab_size or config.item_table_size
    return _hash(
        ids, config.item_scales, config.item_biases, config.item_modulus,
        buckets, config.offset("item"),
    )  # fmt: skip


def hash_author_ids(ids, config: HashConfig) -> np.ndarray:
    """Author ids [...] -> rows int32 [..., num_author_hashes]."""
    return _hash(
        ids, config.author_scales, config.author_biases, config.author_modulus,
        config.author_table_size, config.offset("author"),
    )  # fmt: skip


def hash_ip_ids(ids, config: HashConfig) -> np.ndarray:
    """IP ids [...] -> rows int32 [..., num_ip_hashes]."""
    if config.ip_table_size == 0:
        return np.zeros(np.shape(ids) + (config.num_ip_hashes,), np.int32)
    return _hash(
        ids, config.ip_scales, config.ip_biases, config.ip_modulus,
        config.ip_table_size, config.offset("ip"),
    )  # fmt: skip


def gather_rows(table: jax.Array, inputs: RankingInputs) -> HashedRows:
    """The table's rows for every hash of ``inputs`` (table [V, W]; rows keep its dtype).

    Hashes outside the table are clipped to its last row: check them on the host
    (``check_rows_in_table``) where they may come from outside.
    """
    take = lambda hashes: jnp.take(table, hashes, axis=0, mode="clip")  # noqa: E731
    return HashedRows(
        user=take(inputs.user.hashes),  # [B, nU, W]
        user_ip=take(inputs.user.ip_hashes),  # [B, nIP, W]
        history_posts=take(inputs.history.post_hashes),  # [B, H, nI, W]
        history_authors=take(inputs.history.author_hashes),  # [B, H, nA, W]
        candidate_posts=take(inputs.candidates.post_hashes),  # [B, C, nI, W]
        candidate_authors=take(inputs.candidates.author_hashes),  # [B, C, nA, W]
    )


def check_rows_in_table(inputs: RankingInputs, num_rows: int) -> None:
    """Raise ValueError naming the first hash field with a row outside [0, num_rows)."""
    fields = {
        "user.hashes": inputs.user.hashes,
        "user.ip_hashes": inputs.user.ip_hashes,
        "history.post_hashes": inputs.history.post_hashes,
        "history.author_hashes": inputs.history.author_hashes,
        "candidates.post_hashes": inputs.candidates.post_hashes,
        "candidates.author_hashes": inputs.candidates.author_hashes,
    }
    for name, hashes in fields.items():
        hashes = np.asarray(hashes)
        if hashes.size and (hashes.min() < 0 or hashes.max() >= num_rows):
            raise ValueError(
                f"{name}: rows must lie in [0, {num_rows}) (the table's rows), "
                f"got [{hashes.min()}, {hashes.max()}]"
            )
