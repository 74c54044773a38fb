"""The language of the contracts: tensors, their axes and values, parameters, the steps of an
ensemble or chain, and a model's contract (``ModelContract``); ``phoenix.schema.contracts``
writes every served model in it.

Per input (``TensorSpec``):

    name          the tensor's name on the wire
    dtype         numpy dtype (``triton_dtype`` "INT64", ``config_dtype`` "TYPE_INT64")
    dims          shape without the batch dimension; -1 is any length
    optional      the request may leave it out (an output: not every artifact answers it,
                  as the production family's own)
    ragged        ``allow_ragged_batch``: requests of different lengths share one batch

Imports numpy and tritonclient's dtype helper only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
from tritonclient.utils import np_to_triton_dtype

# Symbolic axes of a tensor (besides the batch dimension). A length symbol groups inputs that
# must share one length and names the per-request limit on it; a width symbol is fixed by the
# loaded artifacts. Everything else an input's values must satisfy is its ``Values``.
LENGTH_LIMITS = {  # symbol -> the Limits field capping it
    "L": "max_history_items",  # history items
    "C": "max_candidates",  # candidates of one user row
    "E": "max_filter_ids",  # excluded authors
    "N": "max_filter_ids",  # seen posts
    "M": "max_candidates",  # in-network posts: every one of them can become a candidate
    # retrieved and kept by the policy: outputs, and served_log's inputs (the ranker takes no
    # more candidates than this, so neither list is longer)
    "K": "max_candidates",
    "C'": "max_candidates",
}
ARTIFACT_WIDTHS = {"D": "emb_size", "A": "num_actions"}  # symbol -> artifact config field
Axis = Union[int, str]


@dataclass(frozen=True)
class Values:
    """What an input's values must be, beyond its dtype (float inputs are always finite).

    ``high`` may name an artifact limit instead of a number: "surfaces" is the artifact's
    largest product surface.
    """

    low: Optional[float] = None
    high: Union[float, str, None] = None
    what: str = "values"


IDS = Values(low=0, what="ids")  # 0 is padding where it is allowed
POST_IDS = Values(low=1, what="ids")  # candidates and posts: 0 would read as padding
SURFACES = Values(low=0, high="surfaces", what="surfaces")
FLAGS = Values(0, 1, "action flags")
PROBABILITIES = Values(0, 1, "probabilities")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output tensor of a model."""

    name: str
    dtype: np.dtype
    axes: tuple[Axis, ...]  # without the batch dimension: sizes or symbols (module docstring)
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch
    values: Values = Values()

    @property
    def dims(self) -> tuple[int, ...]:
        """The config's dims: fixed sizes, and -1 for every symbolic axis."""
        return tuple(axis if isinstance(axis, int) else -1 for axis in self.axes)

    @property
    def length(self) -> Optional[str]:
        """The length symbol of axis 1 (history, candidates, filter ids), if it has one."""
        first = self.axes[0] if self.axes else None
        return first if first in LENGTH_LIMITS else None

    @property
    def triton_dtype(self) -> str:
        """The KServe v2 datatype, e.g. "INT64"."""
        return np_to_triton_dtype(self.dtype)

    @property
    def config_dtype(self) -> str:
        """The data_type of config.pbtxt, e.g. "TYPE_INT64"."""
        return f"TYPE_{self.triton_dtype}"

    @property
    def ndim(self) -> int:
        """Dimensions on the wire, batch dimension included."""
        return 1 + len(self.axes)


# ----------------------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parameter:
    """A config parameter a model reads at start-up: its kind, default and range.

    Config parameters are strings; ``text`` writes a value into a config and ``parse`` reads it
    back, so both directions live here. ``default`` None: the deployment profile (or serve)
    must give it.
    """

    name: str
    kind: str  # "text", "int", "ints" (sorted positive), "number", "flag", "weights"
    default: Any = None
    low: float = -math.inf
    high: float = math.inf

    def text(self, value: Any) -> str:
        """The config string of ``value`` (checked by parsing it back)."""
        if self.kind == "ints":
            text = ",".join(str(int(v)) for v in value)
        elif self.kind == "flag":
            text = "true" if value else "false"
        elif self.kind == "weights":
            text = value if isinstance(value, str) else json.dumps(dict(value))
        else:
            text = str(value)
        self.parse(text)
        return text

    def parse(self, text: str) -> Any:
        """The typed value of a config string; ValueError naming the parameter."""
        where = f"parameter '{self.name}'"
        if self.kind == "text":
            return text
        if self.kind == "flag":
            if text.strip().lower() not in ("true", "false"):
                raise ValueError(f"{where} must be 'true' or 'false', got {text!r}")
            return text.strip().lower() == "true"
        if self.kind == "weights":
            return _parse_weights(where, text)
        if self.kind == "ints":
            values = _parse_ints(where, text)
            if not values:
                raise ValueError(f"{where} must list positive ints, got {text!r}")
            return tuple(sorted(values))
        number = _parse_number(where, text, integer=self.kind == "int")
        if not (self.low <= number <= self.high):  # also refuses NaN
            raise ValueError(f"{where} must lie in [{self.low}, {self.high}], got {text!r}")
        return number


def parsed_values(
    model: str, parameters: Sequence[Parameter], texts: Mapping[str, str]
) -> dict[str, Any]:
    """{name: typed value} of ``parameters`` from config strings (other strings are ignored);
    a missing one or a bad value is a ValueError naming it."""
    missing = [p.name for p in parameters if p.name not in texts]
    if missing:
        raise ValueError(
            f"{model}: config parameters {missing} are missing (configs are generated by "
            "`make configs`)"
        )
    return {p.name: p.parse(texts[p.name]) for p in parameters}


def _parse_ints(where: str, text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{where} must be a comma-separated list of ints: {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"{where} must list positive ints, got {text!r}")
    return values


def _parse_number(where: str, text: str, integer: bool) -> float:
    try:
        return int(text) if integer else float(text)
    except ValueError:
        kind = "an int" if integer else "a number"
        raise ValueError(f"{where} must be {kind}, got {text!r}") from None


def _parse_weights(where: str, text: str) -> dict[str, float]:
    """{action name: weight}; which names exist is the artifact's to say (the service checks)."""
    try:
        weights = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not valid JSON ({error}): {text!r}") from None
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"{where} must be a non-empty JSON object of action: weight")
    for name, weight in weights.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise ValueError(f"{where}: the weight of {name!r} must be a number, got {weight!r}")
        if not math.isfinite(weight):
            raise ValueError(f"{where}: the weight of {name!r} must be finite, got {weight}")
    return {name: float(weight) for name, weight in weights.items()}


@dataclass(frozen=True)
class EnsembleStep:
    """One step of an ensemble: which model, fed from and feeding which ensemble tensors."""

    model: str
    input_map: Mapping[str, str]  # the model's input name -> ensemble tensor name
    output_map: Mapping[str, str]  # the model's output name -> ensemble tensor name
    # A step that writes state and changes no other step's answer (served_log): in-process
    # references of the chain (--check, benchmarks) leave it out, so they write nothing.
    side_effect: bool = False


@dataclass(frozen=True)
class ModelContract:
    """What a served model accepts and returns."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    backend: Optional[str] = "python"
    platform: Optional[str] = None  # "ensemble" for ensembles (then no backend)
    steps: tuple[EnsembleStep, ...] = ()  # ensembles only, in order
    # A chain model's stages: served models whose services it runs in its own process, in
    # order, wired as the steps of an ensemble would be (``RECOMMEND_CHAIN``).
    stages: tuple[EnsembleStep, ...] = ()
    # Config parameters the model reads at start-up (defaults here, the rest from profiles).
    parameters: tuple[Parameter, ...] = ()

    def input(self, name: str) -> TensorSpec:
        return _by_name(self.inputs, name, f"{self.name} input")

    def parameter(self, name: str) -> Parameter:
        for declared in self.parameters:
            if declared.name == name:
                return declared
        known = [p.name for p in self.parameters]
        raise KeyError(f"{self.name} has no parameter {name!r}; it reads {known}")

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def parameter_texts(self, values: Mapping[str, Any]) -> dict[str, str]:
        """The config strings of the defaults overridden by ``values`` ({name: typed value});
        a parameter with neither a default nor a value, or an undeclared one, is an error."""
        undeclared = sorted(set(values) - set(self.parameter_names))
        if undeclared:
            raise KeyError(f"{self.name} declares no parameters {undeclared}")
        texts = {}
        for p in self.parameters:
            value = values.get(p.name, p.default)
            if value is None:
                raise ValueError(f"{self.name}: parameter '{p.name}' has no default and no value")
            texts[p.name] = p.text(value)
        return texts

    def parse_parameters(self, texts: Mapping[str, str]) -> dict[str, Any]:
        """Every declared parameter's typed value from config strings (others are ignored:
        a reload may add markers); a missing one is an error."""
        return parsed_values(self.name, self.parameters, texts)

    @property
    def compiles_batches(self) -> bool:
        """Whether the model compiles a program per batch size (it reads batch_buckets)."""
        return "batch_buckets" in self.parameter_names

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.outputs)

    @property
    def required_inputs(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.inputs if not spec.optional)

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """Powers of two up to max_batch_size (the batch sizes compiled at start-up)."""
        return powers_of_two_up_to(self.max_batch_size)

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble"

    def step(self, model: str) -> EnsembleStep:
        for step in self.steps or self.stages:
            if step.model == model:
                return step
        raise KeyError(f"{self.name} has no step running {model!r}")


@dataclass(frozen=True)
class Limits:
    """Hard per-request limits (docs/reference.md, "Limits of a request"; SECURITY.md)."""

    max_history_items: int  # longer histories are refused; the newest S are used
    max_candidates: int  # per user row of a ranker request
    max_top_k: int
    max_rows: int  # batch rows in one request (candidate_tower posts, users)
    max_filter_ids: int  # excluded authors or seen posts per user row of a feed request


def _by_name(specs: tuple[TensorSpec, ...], name: str, what: str) -> TensorSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    raise KeyError(f"no {what} named {name!r}")


def powers_of_two_up_to(limit: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``limit``, and ``limit`` itself when it is no power of two."""
    buckets = [1]
    while buckets[-1] * 2 <= limit:
        buckets.append(buckets[-1] * 2)
    if buckets[-1] != limit and limit > 1:
        buckets.append(limit)
    return tuple(buckets)


def tensor_spec(name, dtype, axes, optional=False, ragged=False, values=Values()) -> TensorSpec:
    return TensorSpec(name, np.dtype(dtype), tuple(axes), optional, ragged, values)
