"""The production ranker's typed configuration, ``NANO`` by default, and its overrides.

Field names follow X's config names where X has one (``emb_size``, ``num_layers``,
``num_q_heads``, ``key_size``, ``history_seq_len``, ``sid_embed_dim``, ...), so the override
strings X's tools take (``history_seq_len=1022``, ``model_config.model_config.emb_size=256``:
the last dotted component names the field) apply here unchanged. ``apply_overrides`` also
knows X's serving-only keys: they change nothing in the forward, or name a variant this
family does not implement, which it refuses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Sequence

AttentionKeys = Literal["serving_kernel", "exact"]
ComputeDtype = Literal["bfloat16", "float32"]

GALLERY_PAGE = 10  # X's ProductSurface.PRODUCT_SURFACE_GALLERY_PAGE
DWELL_TIME = 1  # X's ContinuousActionName.DWELL_TIME: the continuous slot with a routed head


@dataclass(frozen=True)
class HashConfig:
    """How raw ids become rows of the hashed embedding table (X's ``HashKeys``).

    Row 0 is padding (id 0); rows ``[1, reserved_rows)`` are reserved; then the user, item,
    author and IP tables follow each other, each ``*_table_size`` rows of which the first is
    never hit (a hash lands in ``[1, size - 1]`` of its table).
    """

    user_table_size: int = 100_000
    item_table_size: int = 100_000
    author_table_size: int = 30_000
    ip_table_size: int = 10_000
    item_hash_vocab_size: int = 0  # 0: the item table's size (X's effective item buckets)
    reserved_rows: int = 65  # 1 padding row + 64 action rows
    user_scales: tuple[int, ...] = (196_742_702, 1_852_108_266)
    user_biases: tuple[int, ...] = (1_935_840_681, 167_407_236)
    user_modulus: int = 2_859_568_897
    item_scales: tuple[int, ...] = (2_161_410_491, 1_754_358_832)
    item_biases: tuple[int, ...] = (1_935_840_681, 167_407_236)
    item_modulus: int = 2_361_375_383
    author_scales: tuple[int, ...] = (371_965_780, 328_930_218)
    author_biases: tuple[int, ...] = (139_686_260, 37_755_056)
    author_modulus: int = 631_860_353
    ip_scales: tuple[int, ...] = (529_482_163, 1_327_604_891)
    ip_biases: tuple[int, ...] = (742_961_053, 318_205_477)
    ip_modulus: int = 1_073_741_789

    def __post_init__(self) -> None:
        for entity in ("user", "item", "author", "ip"):
            scales, biases = getattr(self, f"{entity}_scales"), getattr(self, f"{entity}_biases")
            if len(scales) != len(biases) or not scales:
                raise ValueError(
                    f"{entity}: as many scales as biases (at least one) expected, "
                    f"got {len(scales)} scales and {len(biases)} biases"
                )
            if getattr(self, f"{entity}_modulus") <= 0:
                raise ValueError(f"{entity}_modulus must be positive")

    @property
    def num_user_hashes(self) -> int:
        return len(self.user_scales)

    @property
    def num_item_hashes(self) -> int:
        return len(self.item_scales)

    @property
    def num_author_hashes(self) -> int:
        return len(self.author_scales)

    @property
    def num_ip_hashes(self) -> int:
        return len(self.ip_scales)

    def offset(self, entity: str) -> int:
        """The row before the first row of ``entity``'s table (a hash in [1, size - 1] adds)."""
        order = ("user", "item", "author", "ip")
        sizes = [self.user_table_size, self.item_table_size, self.author_table_size]
        return self.reserved_rows + sum(sizes[: order.index(entity)])

    @property
    def num_rows(self) -> int:
        """Rows a table must hold for every hash to land inside it."""
        return self.offset("ip") + self.ip_table_size


@dataclass(frozen=True)
class ProductionConfig:
    """X's nano production ranker unless overridden (``home_direct_packed_nano`` served with
    ``history_seq_len=1022 candidate_seq_len=64 right_anchored_rope=True``)."""

    # trunk
    emb_size: int = 512
    num_layers: int = 4
    num_q_heads: int = 4
    num_kv_heads: int = 2
    key_size: int = 128
    widening_factor: float = 2.0
    ffn_base_size: int = 32
    norm_eps: float = 1e-5
    rope_base_exponent: int = 10_000
    # sequence
    history_seq_len: int = 1022
    candidate_seq_len: int = 64
    attention_block: int = 128  # the serving kernel's key block
    attention_keys: AttentionKeys = "serving_kernel"
    compute_dtype: ComputeDtype = "bfloat16"
    # hashed ids
    emb_table_width: int = 128
    hashes: HashConfig = HashConfig()
    # semantic ids
    sid_num_levels: int = 6
    sid_codebook_size: int = 256
    sid_embed_dim: int = 1024
    sid_hash_level: bool = True
    # context features
    product_surface_cardinality: int = 16
    post_age_granularity_mins: int = 60
    post_age_max_mins: int = 4800
    timezone_cardinality: int = 32
    hour_of_day_cardinality: int = 25
    engagement_count_mlp_hidden_dim: int = 64
    dwell_time_norm_scale: float = 30.0
    # user profile features
    num_countries: int = 250
    num_languages: int = 200
    num_age_brackets: int = 10
    num_installed_apps: int = 64
    location_num_frequencies: int = 8
    # outputs
    output_vocab_size: int = 64
    num_continuous_actions: int = 8
    dwell_softplus_surfaces: tuple[int, ...] = (GALLERY_PAGE,)
    dwell_softplus_cap: float = 300.0
    dwell_sigmoid_scale: float = 30.0

    def __post_init__(self) -> None:
        positive = [f.name for f in dataclasses.fields(self) if f.type in ("int", "float")]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(
                f"num_q_heads ({self.num_q_heads}) must be a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if self.key_size % 2:
            raise ValueError(f"key_size must be even (RoPE rotates pairs), got {self.key_size}")
        if self.prefix_len % self.attention_block:
            raise ValueError(
                f"user + history tokens ({self.num_user_prefix_tokens} + "
                f"{self.history_seq_len} = {self.prefix_len}) must fill whole attention blocks "
                f"of {self.attention_block}: candidates in a block that holds history would "
                "attend to each other under X's serving kernel"
            )
        if self.attention_keys not in typing.get_args(AttentionKeys):
            raise ValueError(
                f"attention_keys must be one of {typing.get_args(AttentionKeys)}, "
                f"got {self.attention_keys!r}"
            )
        if self.compute_dtype not in typing.get_args(ComputeDtype):
            raise ValueError(
                f"compute_dtype must be one of {typing.get_args(ComputeDtype)}, "
                f"got {self.compute_dtype!r}"
            )

    # derived sizes
    @property
    def num_user_prefix_tokens(self) -> int:
        """The user token and the user-features token."""
        return 2

    @property
    def prefix_len(self) -> int:
        """User tokens + history: the part computed once per request (P)."""
        return self.num_user_prefix_tokens + self.history_seq_len

    @property
    def sequence_len(self) -> int:
        """X's ``sequence_len``: prefix + candidates, before padding to the block."""
        return self.prefix_len + self.candidate_seq_len

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def ffn_size(self) -> int:
        size = int(self.widening_factor * self.emb_size)
        return (size + self.ffn_base_size - 1) // self.ffn_base_size * self.ffn_base_size

    @property
    def post_age_cardinality(self) -> int:
        """Buckets 1..max/granularity, 0 for unknown and one overflow bucket."""
        return self.post_age_max_mins // self.post_age_granularity_mins + 2

    @property
    def sid_table_size(self) -> int:
        """Codes per level: 0 (missing) and 1..codebook."""
        return self.sid_codebook_size + 1

    @property
    def sid_levels(self) -> int:
        """Semantic-id levels plus the level X derives from the post hash."""
        return self.sid_num_levels + int(self.sid_hash_level)

    @property
    def input_scale(self) -> float:
        return math.sqrt(self.emb_size)

    @property
    def output_scale(self) -> float:
        return math.sqrt(512 / self.emb_size) * 2.0

    @property
    def attention_scale(self) -> float:
        return math.sqrt(128) / self.key_size


NANO = ProductionConfig()

# X's serving-time overrides that change nothing in this forward, with the values that keep
# it so (any value for those mapped to None).
NEUTRAL_OVERRIDES: dict[str, str | None] = {
    "num_negatives_per_example": "0",
    "num_global_negatives_per_example": "0",
    "use_seqpack": "False",
    "right_anchored_rope": "True",
    "bs_per_device": None,
    "ep": None,
    "dp": None,
}
# X's names for our fields.
ALIASES = {"query_heads": "num_q_heads", "kv_heads": "num_kv_heads"}
# X's attention implementations: the serving kernel's key set, or the training kernel's.
ATTENTION_IMPLS = {"pallas_ranker_attn_infer": "serving_kernel", "pallas_ranker_attn": "exact"}


def apply_overrides(config: ProductionConfig, overrides: Sequence[str]) -> ProductionConfig:
    """``config`` with ``key=value`` overrides (X's spelling accepted; see the module doc).

    Raises ValueError naming the override that cannot apply.
    """
    changes: dict[str, Any] = {}
    hash_changes: dict[str, Any] = {}
    sequence_len = None
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: expected key=value")
        name = ALIASES.get(key.rsplit(".", 1)[-1], key.rsplit(".", 1)[-1])
        if name in NEUTRAL_OVERRIDES:
            expected = NEUTRAL_OVERRIDES[name]
            if expected is not None and _parse_bool_or_str(value) != _parse_bool_or_str(expected):
                raise ValueError(
                    f"override {item!r}: this family implements {name}={expected} only"
                )
            continue
        if name == "attn_impl":
            if value not in ATTENTION_IMPLS:
                raise ValueError(
                    f"override {item!r}: attn_impl must be one of {sorted(ATTENTION_IMPLS)}"
                )
            changes["attention_keys"] = ATTENTION_IMPLS[value]
        elif name == "sequence_len":
            sequence_len = _parse(item, value, int)
        elif name in _FIELD_TYPES:
            changes[name] = _parse(item, value, _FIELD_TYPES[name])
        elif name in _HASH_FIELD_TYPES:
            hash_changes[name] = _parse(item, value, _HASH_FIELD_TYPES[name])
        else:
            raise ValueError(f"override {item!r}: no field {name!r} in ProductionConfig")
    if hash_changes:
        changes["hashes"] = dataclasses.replace(config.hashes, **hash_changes)
    result = dataclasses.replace(config, **changes)
    if sequence_len is not None and sequence_len != result.sequence_len:
        raise ValueError(
            f"override sequence_len={sequence_len}: the config's sequence is "
            f"{result.num_user_prefix_tokens} + {result.history_seq_len} + "
            f"{result.candidate_seq_len} = {result.sequence_len} tokens"
        )
    return result


def _field_types(cls: type) -> dict[str, object]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name != "hashes"}


_FIELD_TYPES = _field_types(ProductionConfig)
_HASH_FIELD_TYPES = _field_types(HashConfig)


def _parse_bool_or_str(value: str) -> str:
    return value.strip().lower()


def _parse(item: str, value: str, kind: object) -> object:
    """``value`` as ``kind`` (int, float, bool, str, a Literal, tuple[int, ...])."""
    try:
        if kind is bool:
            lowered = value.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ValueError(value)
            return lowered in ("true", "1")
        if kind is int:
            return int(value.replace("_", ""))
        if kind is float:
            return float(value)
        if typing.get_origin(kind) is Literal:
            if value not in typing.get_args(kind):
                raise ValueError(f"one of {typing.get_args(kind)} expected")
            return value
        if typing.get_origin(kind) is tuple:
            parts = value.strip("()[] ").split(",")
            return tuple(int(p) for p in parts if p.strip())
        if kind is str or isinstance(kind, types.GenericAlias):
            return value
    except ValueError as error:
        raise ValueError(f"override {item!r}: {error}") from None
    raise ValueError(f"override {item!r}: cannot parse a value of type {kind}")
