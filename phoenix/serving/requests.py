"""Typed requests of the served models, generated from their contracts (no Triton imports).

Each model's request type is a frozen dataclass whose fields are the contract's inputs, in
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
from collections.abc import Mapping
from typing import ClassVar, Optional, TypeVar

import numpy as np

from phoenix.serving import contracts
from phoenix.serving.contracts import ARTIFACT_WIDTHS, LENGTH_LIMITS, LIMITS, ModelContract
from phoenix.serving.input_error import InputError  # raised here; re-exported

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
        for spec in self.contract.inputs:
            array = getattr(self, spec.name)
            if spec.length == symbol and array is not None:
                return array.shape[1]
        raise KeyError(f"{self.contract.name} request carries no input of length {symbol}")

    @property
    def candidates(self) -> int:
        """C: candidates per user row."""
        return self.length("C")


def typed_request(contract: ModelContract, class_name: str) -> type:
    """The frozen request dataclass of ``contract``: one field per input, optional inputs
    defaulting to None."""
    fields = []
    for spec in contract.inputs:
        if spec.optional:
            fields.append((spec.name, Optional[np.ndarray], dataclasses.field(default=None)))
        else:
            fields.append((spec.name, np.ndarray))
    return dataclasses.make_dataclass(
        class_name,
        fields,
        bases=(TypedRequest,),
        namespace={
            "contract": contract,
            "__doc__": f"``{contract.name}``'s request: {', '.join(contract.input_names)}.",
            "__module__": __name__,
        },
        frozen=True,
        kw_only=True,
    )


def class_name(model: str) -> str:
    """ "ranker" -> "RankerRequest"."""
    return "".join(part.title() for part in model.split("_")) + "Request"


# One typed request per served model (ensembles have no service of their own).
REQUEST_TYPES = {
    name: typed_request(c, class_name(name))
    for name, c in contracts.CONTRACTS.items()
    if not c.is_ensemble
}
UserRequest = REQUEST_TYPES[contracts.USER_ENCODER.name]
CandidateRequest = REQUEST_TYPES[contracts.CANDIDATE_TOWER.name]
RetrieveRequest = REQUEST_TYPES[contracts.RETRIEVER.name]
RankRequest = REQUEST_TYPES[contracts.RANKER.name]
PolicyRequest = REQUEST_TYPES[contracts.FEED_POLICY.name]

Request = TypeVar("Request", bound=TypedRequest)


def from_arrays(request_type: type[Request], arrays: Mapping[str, np.ndarray]) -> Request:
    """The typed request of ``arrays`` ({input name: array}), cast to the contract's dtypes.

    Triton refuses unknown and missing inputs before a request gets here; in-process callers
    (benchmarks, ``--check``) get the same refusal as an InputError.
    """
    contract: ModelContract = request_type.contract
    unknown = sorted(set(arrays) - set(contract.input_names))
    if unknown:
        raise InputError(f"unknown inputs {unknown}; {contract.name} takes {contract.input_names}")
    missing = [name for name in contract.required_inputs if name not in arrays]
    if missing:
        raise InputError(f"missing required inputs {missing} of {contract.name}")
    return request_type(
        **{
            spec.name: np.asarray(arrays[spec.name], spec.dtype)
            for spec in contract.inputs
            if spec.name in arrays
        }
    )


def parse(request_type: type[Request], arrays: Mapping[str, np.ndarray], config) -> Request:
    """The checked typed request of ``arrays``; raises InputError."""
    request = from_arrays(request_type, arrays)
    check(request, config)
    return request


# ----------------------------------------------------------------------------------------
# Checks, driven by the specs
# ----------------------------------------------------------------------------------------


def check(request: TypedRequest, config) -> None:
    """Every carried input against its spec, the limits and the artifact ``config`` (actions,
    surfaces, embedding width); raises InputError naming the input."""
    sent = request.arrays()
    specs = {name: request.contract.input(name) for name in sent}
    check_ranks(sent, specs)
    check_rows(sent, request.rows)
    for symbol, names in length_groups(specs).items():
        check_length(symbol, {name: sent[name] for name in names})
    for name, array in sent.items():
        check_widths(name, array, specs[name], config)
        check_values(name, array, specs[name].values, config)


def length_groups(specs: Mapping[str, contracts.TensorSpec]) -> dict[str, list[str]]:
    """{length symbol: names of the inputs whose axis 1 it is}."""
    groups: dict[str, list[str]] = {}
    for name, spec in specs.items():
        if spec.length is not None:
            groups.setdefault(spec.length, []).append(name)
    return groups


def check_ranks(sent: Mapping[str, np.ndarray], specs) -> None:
    """Dimensions as the contract has them (Triton checks this; in-process callers do not)."""
    for name, array in sent.items():
        spec = specs[name]
        fixed = [(i + 1, axis) for i, axis in enumerate(spec.axes) if isinstance(axis, int)]
        if array.ndim != spec.ndim or any(array.shape[i] != size for i, size in fixed):
            axes = ", ".join(str(axis) for axis in ("R", *spec.axes))
            raise InputError(
                f"input '{name}': expected shape [{axes}], got {tuple(array.shape)}", name
            )


def check_rows(sent: Mapping[str, np.ndarray], rows: int) -> None:
    """Every array has the request's ``rows`` rows (the batch dimension)."""
    wrong = {name: array.shape[0] for name, array in sent.items() if array.shape[0] != rows}
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


def check_widths(name: str, array: np.ndarray, spec, config) -> None:
    """Axes fixed by the loaded artifacts (actions, embedding width) have the artifact's size."""
    for axis, symbol in enumerate(spec.axes, start=1):
        if symbol in ARTIFACT_WIDTHS:
            expected = getattr(config, ARTIFACT_WIDTHS[symbol])
            if array.shape[axis] != expected:
                raise InputError(
                    f"input '{name}': expected {expected} {WIDTH_NOUNS[symbol]}, "
                    f"got shape {tuple(array.shape)}",
                    name,
                )


def value_bound(bound, config):
    """A Values bound as a number: "surfaces" is the artifact's largest product surface."""
    if bound == "surfaces":
        return config.product_surface_vocab_size - 1
    return bound


def check_values(name: str, array: np.ndarray, values: contracts.Values, config) -> None:
    """Float inputs are finite; values lie within the spec's bounds."""
    if np.issubdtype(array.dtype, np.floating) and not np.all(np.isfinite(array)):
        raise InputError(f"input '{name}': contains NaN or infinite values", name)
    if not array.size:
        return
    low, high = value_bound(values.low, config), value_bound(values.high, config)
    if high is None:
        if low is not None and array.min() < low:
            raise InputError(
                f"input '{name}': {values.what} must be >= {low}, got {array.min()}", name
            )
        return
    if array.min() < low or array.max() > high:
        raise InputError(
            f"input '{name}': {values.what} must lie in [{low}, {high}], "
            f"got values in [{array.min()}, {array.max()}]",
            name,
        )
