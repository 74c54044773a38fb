"""Typed configuration of a Phoenix artifact directory (``config.json``).

``ArtifactConfig`` describes both towers (ranker and retrieval), the hash functions that map raw
ids to embedding rows and the name of every output column. ``from_dict`` reads the published
``config.json`` layout (optional keys take their defaults) and ``to_dict`` writes every key,
``action_names`` included (``version``, a release label, only when the artifacts have one).
Every problem raises ``ArtifactError`` naming the file and the key.

The module imports no JAX at import time, so clients can read a config without it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from phoenix.config_parts import (
    ArtifactError,
    HashParams,
    check_hash_params,
    field_of,
    is_int,
    parse_hash_params,
    required,
)

logger = logging.getLogger(__name__)


# The original runners' ACTIONS list (``<name>_score`` there), one name per output column of a
# 19-action model. Artifacts written here (generated or trained) store these in config.json.
ACTION_NAMES = (
    "favorite",
    "reply",
    "repost",
    "photo_expand",
    "click",
    "profile_click",
    "vqv",
    "share",
    "share_via_dm",
    "share_via_copy_link",
    "dwell",
    "quote",
    "quoted_click",
    "follow_author",
    "not_interested",  # negative feedback from here on
    "block_author",
    "mute_author",
    "report",
    "dwell_time",
)
NEGATIVE_ACTIONS = ("not_interested", "block_author", "mute_author", "report")

# A published config.json without ``action_names`` is read with the proto's action enum as
# its column layout; only these columns are named then.
PROTO_ACTION_NAMES = {
    1: "favorite",
    4: "reply",
    5: "quote",
    6: "repost",
    11: "dwell",
    13: "vqv",
}

REQUIRED_INT_KEYS = (
    "emb_size",
    "history_seq_len",
    "candidate_seq_len",
    "num_user_hashes",
    "num_item_hashes",
    "num_author_hashes",
    "key_size",
    "num_heads",
    "num_layers",
    "num_actions",
    "product_surface_vocab_size",
    "post_age_granularity_mins",
    "user_vocab_size",
    "item_vocab_size",
    "author_vocab_size",
)
OPTIONAL_FLOAT_KEYS = ("widening_factor", "attn_output_multiplier")
OPTIONAL_BOOL_KEYS = ("right_anchored_rope", "enable_linear_proj")
# The model families a ranker may be of: the original release's (``phoenix.recsys_model``) or
# X's production ranker (``phoenix.production``, docs/production.md). config.json names a
# family other than the original in ``ranker_family``, and holds its config under
# ``production_ranker``; a config.json without the key is the original's, as it always was.
RANKER_FAMILIES = ("original", "production")


def default_action_names(num_actions: int) -> tuple[str, ...]:
    """Column names of published files: proto names where known, ``action_<i>`` elsewhere."""
    return tuple(PROTO_ACTION_NAMES.get(i, f"action_{i}") for i in range(num_actions))


def action_names_for(num_actions: int) -> tuple[str, ...]:
    """Names written into new artifacts: the original's ACTIONS for 19 columns, else
    ``default_action_names``."""
    if num_actions == len(ACTION_NAMES):
        return ACTION_NAMES
    return default_action_names(num_actions)


@dataclass(frozen=True, kw_only=True)
class ArtifactConfig:
    """Shapes, vocabularies and hash functions shared by the ranker and the retrieval model."""

    emb_size: int
    history_seq_len: int
    candidate_seq_len: int
    num_user_hashes: int
    num_item_hashes: int
    num_author_hashes: int
    key_size: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    widening_factor: float = 2.0
    attn_output_multiplier: float = 0.125
    num_actions: int
    action_names: tuple[str, ...]
    product_surface_vocab_size: int
    post_age_granularity_mins: int
    user_vocab_size: int
    item_vocab_size: int
    author_vocab_size: int
    right_anchored_rope: bool = False
    enable_linear_proj: bool = True
    hash_params: HashParams
    # A label of the artifacts' release (``"2025-06"``, 3): said in messages and recorded by
    # the corpus stores they embed; None (no ``version`` key) for artifacts written before.
    # It shapes nothing: the candidate tower's digest, not this, decides which store fits.
    version: Optional[Union[str, int]] = None
    # Which model the ranker is (RANKER_FAMILIES); the two-tower retrieval is the same in both.
    ranker_family: str = "original"
    # The production ranker's config (``production_ranker`` of config.json) as canonical JSON
    # text (sorted keys), so that this config stays hashable; phoenix.checkpoint.production
    # reads it as a ProductionConfig. None for the original family.
    production_ranker: Optional[str] = None

    def __post_init__(self):
        check_config_values(self, source="ArtifactConfig")

    # -- derived values ------------------------------------------------------------------

    def num_hashes(self, entity: str) -> int:
        """Hashes per id of ``entity`` ('user', 'item' or 'author')."""
        return getattr(self, f"num_{entity}_hashes")

    def vocab_size(self, entity: str) -> int:
        """Rows of the embedding table of ``entity``."""
        return getattr(self, f"{entity}_vocab_size")

    def action_index(self, name: str) -> int:
        """Output column of the action called ``name``."""
        if name not in self.action_names:
            raise KeyError(f"no action named {name!r}; columns are {list(self.action_names)}")
        return self.action_names.index(name)

    # -- model configs -------------------------------------------------------------------

    def transformer_config(self):
        """The ``phoenix.grok.TransformerConfig`` both towers share."""
        from phoenix.grok import TransformerConfig  # lazy: keep this module free of JAX

        return TransformerConfig(
            emb_size=self.emb_size,
            key_size=self.key_size,
            num_q_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            num_layers=self.num_layers,
            widening_factor=self.widening_factor,
            attn_output_multiplier=self.attn_output_multiplier,
        )

    def hash_config(self):
        """The ``phoenix.recsys_model.HashConfig`` (hash counts per entity)."""
        from phoenix.recsys_model import HashConfig

        return HashConfig(
            num_user_hashes=self.num_user_hashes,
            num_item_hashes=self.num_item_hashes,
            num_author_hashes=self.num_author_hashes,
        )

    def _tower_fields(self, fprop_dtype: Any) -> dict[str, Any]:
        """The config fields the ranker and the retriever share; ``fprop_dtype`` None: float32."""
        import jax.numpy as jnp

        return dict(
            model=self.transformer_config(),
            emb_size=self.emb_size,
            history_seq_len=self.history_seq_len,
            candidate_seq_len=self.candidate_seq_len,
            fprop_dtype=jnp.float32 if fprop_dtype is None else fprop_dtype,
            hash_config=self.hash_config(),
            product_surface_vocab_size=self.product_surface_vocab_size,
        )

    def ranker_config(self, fprop_dtype: Any = None):
        """``PhoenixModelConfig`` of the ranker; ``fprop_dtype`` defaults to float32."""
        from phoenix.recsys_model import PhoenixModelConfig

        return PhoenixModelConfig(
            **self._tower_fields(fprop_dtype),
            num_actions=self.num_actions,
            post_age_granularity_mins=self.post_age_granularity_mins,
            right_anchored_rope=self.right_anchored_rope,
        )

    def retrieval_config(self, fprop_dtype: Any = None):
        """``PhoenixRetrievalModelConfig``; ``fprop_dtype`` defaults to float32."""
        from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig

        return PhoenixRetrievalModelConfig(
            **self._tower_fields(fprop_dtype), enable_linear_proj=self.enable_linear_proj
        )

    # -- (de)serialisation ---------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict with every key (``action_names`` always written explicitly)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name == "hash_params":
                value = value.to_dict()
            elif field.name == "action_names":
                value = list(value)
            elif field.name == "version" and value is None:
                continue  # unversioned artifacts keep the config.json they always had
            elif field.name == "ranker_family" and value == "original":
                continue  # so do the original family's
            elif field.name == "production_ranker":
                if value is not None:
                    out[field.name] = json.loads(value)
                continue
            out[field.name] = value
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "config.json") -> ArtifactConfig:
        """Parse a ``config.json`` mapping; errors name ``source`` and the offending key."""
        if not isinstance(d, Mapping):
            raise ArtifactError(f"{source}: expected a JSON object, found {type(d).__name__}")
        values: dict[str, Any] = {key: required(d, key, source) for key in REQUIRED_INT_KEYS}
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        for key in OPTIONAL_FLOAT_KEYS + OPTIONAL_BOOL_KEYS:
            values[key] = d.get(key, defaults[key])
        values["num_kv_heads"] = d.get("num_kv_heads", values["num_heads"])
        values["action_names"] = _parse_action_names(d, values["num_actions"], source)
        values["hash_params"] = parse_hash_params(required(d, "hash_params", source), source)
        values["version"] = d.get("version")
        values["ranker_family"] = d.get("ranker_family", "original")
        values["production_ranker"] = _production_ranker_text(d, source)
        _warn_unknown_keys(d, source)
        check_config_values(values, source)
        return cls(**values)


# ----------------------------------------------------------------------------------------
# Parsing helpers
# ----------------------------------------------------------------------------------------


def _warn_unknown_keys(d: Mapping[str, Any], source: str) -> None:
    # Unknown keys are tolerated (newer writers may add some) but a typo should be visible.
    known = {f.name for f in dataclasses.fields(ArtifactConfig)}
    for key in sorted(set(d) - known):
        logger.warning("%s: ignoring unknown key '%s'", source, key)


def _parse_action_names(d: Mapping[str, Any], num_actions: Any, source: str) -> Any:
    if "action_names" not in d:
        if not is_int(num_actions):
            return ()  # the type error of num_actions is reported by the value checks
        return default_action_names(num_actions)
    names = d["action_names"]
    if not isinstance(names, list):
        raise ArtifactError(
            f"{source}: 'action_names' must be a list of strings, found {type(names).__name__}"
        )
    return tuple(names)


def _production_ranker_text(d: Mapping[str, Any], source: str) -> Optional[str]:
    """``production_ranker`` as canonical JSON text, or None when config.json has none (its
    fields are checked where it is read: phoenix.checkpoint.production)."""
    if "production_ranker" not in d:
        return None
    value = d["production_ranker"]
    if not isinstance(value, Mapping):
        raise ArtifactError(
            f"{source}: 'production_ranker' must be an object, found {type(value).__name__}"
        )
    return json.dumps(value, sort_keys=True)


# ----------------------------------------------------------------------------------------
# Value checks (shared by from_dict and the constructor)
# ----------------------------------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_positive_int(value: Any, key: str, source: str, minimum: int = 1) -> None:
    if not is_int(value):
        raise ArtifactError(
            f"{source}: '{key}' must be an integer, found {type(value).__name__} ({value!r})"
        )
    if value < minimum:
        wanted = "positive" if minimum == 1 else f">= {minimum}"
        raise ArtifactError(f"{source}: '{key}' must be {wanted}, found {value}")


def _check_sizes(values: Any, source: str) -> None:
    for key in REQUIRED_INT_KEYS + ("num_kv_heads",):
        # mod (vocab - 1) + 1 needs at least one row besides the padding row
        minimum = 2 if key.endswith("_vocab_size") and key != "product_surface_vocab_size" else 1
        _check_positive_int(field_of(values, key), key, source, minimum)
    for key in OPTIONAL_FLOAT_KEYS:
        value = field_of(values, key)
        if not _is_number(value) or not value > 0:
            raise ArtifactError(f"{source}: '{key}' must be a positive number, found {value!r}")
    for key in OPTIONAL_BOOL_KEYS:
        value = field_of(values, key)
        if not isinstance(value, bool):
            raise ArtifactError(f"{source}: '{key}' must be true or false, found {value!r}")


def _check_heads(values: Any, source: str) -> None:
    num_heads, num_kv_heads = field_of(values, "num_heads"), field_of(values, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ArtifactError(
            f"{source}: 'num_heads' ({num_heads}) must be a multiple of "
            f"'num_kv_heads' ({num_kv_heads})"
        )
    key_size = field_of(values, "key_size")
    if key_size % 2:
        # rotary embeddings rotate pairs of features
        raise ArtifactError(f"{source}: 'key_size' must be even, found {key_size}")


def _check_action_names(values: Any, source: str) -> None:
    names, num_actions = field_of(values, "action_names"), field_of(values, "num_actions")
    if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
        raise ArtifactError(f"{source}: 'action_names' must be non-empty strings, found {names!r}")
    if len(names) != num_actions:
        raise ArtifactError(
            f"{source}: 'action_names' has {len(names)} names, expected num_actions = {num_actions}"
        )
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ArtifactError(f"{source}: 'action_names' has duplicate names {duplicates}")


def check_config_values(values: Any, source: str) -> None:
    """Raise ``ArtifactError`` for the first invalid field of a config (object or mapping)."""
    _check_sizes(values, source)
    _check_heads(values, source)
    _check_action_names(values, source)
    check_hash_params(values, source)
    _check_version(field_of(values, "version"), source)
    _check_family(values, source)


def _check_family(values: Any, source: str) -> None:
    family, production = field_of(values, "ranker_family"), field_of(values, "production_ranker")
    if family not in RANKER_FAMILIES:
        raise ArtifactError(
            f"{source}: 'ranker_family' must be one of {list(RANKER_FAMILIES)}, found {family!r}"
        )
    if family == "production" and production is None:
        raise ArtifactError(
            f"{source}: a 'production' ranker_family needs its config in 'production_ranker'"
        )
    if family == "original" and production is not None:
        raise ArtifactError(
            f"{source}: 'production_ranker' is given but 'ranker_family' is {family!r}; "
            "set it to 'production'"
        )


def _check_version(version: Any, source: str) -> None:
    if version is None or is_int(version) or isinstance(version, str) and version.strip():
        return
    raise ArtifactError(
        f"{source}: 'version' must be a non-empty string or an integer, found {version!r}"
    )
