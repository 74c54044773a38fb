"""Raw ids -> hash buckets -> rows of one stacked embedding table (numpy only).

Hash function j of an entity maps an id to
    0                                                       if id == 0 (padding)
    ((id * scale_j + bias_j) mod modulus) mod (V - 1) + 1   otherwise
where ``id * scale_j + bias_j`` wraps around in int64 (as the original serving code computes
it) and ``mod`` is the non-negative remainder of a positive modulus.

Servers keep the three hash tables in ONE stacked table so that a single gather serves every
entity: ``NUM_RESERVED_ROWS`` zero rows, then the user, item and author tables. Padding (hash 0)
maps to row 0, a zero row, whatever the entity.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from phoenix.config import ArtifactConfig
from phoenix.config_parts import ENTITIES, EntityHashParams

NUM_RESERVED_ROWS = 65
PADDING_ROW = 0


def _as_int64_ids(ids) -> np.ndarray:
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must be integers, got dtype {ids.dtype}")
    # uint64 ids above 2**63 wrap to negative int64, as the int64 wire format carries them
    return ids.astype(np.int64, copy=False)


def hash_ids(ids, params: EntityHashParams, vocab_size: int) -> np.ndarray:
    """Hash ids [...] with every function of ``params``: int64 [..., num_hashes] in [0, V)."""
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    with np.errstate(over="ignore"):  # wrapping is the definition, not an accident
        return hash_formula(
            np, _as_int64_ids(ids), params.scales, params.biases, params.modulus, vocab_size
        )


def hash_formula(xp, ids, scales, biases, modulus: int, vocab_size: int):
    """The hash of the module docstring for int64 ``ids`` [...] -> int64 [..., H], written
    once for any array module ``xp`` with numpy's API (numpy here, jax.numpy under x64 on
    the device)."""
    ids = ids[..., None]  # [..., 1]
    mixed = ids * xp.asarray(scales, xp.int64) + xp.asarray(biases, xp.int64)  # [..., H] wraps
    # remainder takes the divisor's sign, so a positive modulus gives a value in [0, modulus)
    buckets = xp.remainder(mixed, xp.int64(modulus))
    hashes = xp.remainder(buckets, xp.int64(vocab_size - 1)) + 1
    return xp.where(ids == 0, xp.int64(0), hashes)


def table_offsets(config: ArtifactConfig) -> dict[str, int]:
    """First stacked-table row of each entity's table."""
    offsets, start = {}, NUM_RESERVED_ROWS
    for entity in ENTITIES:
        offsets[entity] = start
        start += config.vocab_size(entity)
    return offsets


def stacked_num_rows(config: ArtifactConfig) -> int:
    """Rows of the stacked table: reserved rows plus the three vocabularies."""
    return NUM_RESERVED_ROWS + sum(config.vocab_size(entity) for entity in ENTITIES)


def stack_tables(user: np.ndarray, item: np.ndarray, author: np.ndarray) -> np.ndarray:
    """float32 [65 + U + I + A, D]: zero reserved rows, then the user, item, author tables."""
    tables = [np.asarray(t) for t in (user, item, author)]
    widths = {t.shape[-1] for t in tables}
    if any(t.ndim != 2 for t in tables) or len(widths) != 1:
        shapes = [t.shape for t in tables]
        raise ValueError(f"tables must be [vocab, D] with one D, got shapes {shapes}")
    reserved = np.zeros((NUM_RESERVED_ROWS, widths.pop()), dtype=np.float32)
    return np.concatenate([reserved] + [t.astype(np.float32, copy=False) for t in tables])


def table_rows(entity: str, hashes: np.ndarray, config: ArtifactConfig) -> np.ndarray:
    """Stacked-table rows of ``entity`` hashes: padding (0) -> row 0, else offset + hash."""
    offset = table_offsets(config)[entity]
    hashes = np.asarray(hashes, dtype=np.int64)
    return np.where(hashes == 0, np.int64(PADDING_ROW), hashes + offset)


class EntityHash(NamedTuple):
    """One entity's hash functions and its table's first row in the stacked table, as the
    device-side hashing (``phoenix.engine.device_ranking``) takes them."""

    scales: np.ndarray  # [h] int64
    biases: np.ndarray  # [h] int64
    modulus: int
    vocab_size: int
    table_offset: int


def entity_hashes(config: ArtifactConfig) -> dict[str, EntityHash]:
    """{'user' | 'item' | 'author': EntityHash} of an artifact config."""
    offsets = table_offsets(config)
    out = {}
    for entity in ENTITIES:
        params = config.hash_params.for_entity(entity)
        out[entity] = EntityHash(
            scales=np.asarray(params.scales, np.int64),
            biases=np.asarray(params.biases, np.int64),
            modulus=int(params.modulus),
            vocab_size=config.vocab_size(entity),
            table_offset=offsets[entity],
        )
    return out


class HashEmbedder:
    """Hashes raw ids in numpy and maps them to rows of one stacked table.

    Servers call ``hash_users`` / ``hash_items`` / ``hash_authors`` on the request's ids,
    feed the hashes to the model (they carry the padding mask) and gather ``table[rows]``
    on the device.
    """

    def __init__(self, config: ArtifactConfig, table: np.ndarray):
        expected = (stacked_num_rows(config), config.emb_size)
        if tuple(table.shape) != expected:
            raise ValueError(f"stacked table has shape {table.shape}, expected {expected}")
        self.config = config
        self.table = table

    def hash_entity(self, entity: str, ids) -> tuple[np.ndarray, np.ndarray]:
        """(hashes, rows) of raw ``ids`` [...]: both int64 [..., num_hashes]."""
        params = self.config.hash_params.for_entity(entity)
        hashes = hash_ids(ids, params, self.config.vocab_size(entity))
        return hashes, table_rows(entity, hashes, self.config)

    def hash_users(self, ids) -> tuple[np.ndarray, np.ndarray]:
        return self.hash_entity("user", ids)

    def hash_items(self, ids) -> tuple[np.ndarray, np.ndarray]:
        return self.hash_entity("item", ids)

    def hash_authors(self, ids) -> tuple[np.ndarray, np.ndarray]:
        return self.hash_entity("author", ids)

    def lookup(self, rows: np.ndarray) -> np.ndarray:
        """Host-side gather ``table[rows]`` (servers do this on the device instead)."""
        return np.take(self.table, rows, axis=0)
