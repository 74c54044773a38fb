"""Per-request input checking for the served models (no Triton imports).

Every check raises ``InputError`` with the input's name, what was wrong and what was
expected; the Triton adapter turns it into an INVALID_ARG response for that request alone.
Arrays arrive as Triton delivers them: with a leading batch dimension (rows of the request).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np

from phoenix.serving import contracts


class InputError(ValueError):
    """A request's inputs are invalid; the message says which input and why."""


# The per-request limits are part of the models' contracts.
LIMITS = contracts.LIMITS

_KINDS = {"int": "iu", "float": "f"}


def _describe(array: np.ndarray) -> str:
    return f"{array.dtype} array of shape {tuple(array.shape)}"


def get_input(
    inputs: Mapping[str, np.ndarray],
    name: str,
    kind: str,
    ndim: int,
    required: bool = True,
) -> Optional[np.ndarray]:
    """The named input checked for dtype kind ('int'/'float') and rank (batch dim included)."""
    array = inputs.get(name)
    if array is None:
        if required:
            raise InputError(f"missing required input '{name}'")
        return None
    array = np.asarray(array)
    if array.dtype.kind not in _KINDS[kind]:
        raise InputError(f"input '{name}': expected {kind} values, got {_describe(array)}")
    if array.ndim != ndim:
        raise InputError(
            f"input '{name}': expected {ndim} dimensions (batch first), got {_describe(array)}"
        )
    if array.shape[0] < 1 or array.shape[0] > LIMITS.max_rows:
        raise InputError(
            f"input '{name}': batch of {array.shape[0]} rows, expected 1..{LIMITS.max_rows}"
        )
    if kind == "float" and not np.all(np.isfinite(array)):
        raise InputError(f"input '{name}': contains NaN or infinite values")
    return array


def check_unknown_inputs(inputs: Mapping[str, np.ndarray], known: set[str]) -> None:
    unknown = sorted(set(inputs) - known)
    if unknown:
        raise InputError(f"unknown inputs {unknown}; expected some of {sorted(known)}")


def check_same_rows(arrays: Mapping[str, Optional[np.ndarray]]) -> int:
    """All present inputs carry the same number of batch rows; returns it."""
    rows = {name: a.shape[0] for name, a in arrays.items() if a is not None}
    if len(set(rows.values())) > 1:
        raise InputError(f"inputs disagree on the batch size (first dimension): {rows}")
    return next(iter(rows.values()))


def check_same_length(arrays: Mapping[str, Optional[np.ndarray]], what: str) -> int:
    """All present inputs have the same length on axis 1; returns it."""
    lengths = {name: a.shape[1] for name, a in arrays.items() if a is not None}
    if len(set(lengths.values())) > 1:
        raise InputError(f"{what} inputs must have the same length, got {lengths}")
    return next(iter(lengths.values()), 0)


def check_ids(name: str, ids: np.ndarray, minimum: int = 0) -> None:
    if ids.size and ids.min() < minimum:
        raise InputError(f"input '{name}': ids must be >= {minimum}, got {int(ids.min())}")


def check_range(name: str, values: np.ndarray, low: float, high: float, what: str) -> None:
    """Values in [low, high]."""
    if values.size and (values.min() < low or values.max() > high):
        raise InputError(
            f"input '{name}': {what} must lie in [{low}, {high}], "
            f"got values in [{values.min()}, {values.max()}]"
        )


def check_limit(name: str, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise InputError(f"input '{name}': {size} {what}, at most {limit} allowed")
