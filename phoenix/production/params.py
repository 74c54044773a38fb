"""The production ranker's parameters: names, shapes, npz files, random init, device weights.

Parameters are a flat ``{name: array}`` map named by X's Haiku paths (``module/param``):
``~/user_hash_0_proj``, ``transformer/layer_stack/decoder_layer_0/multi_head_attention/qkv/w``
([L, ...]: the layers stacked on a leading axis, as X's layer stack holds them),
``recsys_aggregated_model/unembeddings``. X's checkpoints and reference files add ``/0`` (the
leaf of its ``Parameter`` wrapper); loading strips it. The hashed embedding table, optional,
is ``emb_table`` [V, W] (X keeps it apart from the Haiku parameters).

On disk: one npz of float32 arrays under those names (``save_params``/``load_params``).
X computes with every parameter rounded to bfloat16 (its parameter getter casts them) and so
do ``device_weights`` in bfloat16 mode.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.production.config import ProductionConfig

LAYER = "transformer/layer_stack/decoder_layer_0"
ATTENTION = f"{LAYER}/multi_head_attention"
HEAD = "recsys_aggregated_model"
EMB_TABLE = "emb_table"
SEQUENCES = ("hist", "cand")


def param_shapes(config: ProductionConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape (the hashed table excluded)."""
    c, h = config, config.hashes
    D, W, L = c.emb_size, c.emb_table_width, c.num_layers
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(h.num_user_hashes):
        shapes[f"~/user_hash_{i}_proj"] = (W, D)
    for i in range(h.num_ip_hashes):
        shapes[f"~/user_ip_hash_{i}_proj"] = (W, D)
    shapes.update({
        "~/user_feat_country_emb": (c.num_countries, D),
        "~/user_feat_language_emb": (c.num_languages, D),
        "~/user_feat_location_proj": (4 * c.location_num_frequencies, D),
        "~/user_feat_installed_apps_proj": (c.num_installed_apps, D),
        "~/user_feat_profile_gender_emb": (3, D),
        "~/user_feat_inferred_gender_emb": (2, D),
        "~/user_feat_age_bracket_emb": (c.num_age_brackets, D),
        "~/user_feat_age_years_vec": (D,),
    })  # fmt: skip
    for seq in SEQUENCES:
        for i in range(h.num_item_hashes):
            shapes[f"~/{seq}_post_hash_{i}_proj"] = (W, D)
        for i in range(h.num_author_hashes):
            shapes[f"~/{seq}_author_hash_{i}_proj"] = (W, D)
        shapes.update({
            f"~/{seq}_product_surface_emb": (c.product_surface_cardinality, D),
            f"~/{seq}_post_age_emb": (c.post_age_cardinality, D),
            f"~/{seq}_timezone_emb": (c.timezone_cardinality, D),
            f"~/{seq}_hour_of_day_emb": (c.hour_of_day_cardinality, D),
            f"~/{seq}_is_author_followed_by_viewer_emb": (2, D),
            f"~/{seq}_is_author_following_viewer_emb": (2, D),
            f"~/{seq}_count_lograw_mlp_in": (6, c.engagement_count_mlp_hidden_dim),
            f"~/{seq}_count_lograw_mlp_out": (c.engagement_count_mlp_hidden_dim, D),
        })  # fmt: skip
    shapes["~/cand_is_stale_post_14d_emb"] = (2, D)
    shapes["~/hist_action_emb"] = (c.output_vocab_size, D)
    shapes["~/hist_dwell_time_vec"] = (D,)
    shapes["~/feat_prep_post_sid_combined"] = (c.sid_levels * c.sid_table_size, c.sid_embed_dim)
    if c.sid_embed_dim != D:  # X projects only when the widths differ
        shapes["~/feat_prep_post_sid_proj"] = (c.sid_embed_dim, D)
    Hd, Kd = c.num_q_heads * c.key_size, c.num_kv_heads * c.key_size
    shapes.update({
        f"{LAYER}/pre_attn_norm/scale": (L, D),
        f"{ATTENTION}/qkv/w": (L, D, Hd + 2 * Kd),
        f"{ATTENTION}/q_norm/scale": (L, Hd),
        f"{ATTENTION}/k_norm/scale": (L, Kd),
        f"{ATTENTION}/out/w": (L, Hd, D),
        f"{LAYER}/pre_ffn_norm/scale": (L, D),
        f"{LAYER}/up_proj/w": (L, D, c.ffn_size),
        f"{LAYER}/down_proj/w": (L, c.ffn_size, D),
        f"{HEAD}/final_layer_norm/scale": (D,),
        f"{HEAD}/unembeddings": (D, c.output_vocab_size),
        f"{HEAD}/continuous_unembeddings": (D, c.num_continuous_actions),
    })  # fmt: skip
    return shapes


def canonical_name(name: str) -> str:
    """X's ``.../name/0`` (its Parameter leaf) -> ``.../name``."""
    return name[: -len("/0")] if name.endswith("/0") else name


def check_params(params: Mapping[str, np.ndarray], config: ProductionConfig) -> None:
    """Raise ValueError listing missing, unexpected and misshapen parameters."""
    expected = param_shapes(config)
    problems = []
    missing = sorted(set(expected) - set(params))
    unexpected = sorted(set(params) - set(expected) - {EMB_TABLE})
    if missing:
        problems.append(f"missing {missing}")
    if unexpected:
        problems.append(f"unexpected {unexpected}")
    for name, shape in expected.items():
        if name in params and tuple(np.shape(params[name])) != shape:
            problems.append(f"{name}: shape {tuple(np.shape(params[name]))}, expected {shape}")
    if EMB_TABLE in params:
        rows, width = (tuple(np.shape(params[EMB_TABLE])) + (0, 0))[:2]
        if np.ndim(params[EMB_TABLE]) != 2 or width != config.emb_table_width:
            problems.append(f"{EMB_TABLE}: shape {np.shape(params[EMB_TABLE])}, expected [V, "
                            f"{config.emb_table_width}]")  # fmt: skip
        elif rows < config.hashes.num_rows:
            problems.append(f"{EMB_TABLE}: {rows} rows, the hashes reach {config.hashes.num_rows}")
    if problems:
        raise ValueError("parameters do not fit the config: " + "; ".join(problems))


def load_params(path: str | Path, config: ProductionConfig | None = None) -> dict[str, np.ndarray]:
    """An npz of parameters (ours or X's reference, ``/0`` leaves stripped); checked against
    ``config`` when given."""
    with np.load(path) as data:
        params = {canonical_name(name): np.asarray(data[name]) for name in data.files}
    if config is not None:
        check_params(params, config)
    return params


def save_params(path: str | Path, params: Mapping[str, np.ndarray]) -> None:
    """Write ``params`` as one npz of float32 arrays under their names."""
    arrays: dict[str, Any] = {name: np.asarray(value, np.float32) for name, value in params.items()}
    np.savez(path, **arrays)


def init_params(config: ProductionConfig, seed: int = 0, table_rows: int = 0) -> dict:
    """Random parameters with X's initial scales (unit RMSNorm gains, 1/sqrt(fan) normals);
    ``table_rows`` > 0 adds an ``emb_table`` of that many rows (row 0 zero)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(config).items():
        if name.endswith("/scale"):
            params[name] = np.ones(shape, np.float32)
            continue
        # tables and vectors by their width, projections [.., in, out] by their input
        fan = shape[-1] if name.endswith(("_emb", "_combined", "_vec")) else shape[-2]
        params[name] = (rng.standard_normal(shape) / np.sqrt(fan)).astype(np.float32)
    if table_rows:
        table = rng.standard_normal((table_rows, config.emb_table_width)).astype(np.float32)
        table[0] = 0.0
        params[EMB_TABLE] = table * 0.02
    return params


class LayerStack(NamedTuple):
    """The transformer layers' weights, stacked on a leading [L] axis."""

    pre_attn_norm: jax.Array  # [L, D]
    qkv: jax.Array  # [L, D, (H + 2K) d]: per kv head, its G query heads, key, value
    q_norm: jax.Array  # [L, H d]
    k_norm: jax.Array  # [L, K d]
    out: jax.Array  # [L, H d, D]
    pre_ffn_norm: jax.Array  # [L, D]
    up: jax.Array  # [L, D, F]
    down: jax.Array  # [L, F, D]


class SequenceTables(NamedTuple):
    """What turns one post of a history (or of the candidates) into a token."""

    post_hash: jax.Array  # [nI, W, D]
    author_hash: jax.Array  # [nA, W, D]
    product_surface: jax.Array  # [16, D]
    post_age: jax.Array  # [82, D]
    timezone: jax.Array  # [32, D]
    hour_of_day: jax.Array  # [25, D]
    followed_by_viewer: jax.Array  # [2, D]
    following_viewer: jax.Array  # [2, D]
    counts_in: jax.Array  # [6, M]
    counts_out: jax.Array  # [M, D]


class ProductionWeights(NamedTuple):
    """Every parameter in the compute dtype, on the device, arranged for the forward."""

    user_hash: jax.Array  # [nU, W, D]
    user_ip_hash: jax.Array  # [nIP, W, D]
    country: jax.Array  # [250, D]
    language: jax.Array  # [200, D]
    location: jax.Array  # [4 * frequencies, D]
    installed_apps: jax.Array  # [64, D]
    profile_gender: jax.Array  # [3, D]
    inferred_gender: jax.Array  # [2, D]
    age_bracket: jax.Array  # [10, D]
    age_years: jax.Array  # [D]
    history: SequenceTables
    candidates: SequenceTables
    stale: jax.Array  # [2, D]
    history_actions: jax.Array  # [A, D]
    dwell: jax.Array  # [D]
    sid_table: jax.Array  # [levels * (codebook + 1), E]: each level's code-0 row zero
    sid_proj: jax.Array | None  # [E, D], None when E == D
    layers: LayerStack
    final_norm: jax.Array  # [D]
    unembed: jax.Array  # [D, A]
    continuous: jax.Array  # [D, N]


def device_weights(params: Mapping[str, np.ndarray], config: ProductionConfig) -> ProductionWeights:
    """``params`` checked, cast to the compute dtype on the host (ml_dtypes rounds as XLA
    does) and put on the device once."""
    check_params(params, config)
    dtype = jnp.dtype(config.compute_dtype)
    put = lambda array: jax.device_put(np.asarray(array).astype(dtype))  # noqa: E731
    get = lambda name: put(params[name])  # noqa: E731
    stack = lambda names: put(np.stack([params[n] for n in names]))  # noqa: E731
    h = config.hashes

    def tables(seq: str) -> SequenceTables:
        return SequenceTables(
            post_hash=stack([f"~/{seq}_post_hash_{i}_proj" for i in range(h.num_item_hashes)]),
            author_hash=stack(
                [f"~/{seq}_author_hash_{i}_proj" for i in range(h.num_author_hashes)]
            ),
            product_surface=get(f"~/{seq}_product_surface_emb"),
            post_age=get(f"~/{seq}_post_age_emb"),
            timezone=get(f"~/{seq}_timezone_emb"),
            hour_of_day=get(f"~/{seq}_hour_of_day_emb"),
            followed_by_viewer=get(f"~/{seq}_is_author_followed_by_viewer_emb"),
            following_viewer=get(f"~/{seq}_is_author_following_viewer_emb"),
            counts_in=get(f"~/{seq}_count_lograw_mlp_in"),
            counts_out=get(f"~/{seq}_count_lograw_mlp_out"),
        )

    sid = np.array(params["~/feat_prep_post_sid_combined"], np.float32)
    sid[:: config.sid_table_size] = 0.0  # code 0 of every level: a missing id adds nothing
    return ProductionWeights(
        user_hash=stack([f"~/user_hash_{i}_proj" for i in range(h.num_user_hashes)]),
        user_ip_hash=stack([f"~/user_ip_hash_{i}_proj" for i in range(h.num_ip_hashes)]),
        country=get("~/user_feat_country_emb"),
        language=get("~/user_feat_language_emb"),
        location=get("~/user_feat_location_proj"),
        installed_apps=get("~/user_feat_installed_apps_proj"),
        profile_gender=get("~/user_feat_profile_gender_emb"),
        inferred_gender=get("~/user_feat_inferred_gender_emb"),
        age_bracket=get("~/user_feat_age_bracket_emb"),
        age_years=get("~/user_feat_age_years_vec"),
        history=tables("hist"),
        candidates=tables("cand"),
        stale=get("~/cand_is_stale_post_14d_emb"),
        history_actions=get("~/hist_action_emb"),
        dwell=get("~/hist_dwell_time_vec"),
        sid_table=put(sid),
        sid_proj=get("~/feat_prep_post_sid_proj")
        if config.sid_embed_dim != config.emb_size
        else None,
        layers=LayerStack(
            pre_attn_norm=get(f"{LAYER}/pre_attn_norm/scale"),
            qkv=get(f"{ATTENTION}/qkv/w"),
            q_norm=get(f"{ATTENTION}/q_norm/scale"),
            k_norm=get(f"{ATTENTION}/k_norm/scale"),
            out=get(f"{ATTENTION}/out/w"),
            pre_ffn_norm=get(f"{LAYER}/pre_ffn_norm/scale"),
            up=get(f"{LAYER}/up_proj/w"),
            down=get(f"{LAYER}/down_proj/w"),
        ),
        final_norm=get(f"{HEAD}/final_layer_norm/scale"),
        unembed=get(f"{HEAD}/unembeddings"),
        continuous=get(f"{HEAD}/continuous_unembeddings"),
    )


def device_table(params: Mapping[str, np.ndarray], config: ProductionConfig) -> jax.Array:
    """The hashed embedding table [V, W] in the compute dtype, on the device."""
    if EMB_TABLE not in params:
        raise ValueError(f"the parameters hold no {EMB_TABLE!r}: pass gathered rows instead")
    return jax.device_put(np.asarray(params[EMB_TABLE]).astype(jnp.dtype(config.compute_dtype)))
