"""Posts' semantic IDs in a corpus store: their width (the manifest's ``semantic_ids``), the
checks of an ingested line's codes and of a column of them.

A post's semantic ID is ``levels`` codes, each in [0, ``codebook_size``]: 1..codebook_size
are codes, 0 is "none at this level" (``phoenix.feed_features``); a post stored without one
reads as all zeros. A segment keeps its posts' codes as ``semantic_ids.npy`` (uint16 [n,
levels]) when any of them has one; a segment without the file holds none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from phoenix.feed_features import SID_CODEBOOK_SIZE, SID_NUM_LEVELS

FILE_DTYPE = np.uint16  # on disk: codes up to 65,535
MAX_CODEBOOK = int(np.iinfo(FILE_DTYPE).max)


@dataclass(frozen=True)
class SemanticIdSpec:
    """How many codes a post's semantic ID has, and the largest code."""

    levels: int = SID_NUM_LEVELS
    codebook_size: int = SID_CODEBOOK_SIZE

    def __post_init__(self) -> None:
        if self.levels < 1 or not 1 <= self.codebook_size <= MAX_CODEBOOK:
            raise ValueError(
                f"semantic IDs of {self.levels} levels and codebook {self.codebook_size}: "
                f"expected >= 1 level and a codebook in [1, {MAX_CODEBOOK}]"
            )

    def describe(self) -> str:
        return f"{self.levels} integers in [0, {self.codebook_size}]"

    def zeros(self, rows: int) -> np.ndarray:
        """int32 [rows, levels]: no semantic IDs."""
        return np.zeros((rows, self.levels), np.int32)

    def parse(self, value: Any) -> Optional[tuple[int, ...]]:
        """The codes of a JSON value (a list of ``levels`` integers in range; null: none),
        or ValueError saying what was expected."""
        if value is None:
            return None
        expected = f"expected a list of {self.describe()}"
        if not isinstance(value, list) or len(value) != self.levels:
            raise ValueError(f"'semantic_ids' is {value!r}, {expected}")
        for code in value:
            if isinstance(code, bool) or not isinstance(code, int):
                raise ValueError(f"'semantic_ids' is {value!r}, {expected}")
            if not 0 <= code <= self.codebook_size:
                raise ValueError(f"'semantic_ids' holds {code}, {expected}")
        return tuple(value)

    def check(self, codes: Any, rows: int, where: str) -> np.ndarray:
        """``codes`` as int32 [rows, levels] if every one is an integer in range, or
        ValueError naming ``where``."""
        array = np.asarray(codes)
        if array.shape != (rows, self.levels) or not np.issubdtype(array.dtype, np.integer):
            raise ValueError(
                f"{where}: semantic_ids {array.dtype} {array.shape}, expected integers "
                f"[{rows}, {self.levels}] (the store's semantic ID width)"
            )
        if array.size and (array.min() < 0 or array.max() > self.codebook_size):
            raise ValueError(
                f"{where}: semantic_ids hold codes in [{int(array.min())}, {int(array.max())}], "
                f"expected [0, {self.codebook_size}]"
            )
        return array.astype(np.int32)

    def to_dict(self) -> dict[str, int]:
        return {"levels": self.levels, "codebook_size": self.codebook_size}


def spec_of(data: Any, where: str) -> SemanticIdSpec:
    """The spec of a manifest's ``semantic_ids`` entry (absent: the defaults, what stores made
    before the entry existed take), or ValueError naming ``where``."""
    if data is None:
        return SemanticIdSpec()
    if not isinstance(data, dict):
        raise ValueError(f"{where}: 'semantic_ids' is {data!r}, expected an object")

    def integer(name: str) -> int:
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: 'semantic_ids' {name} is {value!r}, expected an integer")
        return value

    levels, codebook = integer("levels"), integer("codebook_size")
    try:
        return SemanticIdSpec(levels, codebook)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
