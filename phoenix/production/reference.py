"""Reference data written with X's own code, read into our types, and output comparison.

A reference folder holds, per set ``NAME``: ``NAME.npz`` (``in/...``: X's batch fields,
``in/merged_embeddings_bf16_as_uint16``: the gathered hashed rows; ``out/log_probs``,
``out/logits``, ``out/continuous_predictions``: X's outputs, [B, R, ...] with the first
``cand_len[b]`` rows real; ``hist_len``, ``cand_len``), ``NAME_params.npz`` (parameters by
Haiku path) and ``NAME.json`` (``overrides``: X's config overrides; ``embedding_slices``).
docs/production.md says how such folders are made.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Mapping, NamedTuple

import jax.numpy as jnp
import numpy as np

from phoenix.production.config import NANO, ProductionConfig, apply_overrides
from phoenix.production.inputs import HashedRows, PostSequence, RankingInputs, UserFeatures
from phoenix.production.params import check_params, load_params

# X's feature indices (xrex/data/recsys/feature_config.py)
TIMEZONE, HOUR_OF_DAY = 5, 6  # CategoricalFeature
STALE, FOLLOWED_BY_VIEWER, FOLLOWING_VIEWER = 0, 1, 2  # BoolFeature
ENGAGEMENT_COUNTS = [5, 6, 7, 8, 9]  # Int64Feature: fav, reply, repost, quote, view
LANGUAGE, COUNTRY, GENDER, AGE_BRACKET, INFERRED_GENDER = 0, 1, 3, 4, 6  # UserCategorical
LONGITUDE, LATITUDE, INFERRED_GENDER_SCORE, AGE_YEARS = 0, 1, 2, 3  # UserFloatFeature
DWELL_TIME = 1  # ContinuousActionName
OUTPUTS = ("log_probs", "logits", "continuous")
X_OUTPUTS = {"log_probs": "log_probs", "logits": "logits", "continuous": "continuous_predictions"}


class ReferenceError(ValueError):
    """A reference folder or file that cannot be read as the layout above."""


class ReferenceSet(NamedTuple):
    name: str
    config: ProductionConfig
    params: dict[str, np.ndarray]
    inputs: RankingInputs
    rows: HashedRows  # bfloat16, as X fed them
    expected: dict[str, np.ndarray]  # output name -> [B, R, ...]
    history_len: np.ndarray  # [B]
    candidate_len: np.ndarray  # [B]


def find_sets(folder: str | Path) -> list[Path]:
    """Every ``NAME.npz`` in ``folder`` with its ``NAME_params.npz`` and ``NAME.json``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ReferenceError(f"{folder}: not a folder")
    sets = []
    for data in sorted(folder.glob("*.npz")):
        if data.name.endswith("_params.npz"):
            continue
        for partner in (data.with_name(data.stem + "_params.npz"), data.with_suffix(".json")):
            if not partner.is_file():
                raise ReferenceError(f"{data}: no {partner.name} beside it")
        sets.append(data)
    if not sets:
        raise ReferenceError(f"{folder}: no reference set (NAME.npz, NAME_params.npz, NAME.json)")
    return sets


def config_of(meta: Mapping, base: ProductionConfig = NANO) -> ProductionConfig:
    """``base`` with the set's overrides, checked against the widths it records."""
    try:
        config = apply_overrides(base, list(meta.get("overrides", [])))
    except ValueError as error:
        raise ReferenceError(str(error)) from None
    for key in ("emb_table_width", "num_user_prefix_tokens", "history_seq_len"):
        if key in meta and meta[key] != getattr(config, key):
            raise ReferenceError(
                f"{key}: the set says {meta[key]}, the config {getattr(config, key)}"
            )
    return config


def load_set(data_path: str | Path, base: ProductionConfig = NANO) -> ReferenceSet:
    """One reference set, ``NAME.npz`` with its partners."""
    data_path = Path(data_path)
    meta = json.loads(data_path.with_suffix(".json").read_text())
    config = config_of(meta, base)
    params = load_params(data_path.with_name(data_path.stem + "_params.npz"))
    try:
        check_params(params, config)
    except ValueError as error:
        raise ReferenceError(f"{data_path.stem}_params.npz: {error}") from None
    with np.load(data_path) as npz:
        arrays = {name: np.asarray(npz[name]) for name in npz.files}
    try:
        inputs = inputs_of(arrays)
        rows = rows_of(arrays, config, meta.get("embedding_slices"))
        expected = {name: arrays[f"out/{X_OUTPUTS[name]}"] for name in OUTPUTS}
        lengths = arrays["hist_len"], arrays["cand_len"]
    except KeyError as error:
        raise ReferenceError(f"{data_path}: no array {error}") from None
    return ReferenceSet(data_path.stem, config, params, inputs, rows, expected, *lengths)


def _sequence(arrays: Mapping[str, np.ndarray], prefix: str) -> PostSequence:
    get = lambda name: arrays[f"in/{prefix}/{name}"]  # noqa: E731
    categorical, flags = get("categorical_features"), get("bool_features")
    return PostSequence(
        post_hashes=get("post_hashes").astype(np.int32),
        author_hashes=get("auth_hashes").astype(np.int32),
        product_surface=get("product_surface").astype(np.int32),
        impression_time=get("impr_ts").astype(np.int32),
        creation_time=get("post_creation_ts_sec").astype(np.int32),
        timezone=categorical[..., TIMEZONE].astype(np.int32),
        hour_of_day=categorical[..., HOUR_OF_DAY].astype(np.int32),
        author_followed_by_viewer=flags[..., FOLLOWED_BY_VIEWER],
        author_following_viewer=flags[..., FOLLOWING_VIEWER],
        engagement_counts=get("int64_features")[..., ENGAGEMENT_COUNTS].astype(np.float32),
        semantic_ids=get("post_sids").astype(np.int32),
        stale=flags[..., STALE],
        actions=get("actions").astype(bool),
        dwell_time=get("continuous_actions")[..., DWELL_TIME].astype(np.float32),
    )


def inputs_of(arrays: Mapping[str, np.ndarray]) -> RankingInputs:
    """Our typed inputs from X's batch fields (``in/...``)."""
    categorical = arrays["in/user_categorical_features"].astype(np.int32)
    floats = arrays["in/user_float_features"].astype(np.float32)
    user = UserFeatures(
        hashes=arrays["in/user_hashes"].astype(np.int32),
        ip_hashes=arrays["in/user_ip_hashes"].astype(np.int32),
        country=categorical[:, COUNTRY],
        language=categorical[:, LANGUAGE],
        latitude=floats[:, LATITUDE],
        longitude=floats[:, LONGITUDE],
        installed_apps=arrays["in/user_installed_apps_multihot"].astype(bool),
        profile_gender=categorical[:, GENDER],
        inferred_gender=categorical[:, INFERRED_GENDER],
        inferred_gender_score=floats[:, INFERRED_GENDER_SCORE],
        age_bracket=categorical[:, AGE_BRACKET],
        age_years=floats[:, AGE_YEARS],
    )
    return RankingInputs(user, _sequence(arrays, "history_seq"), _sequence(arrays, "candidate_seq"))


def rows_of(arrays: Mapping[str, np.ndarray], config: ProductionConfig, slices=None) -> HashedRows:
    """The gathered rows from X's merged [B, rows, W] bfloat16 array, split by stream."""
    merged = arrays["in/merged_embeddings_bf16_as_uint16"].view(jnp.bfloat16)
    h, H, C = config.hashes, config.history_seq_len, config.candidate_seq_len
    counts = {
        "hist_post": H * h.num_item_hashes,
        "hist_auth": H * h.num_author_hashes,
        "cand_post": C * h.num_item_hashes,
        "cand_auth": C * h.num_author_hashes,
        "user": h.num_user_hashes,
        "user_ip": h.num_ip_hashes,
    }
    start, bounds = 0, {}
    for name, count in counts.items():
        bounds[name] = (start, start + count)
        start += count
    if slices is not None and {k: tuple(v) for k, v in slices.items()} != bounds:
        raise ReferenceError(f"embedding_slices {slices} differ from the config's {bounds}")
    if merged.shape[1:] != (start, config.emb_table_width):
        raise ReferenceError(
            f"merged embeddings {merged.shape}: expected [B, {start}, {config.emb_table_width}]"
        )
    b = merged.shape[0]
    part = lambda name, *shape: merged[:, slice(*bounds[name])].reshape(b, *shape, -1)  # noqa: E731
    return HashedRows(
        user=part("user", h.num_user_hashes),
        user_ip=part("user_ip", h.num_ip_hashes),
        history_posts=part("hist_post", H, h.num_item_hashes),
        history_authors=part("hist_auth", H, h.num_author_hashes),
        candidate_posts=part("cand_post", C, h.num_item_hashes),
        candidate_authors=part("cand_auth", C, h.num_author_hashes),
    )


@dataclasses.dataclass(frozen=True)
class Tolerances:
    """The differences accepted over real candidate rows.

    ``continuous_steps``: a continuous value also passes within that many bfloat16 steps of
    X's value. X computes the heads in bfloat16: the dwell head is sigmoid x 30, whose values
    from 16 to 30 lie 0.125 apart, so one rounding of the sigmoid moves it by more than 0.1;
    X's own dense attention, against its serving kernel, moved 11 values of one reference by
    0.125. One step of the sigmoid in bfloat16 (2**-8 above 0.5) is 0.117 after the scale of
    30: two steps of the output from 8 to 16, one from 16 to 30, hence two. 0 checks
    ``continuous_max`` alone.
    """

    log_prob_max: float = 0.08
    log_prob_mean: float = 0.005
    continuous_max: float = 0.1
    continuous_steps: int = 2


class Difference(NamedTuple):
    output: str
    max: float
    mean: float
    limit: str  # what was checked, "" when the output is reported only
    ok: bool
    over: int  # values over the absolute limit (``max`` for log-probs, ``continuous_max``)
    # the farthest of those from X's value in bfloat16 steps of it (0 when none is over): 1 is
    # one rounding apart however large the value (a step is 0.125 from 16 to 32, past 0.08)
    over_steps: float = 0.0


def bfloat16_step(values: np.ndarray) -> np.ndarray:
    """The distance from each bfloat16 value to the next one away from zero (0 for 0)."""
    _, exponent = np.frexp(np.abs(values.astype(np.float64)))  # |v| = m 2**e, m in [0.5, 1)
    return np.where(values == 0, 0.0, np.ldexp(1.0, exponent - 8))  # 8 significant bits


def compare(ours: Mapping[str, np.ndarray], reference: ReferenceSet, tol: Tolerances):
    """Per output: largest and mean |ours - X's| over each request's first cand_len rows."""
    rows = [(b, int(n)) for b, n in enumerate(reference.candidate_len)]
    results = []
    for name in OUTPUTS:
        ours_real = np.concatenate([np.asarray(ours[name])[b, :n] for b, n in rows])
        theirs = np.concatenate([reference.expected[name][b, :n] for b, n in rows])
        diff = np.abs(ours_real.astype(np.float64) - theirs.astype(np.float64))
        largest, mean = float(diff.max()), float(diff.mean())
        if name == "log_probs":
            limit = f"max <= {tol.log_prob_max}, mean <= {tol.log_prob_mean}"
            ok = largest <= tol.log_prob_max and mean <= tol.log_prob_mean
            over_mask = diff > tol.log_prob_max
        elif name == "continuous":
            allowed = np.maximum(tol.continuous_max, tol.continuous_steps * bfloat16_step(theirs))
            limit = f"max <= {tol.continuous_max}"
            if tol.continuous_steps:
                limit += f" or {tol.continuous_steps} bfloat16 steps"
            ok, over_mask = bool((diff <= allowed).all()), diff > tol.continuous_max
        else:
            limit, ok, over_mask = "", True, np.zeros_like(diff, dtype=bool)
        ok = ok and bool(np.isfinite(diff).all())
        over = int(over_mask.sum())
        with np.errstate(divide="ignore"):  # X's value 0: infinitely many steps away
            steps = (
                float((diff[over_mask] / bfloat16_step(theirs[over_mask])).max()) if over else 0.0
            )
        results.append(Difference(name, largest, mean, limit, ok, over, steps))
    return results
