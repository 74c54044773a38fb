"""What every service shares: its start-up settings and the one loop that checks, stacks, runs
and splits a batch of requests. Host-only: the services that run no device program (user
state, feed policy, served log) start without importing JAX; the artifacts a device service
loads are ``resources``.

A request takes these forms on its way through a service (``docs/architecture.md``):

1. ``{input name: array}``: one Triton request's tensors, as the adapter reads them;
2. a typed request (``requests.RankerRequest`` ..., generated from the contract), checked on
   its own against the contract's specs: a bad request becomes an ``InputError`` for itself
   alone;
3. one padded batch of every good request's rows (``batches.pad_batch``), stacked once, with
   the field names of 2;
4. the engine's outputs for the whole batch;
5. ``{output name: array}`` per request, split once.

Shape glossary (R rows of one request, B rows of a batch)
  L  history items sent     S  history_seq_len (the newest S items are used)
  C  candidates sent        D  emb_size     A  num_actions
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Optional, Union, cast

import numpy as np

from phoenix.schema.requests import InputError, TypedRequest, parse, parse_all
from phoenix.schema.served import contract

Arrays = Mapping[str, np.ndarray]
Outputs = dict[str, np.ndarray]
# A request's outputs, or its error: an InputError (the request's fault, INVALID_ARG) or another
# (the server's, INTERNAL: e.g. the user-state store unreachable)
Result = Union[Outputs, Exception]

ARTIFACT_DIR_ENV = "PHOENIX_ARTIFACT_DIR"


# ----------------------------------------------------------------------------------------
# Settings
# ----------------------------------------------------------------------------------------


def action_weight_vector(weights: Mapping[str, float], action_names: Sequence[str], parameter: str):
    """[A] float64 weights of a parsed weights parameter ({action name: weight}, the ranker's
    ``score_weights`` and the policy's ``action_weights``) over the artifact's actions; actions
    left out weigh 0, unknown names fail naming ``parameter``, unless their weight is 0 (it
    changes nothing: the policy's default ``dwell_time`` 0, which X's production ranker's
    action slots do not have)."""
    unknown = sorted(name for name, weight in weights.items()
                     if name not in action_names and weight != 0)  # fmt: skip
    if unknown:
        raise ValueError(
            f"parameter '{parameter}' names unknown actions {unknown}; the artifact's actions "
            f"are {list(action_names)}"
        )
    return np.array([weights.get(name, 0.0) for name in action_names], np.float64)


def resolve_artifact_dir(chosen: str, model_dir: str) -> Path:
    """$PHOENIX_ARTIFACT_DIR, else ``chosen`` (the artifact_dir parameter) from the model dir."""
    chosen = os.environ.get(ARTIFACT_DIR_ENV) or chosen
    if not chosen:
        raise ValueError(
            f"no artifact directory: set ${ARTIFACT_DIR_ENV} or the 'artifact_dir' parameter"
        )
    path = Path(chosen)
    if not path.is_absolute():
        path = Path(model_dir) / path
    path = path.resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"artifact directory {path} has no config.json (make artifacts?)")
    return path


def config_parameters(config: Mapping[str, Any]) -> dict[str, str]:
    """``parameters`` of a model config in JSON form (as Triton reports it) as {key: string}."""
    return {k: v.get("string_value", "") for k, v in (config.get("parameters") or {}).items()}


@dataclass(frozen=True)
class ServiceSettings:
    """What a model instance starts with: its artifacts, batch size and typed parameters (the
    contract declares them; ``parameters`` holds every declared one, parsed)."""

    model: str
    artifact_dir: Path
    max_batch_size: int
    parameters: Mapping[str, Any]

    @classmethod
    def from_model_config(cls, model: str, config: Mapping[str, Any], model_dir: str):
        """Settings from a model config as Triton hands it over (JSON form); a bad or missing
        parameter fails naming the model and the parameter."""
        texts = config_parameters(config)
        artifact_dir = resolve_artifact_dir(texts.get("artifact_dir", ""), model_dir)
        return cls.parsed(model, artifact_dir, int(config.get("max_batch_size") or 1), texts)

    @classmethod
    def parsed(cls, model: str, artifact_dir: Path, max_batch_size: int, texts: Mapping[str, str]):
        """Settings from config strings ({parameter: text}), parsed as the contract declares;
        a bad or missing parameter fails naming the model and the parameter."""
        settings = cls(
            model, Path(artifact_dir), max_batch_size, contract(model).parse_parameters(texts)
        )
        settings.check_batch_buckets()
        return settings

    @property
    def parameter_texts(self) -> dict[str, str]:
        """The parameters as config strings (what a config carries)."""
        return contract(self.model).parameter_texts(self.parameters)

    def check_batch_buckets(self) -> None:
        """Compiled batch sizes must cover every batch Triton can hand over."""
        buckets = self.parameters.get("batch_buckets")
        if buckets is not None and buckets[-1] < self.max_batch_size:
            raise ValueError(
                f"{self.model}: parameter 'batch_buckets' {buckets} must reach max_batch_size "
                f"{self.max_batch_size}"
            )

    @property
    def batch_buckets(self) -> tuple[int, ...]:
        """The batch sizes compiled at start-up (models whose contract declares them)."""
        return self.parameters["batch_buckets"]


# ----------------------------------------------------------------------------------------
# Splitting
# ----------------------------------------------------------------------------------------


def split_rows(requests: Sequence, outputs: Mapping[str, np.ndarray]) -> list[Outputs]:
    """Each request's rows of batch ``outputs`` ({name: [B, ...]}), in request order."""
    results, start = [], 0
    for request in requests:
        stop = start + request.rows
        results.append({name: array[start:stop] for name, array in outputs.items()})
        start = stop
    return results


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


class Service:
    """A served model: checks each request, runs the good ones as one batch, splits results.

    Subclasses name their ``request_type`` (whose contract names the model), build themselves
    ``from_settings``, and implement ``run`` (typed requests -> one Outputs per request) and
    ``warm_up``.
    """

    request_type: ClassVar[type[TypedRequest]]
    config: Any  # the artifact config the requests are checked against
    max_rows: int  # the most rows one run takes (the largest compiled batch, or max_batch_size)
    corpus: Any  # the retriever's, the feed policy's and the chain's only (the adapter's metrics)

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> Service:
        raise NotImplementedError

    @classmethod
    def model(cls) -> str:
        return cls.request_type.contract.name

    def run(self, requests: Sequence[Any]) -> Sequence[Result]:
        """One result per request: its outputs, or its error (e.g. the user-state store's)."""
        raise NotImplementedError

    def warm_up(self) -> int:
        raise NotImplementedError

    def parse(self, arrays: Arrays):
        """The checked typed request of one request's arrays; raises InputError."""
        return self.admit(parse(self.request_type, arrays, self.config))

    def admit(self, request):
        """What a checked request must also be to run here; raises InputError. Subclasses add
        their own rules."""
        largest = self.max_rows
        if request.rows > largest:  # Triton's max_batch_size, for in-process callers
            raise InputError(f"{self.model()}: a request of {request.rows} rows, at most {largest}")
        return request

    def handle(self, batch: Sequence[Arrays]) -> list[Result]:
        """Results of a batch of requests, in order: Outputs, or the request's InputError.

        Each request is checked as ``parse`` checks it, the batch's values together
        (``requests.parse_all``). Good requests run together in groups of at most the largest
        batch bucket: from Triton, whose batches never exceed max_batch_size, that is one group.
        """
        results: list[Optional[Result]] = []
        good: list[tuple[int, Any]] = []  # (slot in results, checked request)
        for parsed in parse_all(self.request_type, batch, self.config):
            if not isinstance(parsed, InputError):
                try:
                    parsed = self.admit(parsed)
                except InputError as error:
                    parsed = error
            if isinstance(parsed, InputError):
                results.append(parsed)
            else:
                good.append((len(results), parsed))
                results.append(None)
        for group in self._groups(good):
            for (slot, _), outputs in zip(group, self.run([r for _, r in group])):
                results[slot] = outputs
        return cast(list[Result], results)  # every slot filled: by its InputError or by run

    def _groups(self, good: list) -> list[list]:
        groups: list[list] = []
        rows, largest = 0, self.max_rows
        for item in good:
            if not groups or rows + item[1].rows > largest:
                groups.append([])
                rows = 0
            groups[-1].append(item)
            rows += item[1].rows
        return groups
