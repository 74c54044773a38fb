"""The parts of an artifact's config that stand alone: its error type, the int64 bounds, the
entity names, and the hash functions' parameters (``hash_params``) with their parsing and checks.

phoenix.config builds ``ArtifactConfig`` on them. Imports only the standard library.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
ENTITIES = ("user", "item", "author")


class ArtifactError(ValueError):
    """An artifact (config, weights, tables, corpus, example) is missing or malformed."""


@dataclass(frozen=True)
class EntityHashParams:
    """Multiply-add-mod hash functions of one entity type (one function per scale)."""

    scales: tuple[int, ...]
    biases: tuple[int, ...]
    modulus: int

    @property
    def num_hashes(self) -> int:
        return len(self.scales)

    def to_dict(self) -> dict[str, Any]:
        return {"scales": list(self.scales), "biases": list(self.biases), "modulus": self.modulus}


@dataclass(frozen=True)
class HashParams:
    """Hash functions of users, items (posts) and authors."""

    user: EntityHashParams
    item: EntityHashParams
    author: EntityHashParams

    def for_entity(self, entity: str) -> EntityHashParams:
        """The parameters of ``entity`` ('user', 'item' or 'author')."""
        if entity not in ENTITIES:
            raise ValueError(f"unknown entity {entity!r}, expected one of {ENTITIES}")
        return getattr(self, entity)

    def to_dict(self) -> dict[str, Any]:
        return {entity: self.for_entity(entity).to_dict() for entity in ENTITIES}


def required(d: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in d:
        raise ArtifactError(f"{source}: missing key '{key}'")
    return d[key]


def _parse_int_list(value: Any, key: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(is_int(v) for v in value):
        raise ArtifactError(f"{source}: '{key}' must be a list of integers, found {value!r}")
    return tuple(value)


_HASH_KEYS = ("scales", "biases", "modulus")


def _parse_entity_hash_params(value: Any, key: str, source: str) -> EntityHashParams:
    if not isinstance(value, Mapping):
        raise ArtifactError(f"{source}: '{key}' must be an object, found {type(value).__name__}")
    fields = {name: required(value, name, source=f"{source}: '{key}'") for name in _HASH_KEYS}
    modulus = fields["modulus"]
    if not is_int(modulus):
        raise ArtifactError(f"{source}: '{key}.modulus' must be an integer, found {modulus!r}")
    return EntityHashParams(
        scales=_parse_int_list(fields["scales"], f"{key}.scales", source),
        biases=_parse_int_list(fields["biases"], f"{key}.biases", source),
        modulus=modulus,
    )


def parse_hash_params(value: Any, source: str) -> HashParams:
    if not isinstance(value, Mapping):
        raise ArtifactError(
            f"{source}: 'hash_params' must be an object, found {type(value).__name__}"
        )
    entities = {
        entity: _parse_entity_hash_params(
            required(value, entity, source=f"{source}: 'hash_params'"),
            f"hash_params.{entity}",
            source,
        )
        for entity in ENTITIES
    }
    return HashParams(**entities)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int64_list(numbers: tuple[int, ...], key: str, source: str) -> None:
    if not isinstance(numbers, tuple) or not all(is_int(v) for v in numbers):
        raise ArtifactError(f"{source}: '{key}' must be integers, found {numbers!r}")
    for value in numbers:
        if not INT64_MIN <= value <= INT64_MAX:
            raise ArtifactError(f"{source}: '{key}' value {value} does not fit in int64")


def _check_entity_hash(params: Any, entity: str, expected: int, source: str) -> None:
    key = f"hash_params.{entity}"
    if not isinstance(params, EntityHashParams):
        raise ArtifactError(f"{source}: '{key}' must be EntityHashParams, found {params!r}")
    _check_int64_list(params.scales, f"{key}.scales", source)
    _check_int64_list(params.biases, f"{key}.biases", source)
    for name in ("scales", "biases"):
        count = len(getattr(params, name))
        if count != expected:
            raise ArtifactError(
                f"{source}: '{key}.{name}' has {count} entries, "
                f"expected num_{entity}_hashes = {expected}"
            )
    modulus = params.modulus
    if not is_int(modulus) or not 0 < modulus <= INT64_MAX:
        raise ArtifactError(
            f"{source}: '{key}.modulus' must be a positive int64, found {modulus!r}"
        )


def check_hash_params(values: Any, source: str) -> None:
    hash_params = field_of(values, "hash_params")
    if not isinstance(hash_params, HashParams):
        raise ArtifactError(f"{source}: 'hash_params' must be HashParams, found {hash_params!r}")
    for entity in ENTITIES:
        expected = field_of(values, f"num_{entity}_hashes")
        _check_entity_hash(getattr(hash_params, entity), entity, expected, source)


def field_of(values: Any, key: str) -> Any:
    """``key`` of a config given as a mapping (config.json) or an object (ArtifactConfig)."""
    return values[key] if isinstance(values, Mapping) else getattr(values, key)
