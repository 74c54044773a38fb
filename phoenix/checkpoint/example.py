"""One example request (``example_sequence.json``), named like the servers' inputs.

Besides ids, actions, surfaces and dwell times, a request for a production-family ranker
carries the feed's features (``phoenix.feed_features``) under the ranker's input names: per
history item ``history_<feature>``, per candidate ``candidate_<feature>``, the user's profile
under each feature's own name (``FEATURE_KEYS``). ``features`` holds those a file has, checked
for their lengths and ranges."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np

from phoenix.checkpoint.files import (
    EXAMPLE_FILE,
    PathLike,
    artifact_root,
    existing_file,
    read_json,
    resolve_inside,
    write_json,
)
from phoenix.config import ArtifactConfig, ArtifactError
from phoenix.feed_features import HISTORY_FEATURES, PROFILE_FEATURES, Feature

_HISTORY_FIELDS = (
    "history_post_ids",
    "history_author_ids",
    "history_actions",
    "history_product_surface",
    "history_dwell_seconds",
)
_CANDIDATE_FIELDS = ("candidate_post_ids", "candidate_author_ids", "candidate_product_surface")

# The production ranker's features an example may carry: key -> (feature, per what). The
# history's surface and dwell time are the fields above; a candidate's age is
# candidate_post_age_seconds (seconds, negative: unknown).
_CONTEXT = ("impression_time", "creation_time", "timezone", "hour_of_day", "semantic_ids")
FEATURE_KEYS: dict[str, tuple[Feature, str]] = {
    **{f"history_{f.name}": (f, "history") for f in HISTORY_FEATURES if f.name in _CONTEXT},
    **{
        f"candidate_{f.name}": (f, "candidate")
        for f in HISTORY_FEATURES
        if f.name in ("timezone", "hour_of_day", "semantic_ids")
    },
    **{f.name: (f, "user") for f in PROFILE_FEATURES},
}
CANDIDATE_AGES = "candidate_post_age_seconds"


@dataclass(frozen=True)
class ExampleSequence:
    """One user's request (history oldest to newest), named like the servers' inputs."""

    user_id: int
    history_post_ids: tuple[int, ...]
    history_author_ids: tuple[int, ...]
    history_actions: tuple[tuple[int, ...], ...]  # [S, num_actions] of 0/1
    history_product_surface: tuple[int, ...]
    history_dwell_seconds: tuple[float, ...]
    candidate_post_ids: tuple[int, ...]
    candidate_author_ids: tuple[int, ...]
    candidate_product_surface: tuple[int, ...]
    top_k: int
    # The production ranker's features it carries (FEATURE_KEYS, and candidate ages), as
    # JSON values: numbers, lists of numbers, lists of lists (semantic IDs).
    features: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "features":
                continue
            if f.name == "history_actions":
                value = [list(row) for row in value]
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return {**out, **self.features}

    @classmethod
    def from_dict(
        cls,
        d: Mapping[str, Any],
        source: str = EXAMPLE_FILE,
        config: Optional[ArtifactConfig] = None,
    ) -> ExampleSequence:
        """Parse and validate; with ``config``, also check action width and surfaces."""
        if not isinstance(d, Mapping):
            raise ArtifactError(f"{source}: expected a JSON object, found {type(d).__name__}")
        for f in dataclasses.fields(cls):
            if f.name not in d and f.name != "features":
                raise ArtifactError(f"{source}: missing key '{f.name}'")
        values: dict[str, Any] = {
            "user_id": _int_value(d["user_id"], "user_id", source),
            "top_k": _int_value(d["top_k"], "top_k", source, minimum=1),
            "history_actions": _action_rows(d["history_actions"], source),
            "history_dwell_seconds": _float_list(d["history_dwell_seconds"], source),
        }
        for key in _HISTORY_FIELDS + _CANDIDATE_FIELDS:
            if key not in values:
                values[key] = _int_list(d[key], key, source)
        values["features"] = _features(d, source)
        sequence = cls(**values)
        sequence.check_lengths(source)
        if config is not None:
            sequence.check_against(config, source)
        return sequence

    def check_lengths(self, source: str) -> None:
        """History fields share one length, candidate fields another (features included)."""
        for group, per in ((_HISTORY_FIELDS, "history"), (_CANDIDATE_FIELDS, "candidate")):
            lengths = {key: len(getattr(self, key)) for key in group}
            for key, value in self.features.items():
                if (
                    key == CANDIDATE_AGES
                    and per == "candidate"
                    or FEATURE_KEYS.get(key, (None, ""))[1] == per
                ):
                    lengths[key] = len(value)
            if len(set(lengths.values())) > 1:
                raise ArtifactError(f"{source}: lengths differ between {lengths}")

    def check_against(self, config: ArtifactConfig, source: str) -> None:
        """Action rows of width num_actions; product surfaces inside their vocabulary."""
        for row in self.history_actions:
            if len(row) != config.num_actions:
                raise ArtifactError(
                    f"{source}: 'history_actions' rows have {len(row)} columns, "
                    f"expected num_actions = {config.num_actions}"
                )
        vocab = config.product_surface_vocab_size
        for key in ("history_product_surface", "candidate_product_surface"):
            if any(not 0 <= v < vocab for v in getattr(self, key)):
                raise ArtifactError(f"{source}: '{key}' values must lie in [0, {vocab})")


def _feature_value(value: Any, f: Feature, key: str, source: str) -> Any:
    """One value of feature ``f``: a number in its range (an app flag 0/1)."""
    low, high = (0, 1) if f.kind == "apps" else (f.low, f.high)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or (f.kind != "float" and not isinstance(value, int)):
        kind = "a number" if f.kind == "float" else "an integer"
        raise ArtifactError(f"{source}: '{key}' values must be {kind}, found {value!r}")
    if not (np.isfinite(value) and low <= value <= high):
        raise ArtifactError(f"{source}: '{key}' values must lie in [{low}, {high}], found {value}")
    return value


def _features(d: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The production features ``d`` carries, checked: per item a list (semantic IDs a list
    of ``width`` codes per item), per user one value (installed apps: a list of 64 flags)."""
    out: dict[str, Any] = {}
    for key, (f, per) in FEATURE_KEYS.items():
        if key not in d:
            continue
        value = d[key]
        if per == "user" and not f.width:
            out[key] = _feature_value(value, f, key, source)
            continue
        items = value if per != "user" else [value]
        if not isinstance(items, list):
            raise ArtifactError(f"{source}: '{key}' must be a list, found {type(value).__name__}")
        for item in items:
            if f.width:
                if not isinstance(item, list) or len(item) != f.width:
                    raise ArtifactError(f"{source}: '{key}' needs lists of {f.width} values")
                for v in item:
                    _feature_value(v, f, key, source)
            else:
                _feature_value(item, f, key, source)
        out[key] = value
    if CANDIDATE_AGES in d:
        ages = d[CANDIDATE_AGES]
        if not isinstance(ages, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) for v in ages
        ):
            raise ArtifactError(f"{source}: '{CANDIDATE_AGES}' must be a list of finite numbers")
        out[CANDIDATE_AGES] = ages
    return out


def _int_value(value: Any, key: str, source: str, minimum: Optional[int] = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ArtifactError(f"{source}: '{key}' must be an integer, found {value!r}")
    if minimum is not None and value < minimum:
        raise ArtifactError(f"{source}: '{key}' must be >= {minimum}, found {value}")
    return value


def _int_list(value: Any, key: str, source: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ArtifactError(f"{source}: '{key}' must be a list, found {type(value).__name__}")
    return tuple(_int_value(v, key, source) for v in value)


def _float_list(value: Any, source: str) -> tuple[float, ...]:
    key = "history_dwell_seconds"
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and np.isfinite(v) and v >= 0
        for v in value
    ):
        raise ArtifactError(f"{source}: '{key}' must be a list of finite numbers >= 0")
    return tuple(float(v) for v in value)


def _action_rows(value: Any, source: str) -> tuple[tuple[int, ...], ...]:
    key = "history_actions"
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise ArtifactError(f"{source}: '{key}' must be a list of lists of 0/1")
    rows = tuple(_int_list(row, key, source) for row in value)
    if any(v not in (0, 1) for row in rows for v in row):
        raise ArtifactError(f"{source}: '{key}' values must be 0 or 1")
    return rows


def load_example_sequence(
    directory: PathLike, config: Optional[ArtifactConfig] = None
) -> ExampleSequence:
    """Parse ``<directory>/example_sequence.json`` (checked against ``config`` if given)."""
    root = artifact_root(directory)
    data = read_json(existing_file(root, EXAMPLE_FILE), EXAMPLE_FILE)
    return ExampleSequence.from_dict(data, EXAMPLE_FILE, config)


def save_example_sequence(
    directory: PathLike, sequence: Union[ExampleSequence, Mapping[str, Any]]
) -> None:
    """Validate and write ``<directory>/example_sequence.json``."""
    data = sequence.to_dict() if isinstance(sequence, ExampleSequence) else dict(sequence)
    checked = ExampleSequence.from_dict(data, EXAMPLE_FILE)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    write_json(resolve_inside(root.resolve(), EXAMPLE_FILE), checked.to_dict())
