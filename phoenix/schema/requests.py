"""What every typed request of a served model does, and its checks (no Triton imports).

Each model's request type (``phoenix.schema.request_types``, written from the contracts by
``phoenix.ops.request_code``) is a frozen dataclass whose fields are the contract's inputs, in
contract order; an optional input is a field that defaults to None. Nothing here names an
input: adding one to a contract adds it to the typed request, to its checks and to its padded
batch (``batches``).

Triton has already checked each input against the model's ``config.pbtxt`` (generated from
the contract): its name, dtype, rank and fixed dims, that required inputs are present and that
the batch size is within ``max_batch_size``. What Triton cannot know is checked here, per
request, from the specs: lengths that must agree across inputs (a length symbol), the
per-request limit on each length, widths fixed by the loaded artifacts, and values (id ranges,
flags, NaN and infinities). Every failure is an ``InputError`` naming the input and what was
expected; the Triton adapter answers it with INVALID_ARG for that request alone.

Shape glossary (R rows of one request: users or posts)
  L  history items sent   C  candidates sent   A  num_actions   D  emb_size
  M  in-network posts sent
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import ClassVar, Optional, TypeVar, Union

import numpy as np

from phoenix.schema.contracts import LIMITS
from phoenix.schema.input_error import InputError  # raised here; re-exported
from phoenix.schema.spec import ARTIFACT_WIDTHS, LENGTH_LIMITS, ModelContract, TensorSpec

# What one unit of each symbolic axis is called in error messages.
LENGTH_NOUNS = {"L": "history items", "C": "candidates", "E": "ids", "N": "ids", "M": "posts",
                "K": "candidates", "C'": "posts"}  # fmt: skip
LENGTH_GROUPS = {
    "L": "history",
    "C": "candidate",
    "E": "excluded author",
    "N": "seen post",
    "M": "in-network",
    "K": "retrieved candidate",
    "C'": "feed",
}
WIDTH_NOUNS = {"A": "actions per item", "D": "values per row"}


class TypedRequest:
    """Behaviour shared by every generated request type (fields come from the contract)."""

    contract: ClassVar[ModelContract]
    checks: ClassVar[ContractChecks]  # the contract's checks, worked out once

    def arrays(self) -> dict[str, np.ndarray]:
        """{input name: array} of the inputs the request carries (absent optional ones left
        out), in contract order."""
        values = {spec.name: getattr(self, spec.name) for spec in self.contract.inputs}
        return {name: array for name, array in values.items() if array is not None}

    @property
    def rows(self) -> int:
        """R: users (or posts) in the request, the batch dimension of every input."""
        return getattr(self, self.contract.inputs[0].name).shape[0]

    def length(self, symbol: str) -> int:
        """How many items of a length symbol ("L", "C", ...) each row carries (checked equal
        across the inputs that share it)."""
        for name in self.checks.by_length.get(symbol, ()):
            array = getattr(self, name)
            if array is not None:
                return array.shape[1]
        raise KeyError(f"{self.contract.name} request carries no input of length {symbol}")

    @property
    def candidates(self) -> int:
        """C: candidates per user row."""
        return self.length("C")


@dataclasses.dataclass(frozen=True)
class InputCheck:
    """What the checks read of one input's spec, worked out once per contract: they run for
    every request, where looking specs up by name and testing dtypes cost more than the checks
    (with the ufuncs' own reduce, parsing a ranker request went from 165-167 to 89 us here)."""

    spec: TensorSpec
    name: str
    dtype: np.dtype
    fixed: tuple[tuple[int, int], ...]  # (axis, size) of each fixed axis; the batch axis is 0
    widths: tuple[tuple[int, str], ...]  # (axis, symbol) of each axis an artifact fixes
    is_float: bool
    length: Optional[str]  # the spec's length symbol
    ndim: int  # on the wire, the batch axis included

    @classmethod
    def of(cls, spec: TensorSpec) -> InputCheck:
        axes = list(enumerate(spec.axes, start=1))
        return cls(
            spec=spec,
            name=spec.name,
            dtype=np.dtype(spec.dtype),
            fixed=tuple((i, axis) for i, axis in axes if isinstance(axis, int)),
            widths=tuple((i, axis) for i, axis in axes if axis in ARTIFACT_WIDTHS),
            is_float=bool(np.issubdtype(spec.dtype, np.floating)),
            length=spec.length,
            ndim=spec.ndim,
        )


@dataclasses.dataclass(frozen=True)
class ContractChecks:
    """The checks of one model's inputs, in contract order (a typed request's ``checks``)."""

    inputs: tuple[InputCheck, ...]
    names: frozenset[str]
    required: tuple[str, ...]
    by_length: dict[str, tuple[str, ...]]  # {length symbol: names of its inputs, in order}

    @classmethod
    def of(cls, contract: ModelContract) -> ContractChecks:
        return cls(
            inputs=tuple(InputCheck.of(spec) for spec in contract.inputs),
            names=frozenset(contract.input_names),
            required=contract.required_inputs,
            by_length={
                symbol: tuple(s.name for s in contract.inputs if s.length == symbol)
                for symbol in dict.fromkeys(s.length for s in contract.inputs if s.length)
            },
        )


Request = TypeVar("Request", bound=TypedRequest)


def from_arrays(request_type: type[Request], arrays: Mapping[str, np.ndarray]) -> Request:
    """The typed request of ``arrays`` ({input name: array}), cast to the contract's dtypes.

    Triton refuses unknown and missing inputs before a request gets here; in-process callers
    (benchmarks, ``--check``) get the same refusal as an InputError.
    """
    contract: ModelContract = request_type.contract
    plan = request_type.checks
    if not plan.names.issuperset(arrays):
        unknown = sorted(set(arrays) - plan.names)
        raise InputError(f"unknown inputs {unknown}; {contract.name} takes {contract.input_names}")
    missing = [name for name in plan.required if name not in arrays]
    if missing:
        raise InputError(f"missing required inputs {missing} of {contract.name}")
    return request_type(
        **{c.name: np.asarray(arrays[c.name], c.dtype) for c in plan.inputs if c.name in arrays}
    )


def parse(request_type: type[Request], arrays: Mapping[str, np.ndarray], config) -> Request:
    """The checked typed request of ``arrays``; raises InputError."""
    request = from_arrays(request_type, arrays)
    check(request, config)
    return request


def parse_all(
    request_type: type[Request], batch: Sequence[Mapping[str, np.ndarray]], config
) -> list[Union[Request, InputError]]:
    """``parse`` of each request of ``batch``: its typed request, or the InputError ``parse``
    raises for it, the same one. The shapes are checked request by request; the values of the
    requests whose shapes hold are checked together, an input's values of every request at
    once (each reduction runs once a batch instead of once a request), and one by one only
    when an input's values fail together, so a bad request is refused alone with its own
    message."""
    results: list[Union[Request, InputError]] = []
    for arrays in batch:
        try:
            request = from_arrays(request_type, arrays)
        except InputError as error:
            results.append(error)
            continue
        try:
            check(request, config, values=False)
        except InputError:
            # parse checks each input's widths and values in turn: a bad value before a bad
            # width is the error it names, so a refused request is checked again in full
            results.append(checked(request, config))
        else:
            results.append(request)
    shaped = [r for r in results if not isinstance(r, InputError)]
    if shaped and not values_hold_together(shaped, config):
        results = [r if isinstance(r, InputError) else checked(r, config) for r in results]
    return results


def checked(request: Request, config) -> Union[Request, InputError]:
    """``request`` if every check passes, else the InputError ``check`` raises."""
    try:
        check(request, config)
    except InputError as error:
        return error
    return request


# ----------------------------------------------------------------------------------------
# Checks, driven by the specs
# ----------------------------------------------------------------------------------------


def check(request: TypedRequest, config, values: bool = True) -> None:
    """Every carried input against its spec, the limits and the artifact ``config`` (actions,
    surfaces, embedding width); raises InputError naming the input. ``values=False``: shapes
    only (``parse_all`` checks the values of a batch together)."""
    carried = [(c, getattr(request, c.name)) for c in request.checks.inputs]
    carried = [(c, array) for c, array in carried if array is not None]
    for c, array in carried:
        check_rank(c, array)
    check_rows(carried, request.rows)
    for symbol, group in length_groups(carried).items():
        check_length(symbol, group)
    for c, array in carried:
        check_widths(c, array, config)
        if values:
            check_values(c, array, config)


def values_hold_together(requests: Sequence[TypedRequest], config) -> bool:
    """Whether every value check passes for all of ``requests`` (one model's, shapes checked),
    each input's values of every request checked as one array."""
    for c in requests[0].checks.inputs:
        arrays = [a for a in (getattr(r, c.name) for r in requests) if a is not None and a.size]
        if not arrays:
            continue
        values = arrays[0] if len(arrays) == 1 else np.concatenate([a.ravel() for a in arrays])
        try:
            check_values(c, values, config)
        except InputError:
            return False
    return True


def length_groups(carried) -> dict[str, dict[str, np.ndarray]]:
    """{length symbol: {name: array} of the carried inputs whose axis 1 it is}."""
    groups: dict[str, dict[str, np.ndarray]] = {}
    for c, array in carried:
        if c.length is not None:
            groups.setdefault(c.length, {})[c.name] = array
    return groups


def check_rank(c: InputCheck, array: np.ndarray) -> None:
    """Dimensions as the contract has them (Triton checks this; in-process callers do not)."""
    if array.ndim != c.ndim or any(array.shape[i] != size for i, size in c.fixed):
        axes = ", ".join(str(axis) for axis in ("R", *c.spec.axes))
        raise InputError(
            f"input '{c.name}': expected shape [{axes}], got {tuple(array.shape)}", c.name
        )


def check_rows(carried, rows: int) -> None:
    """Every array has the request's ``rows`` rows (the batch dimension)."""
    wrong = {c.name: array.shape[0] for c, array in carried if array.shape[0] != rows}
    if wrong:
        raise InputError(f"inputs {sorted(wrong)} have {wrong} rows; the request has {rows}")


def check_length(symbol: str, group: Mapping[str, np.ndarray]) -> None:
    """Inputs sharing a length symbol share one length, within the symbol's limit."""
    lengths = {name: array.shape[1] for name, array in group.items()}
    if len(set(lengths.values())) > 1:
        raise InputError(f"{LENGTH_GROUPS[symbol]} inputs must have the same length, got {lengths}")
    name, length = next(iter(lengths.items()))
    limit = getattr(LIMITS, LENGTH_LIMITS[symbol])
    if length > limit:
        raise InputError(
            f"input '{name}': {length} {LENGTH_NOUNS[symbol]}, at most {limit} allowed", name
        )


def check_widths(c: InputCheck, array: np.ndarray, config) -> None:
    """Axes fixed by the loaded artifacts (actions, embedding width) have the artifact's size."""
    for axis, symbol in c.widths:
        expected = getattr(config, ARTIFACT_WIDTHS[symbol])
        if array.shape[axis] != expected:
            raise InputError(
                f"input '{c.name}': expected {expected} {WIDTH_NOUNS[symbol]}, "
                f"got shape {tuple(array.shape)}",
                c.name,
            )


def value_bound(bound, config):
    """A Values bound as a number: "surfaces" is the artifact's largest product surface."""
    if bound == "surfaces":
        return config.product_surface_vocab_size - 1
    return bound


def check_values(c: InputCheck, array: np.ndarray, config) -> None:
    """Float inputs are finite; values lie within the spec's bounds. (The ufuncs' own reduce:
    ``array.min()`` goes through a Python wrapper, about a microsecond a call.)"""
    name, values = c.name, c.spec.values
    if c.is_float and not np.logical_and.reduce(np.isfinite(array), axis=None):
        raise InputError(f"input '{name}': contains NaN or infinite values", name)
    if not array.size:
        return
    low, high = value_bound(values.low, config), value_bound(values.high, config)
    if low is None and high is None:
        return
    smallest = np.minimum.reduce(array, axis=None)
    if high is None:
        if smallest < low:
            message = f"input '{name}': {values.what} must be >= {low}, got {smallest}"
            raise InputError(message, name)
        return
    largest = np.maximum.reduce(array, axis=None)
    if smallest < low or largest > high:
        raise InputError(
            f"input '{name}': {values.what} must lie in [{low}, {high}], "
            f"got values in [{smallest}, {largest}]",
            name,
        )
