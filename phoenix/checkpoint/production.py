"""A production-family ranker in an artifact directory (X's production ranker, xrex nano:
docs/production.md): its config inside ``config.json``, its parameters and its hashed table.

Layout (the retrieval parts, hash tables, corpus and example of the original layout stay as
they are: retrieval is the same two-tower model in both families)::

    config.json              ArtifactConfig with "ranker_family": "production" and
                             "production_ranker": {every ProductionConfig field; "hashes": {..}}
    ranker/model_params.npz  the ranker's parameters by X's Haiku path (float32)
    ranker/emb_table.npz     emb_table [V, W] float32: the hashed-id embedding table

The artifact config and the ranker's must agree where both speak: the history's length, the
action slots (``num_actions`` = ``output_vocab_size``) and the product surfaces. Every problem
is an ``ArtifactError`` naming the file and the key. Reading imports JAX (the production
package), so only what serves or checks the ranker calls it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np

from phoenix.checkpoint.files import (
    CONFIG_FILE,
    RANKER_PARAMS_FILE,
    PathLike,
    artifact_root,
    check_float_array,
    existing_file,
    load_config,
    read_npz,
    resolve_inside,
    write_npz,
)
from phoenix.config import ArtifactConfig, ArtifactError

if TYPE_CHECKING:
    from phoenix.production.config import ProductionConfig

EMB_TABLE_FILE = "ranker/emb_table.npz"
EMB_TABLE_KEY = "emb_table"
PRODUCTION = "production"


def is_production(config: ArtifactConfig) -> bool:
    """Whether the artifacts' ranker is of the production family."""
    return config.ranker_family == PRODUCTION


# ----------------------------------------------------------------------------------------
# The ranker's config in config.json
# ----------------------------------------------------------------------------------------


def production_config_dict(config: ProductionConfig) -> dict[str, Any]:
    """Every field of ``config`` as JSON values (tuples as lists, the hashes nested)."""

    def plain(value: Any) -> Any:
        return list(value) if isinstance(value, tuple) else value

    out = {f.name: plain(getattr(config, f.name)) for f in dataclasses.fields(config)}
    out["hashes"] = {f.name: plain(getattr(config.hashes, f.name))
                     for f in dataclasses.fields(config.hashes)}  # fmt: skip
    return out


def _typed(value: Any, kind: Any, key: str, source: str) -> Any:
    """``value`` checked to be of the dataclass field type ``kind``."""
    wrong = ArtifactError(f"{source}: 'production_ranker.{key}' must be {_kind_name(kind)}, "
                          f"found {value!r}")  # fmt: skip
    if kind is bool:
        if not isinstance(value, bool):
            raise wrong
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise wrong
        return float(value)
    if typing.get_origin(kind) is Literal:
        if value not in typing.get_args(kind):
            raise wrong
        return value
    if typing.get_origin(kind) is tuple:
        if not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, int) for v in value
        ):
            raise wrong
        return tuple(value)
    raise wrong


def _kind_name(kind: Any) -> str:
    if typing.get_origin(kind) is Literal:
        return f"one of {list(typing.get_args(kind))}"
    if typing.get_origin(kind) is tuple:
        return "a list of integers"
    return {bool: "true or false", int: "an integer", float: "a number"}.get(kind, str(kind))


def _fields(cls: type, given: Mapping[str, Any], prefix: str, source: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise ArtifactError(f"{source}: unknown keys {unknown} in '{prefix}'")
    return {
        name: _typed(value, hints[name], f"{name}", source)
        for name, value in given.items()
        if name != "hashes"
    }


def production_config_from_dict(d: Any, source: str = CONFIG_FILE) -> ProductionConfig:
    """The ProductionConfig of a ``production_ranker`` object (a field it leaves out takes
    the nano default); ArtifactError naming a key of the wrong type or a config that the
    ranker refuses."""
    from phoenix.production.config import HashConfig, ProductionConfig

    if not isinstance(d, Mapping):
        raise ArtifactError(f"{source}: 'production_ranker' must be an object")
    values = _fields(ProductionConfig, d, "production_ranker", source)
    hashes = d.get("hashes", {})
    if not isinstance(hashes, Mapping):
        raise ArtifactError(f"{source}: 'production_ranker.hashes' must be an object")
    try:
        hash_config = HashConfig(**_fields(HashConfig, hashes, "production_ranker.hashes", source))
        return ProductionConfig(**values, hashes=hash_config)
    except ValueError as error:
        raise ArtifactError(f"{source}: 'production_ranker': {error}") from None


@functools.lru_cache(maxsize=16)
def _parsed(text: str) -> ProductionConfig:
    return production_config_from_dict(json.loads(text))


def production_config(config: ArtifactConfig) -> ProductionConfig:
    """The production ranker's config of a production-family artifact config, checked
    against it (``check_agreement``)."""
    if config.production_ranker is None:
        raise ArtifactError(
            f"{CONFIG_FILE}: the ranker is of the {config.ranker_family!r} family, which has "
            "no 'production_ranker'"
        )
    ranker = _parsed(config.production_ranker)
    check_agreement(config, ranker)
    return ranker


def check_agreement(config: ArtifactConfig, ranker: ProductionConfig) -> None:
    """What both configs state must agree: the requests' histories, action slots and product
    surfaces are checked against the artifact config, and read by the production ranker."""
    pairs = {
        "history_seq_len": (config.history_seq_len, ranker.history_seq_len),
        "num_actions": (config.num_actions, ranker.output_vocab_size),
        "product_surface_vocab_size": (
            config.product_surface_vocab_size,
            ranker.product_surface_cardinality,
        ),
        "post_age_granularity_mins": (
            config.post_age_granularity_mins,
            ranker.post_age_granularity_mins,
        ),
    }
    for key, (mine, ranker_value) in pairs.items():
        if mine != ranker_value:
            raise ArtifactError(
                f"{CONFIG_FILE}: '{key}' is {mine} but the production ranker's is "
                f"{ranker_value}: both must be the same"
            )


def with_production_ranker(config: ArtifactConfig, ranker: ProductionConfig) -> ArtifactConfig:
    """``config`` naming the production family and holding ``ranker``'s config."""
    text = json.dumps(production_config_dict(ranker), sort_keys=True)
    made = dataclasses.replace(config, ranker_family=PRODUCTION, production_ranker=text)
    check_agreement(made, ranker)
    return made


# ----------------------------------------------------------------------------------------
# Parameters and the hashed table
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProductionRankerArtifacts:
    """A production-family ranker as read from its artifact directory."""

    config: ProductionConfig
    params: dict[str, np.ndarray]  # by Haiku path, float32, "emb_table" included


def check_production_params(
    params: Mapping[str, np.ndarray], config: ProductionConfig, name: str
) -> dict[str, np.ndarray]:
    """``params`` against the config's shapes: every name there, none else, finite floats;
    returns float32 arrays."""
    from phoenix.production.params import param_shapes

    expected = param_shapes(config)
    missing = sorted(set(expected) - set(params))
    unexpected = sorted(set(params) - set(expected))
    if missing or unexpected:
        parts = [f"missing {missing[:5]}" if missing else "",
                 f"unexpected {unexpected[:5]}" if unexpected else ""]  # fmt: skip
        raise ArtifactError(f"{name}: {'; '.join(p for p in parts if p)} (X's Haiku paths)")
    return {
        key: check_float_array(np.asarray(params[key]), key, name, expected[key])
        for key in sorted(expected)
    }


def check_emb_table(table: np.ndarray, config: ProductionConfig, name: str) -> np.ndarray:
    """The hashed table: [V >= the hashes' rows, emb_table_width], finite floats."""
    table = np.asarray(table)
    rows = config.hashes.num_rows
    if table.ndim != 2 or table.shape[1] != config.emb_table_width or table.shape[0] < rows:
        raise ArtifactError(
            f"{name}: '{EMB_TABLE_KEY}' has shape {tuple(table.shape)}, expected "
            f"[at least {rows}, {config.emb_table_width}] (the hashes reach row {rows - 1})"
        )
    return check_float_array(table, EMB_TABLE_KEY, name, table.shape)


def load_production_ranker(directory: PathLike) -> ProductionRankerArtifacts:
    """The production ranker of an artifact directory: config, parameters and table."""
    root = artifact_root(directory)
    ranker = production_config(load_config(root))
    params = check_production_params(
        read_npz(existing_file(root, RANKER_PARAMS_FILE), RANKER_PARAMS_FILE),
        ranker,
        RANKER_PARAMS_FILE,
    )
    tables = read_npz(existing_file(root, EMB_TABLE_FILE), EMB_TABLE_FILE)
    if EMB_TABLE_KEY not in tables or len(tables) != 1:
        raise ArtifactError(f"{EMB_TABLE_FILE}: expected one array '{EMB_TABLE_KEY}', found "
                            f"{sorted(tables)}")  # fmt: skip
    params[EMB_TABLE_KEY] = check_emb_table(tables[EMB_TABLE_KEY], ranker, EMB_TABLE_FILE)
    return ProductionRankerArtifacts(ranker, params)


def save_production_ranker(
    directory: PathLike, config: ProductionConfig, params: Mapping[str, np.ndarray]
) -> None:
    """Check, then write the ranker's parameters and table (``emb_table`` of ``params``)."""
    root = Path(directory).resolve()
    weights = {k: v for k, v in params.items() if k != EMB_TABLE_KEY}
    checked = check_production_params(weights, config, RANKER_PARAMS_FILE)
    if EMB_TABLE_KEY not in params:
        raise ArtifactError(f"{EMB_TABLE_FILE}: no '{EMB_TABLE_KEY}' among the parameters")
    table = check_emb_table(params[EMB_TABLE_KEY], config, EMB_TABLE_FILE)
    write_npz(resolve_inside(root, RANKER_PARAMS_FILE), checked)
    write_npz(resolve_inside(root, EMB_TABLE_FILE), {EMB_TABLE_KEY: table})


# ----------------------------------------------------------------------------------------
# From an X checkpoint's training config
# ----------------------------------------------------------------------------------------

# X's config keys whose name differs from the ProductionConfig field they set.
XAI_KEYS = {
    "base_ffn_size": "ffn_base_size",
    "layer_norm_eps": "norm_eps",
    **{f"{e}_id_table_size": f"{e}_table_size" for e in ("user", "item", "author", "ip")},
    **{f"{e}_hash_scales": f"{e}_scales" for e in ("user", "item", "author", "ip")},
}
# X's keys that say how X trained or ran it, not what the forward computes: the serving
# overrides decide them (X's own serving runs use the serving kernel's key set).
XAI_SKIPPED = ("attn_impl", "sequence_len")


def _leaves(tree: Any, found: dict[str, Any]) -> None:
    """Every scalar or list leaf of a nested config by its key, the first one met (breadth
    first: the model's own key before a sub-config's copy)."""
    queue = [tree]
    while queue:
        node = queue.pop(0)
        for key, value in node.items():
            if isinstance(value, Mapping):
                queue.append(value)
            elif isinstance(value, list) and value and isinstance(value[0], Mapping):
                continue  # lists of sub-configs (losses, features) set nothing here
            else:
                found.setdefault(key, value)


def production_config_from_xai(
    training_config: Mapping[str, Any], overrides: Sequence[str] = ()
) -> ProductionConfig:
    """The ProductionConfig of an X checkpoint's training config (its ``model_config``: every
    key that names one of our fields, X's spelling accepted), then ``overrides`` (X's
    ``key=value`` serving overrides, e.g. ``history_seq_len=1022``). ValueError names a key
    that cannot apply."""
    from phoenix.production.config import NANO, ProductionConfig, apply_overrides

    model = training_config.get("model_config")
    if not isinstance(model, Mapping):
        raise ValueError("the checkpoint's config.json has no 'model_config' object")
    leaves: dict[str, Any] = {}
    _leaves(model, leaves)
    fields = {f.name for f in dataclasses.fields(ProductionConfig)} | {
        f.name for f in dataclasses.fields(NANO.hashes)
    }
    aliases = {"query_heads": "num_q_heads", "kv_heads": "num_kv_heads"}
    given = []
    for key, value in leaves.items():
        name = XAI_KEYS.get(key, aliases.get(key, key))
        if name in fields and name not in XAI_SKIPPED and name != "hashes" and value is not None:
            text = ",".join(str(v) for v in value) if isinstance(value, list) else str(value)
            given.append(f"{name}={text}")
    # one replace of every field at once, the overrides last (they win): a training
    # config's history need not fill whole attention blocks, the serving overrides may fix it
    return apply_overrides(NANO, [*given, *overrides])
