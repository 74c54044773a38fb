"""Phoenix ranking model: one transformer pass over [user, history, candidates].

API-compatible with the original ``recsys_model`` module (names, keywords, parameter
names under ``phoenix_model/``). Candidates attend to the user + history context and to
themselves only (candidate isolation), so a candidate's score never depends on the others.

Shape glossary
  B  batch (users)              S  history length        C  candidates
  D  emb_size                   A  num_actions           N  num_continuous_actions (8)
  nU/nI/nA  hashes per user / item (post) / author
  T  1 + S + C (user token, history tokens, candidate tokens)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Tuple

import haiku as hk
import jax
import jax.numpy as jnp

from phoenix.grok import Transformer, TransformerConfig, layer_norm, right_anchored_rope_positions

logger = logging.getLogger(__name__)

POST_AGE_MAX_MINUTES = 4800  # 80 hours; older posts share one overflow bucket
DWELL_TIME_INDEX = 1  # column of ``history_continuous_actions`` holding dwell seconds
NUM_CONTINUOUS = 8  # continuous actions: width of history_continuous_actions, continuous_preds
# Impression time given to every candidate of known age: a post age in seconds becomes the
# timestamps (REFERENCE_TIME, REFERENCE_TIME - age) that compute_post_age_bucket reads.
REFERENCE_TIME = 1_700_000_000


def compute_post_age_bucket(
    impr_ts_sec: jax.Array,
    post_creation_ts_sec: jax.Array,
    granularity_mins: int = 60,
) -> jax.Array:
    """Bucket of a post's age at impression time (int32, same shape as the inputs).

    0 = unknown (a timestamp is 0) or negative age; 1.. = age // granularity + 1;
    ``POST_AGE_MAX_MINUTES // granularity + 1`` = overflow.
    """
    overflow = POST_AGE_MAX_MINUTES // granularity_mins + 1
    age_minutes = (impr_ts_sec - post_creation_ts_sec) // 60
    bucket = jnp.clip(age_minutes // granularity_mins + 1, 0, overflow)
    unknown = (age_minutes < 0) | (impr_ts_sec == 0) | (post_creation_ts_sec == 0)
    return jnp.where(unknown, 0, bucket).astype(jnp.int32)


@dataclass
class NormConfig:
    """How a continuous value is squashed into [0, 1]."""

    norm_scale: float = 30.0
    use_log: bool = False


@dataclass
class ContinuousActionConfig:
    """Training settings of a continuous action; inference reads only ``norm_config``."""

    loss_weight: float = 0.0
    loss_type: str = "mae"
    tweedie_power: float = 1.5
    norm_config: Optional[NormConfig] = None

    def __post_init__(self):
        if self.norm_config is None:
            self.norm_config = NormConfig()


def normalize_continuous_value(values: jax.Array, config: NormConfig) -> jax.Array:
    """Clip to [0, norm_scale], then scale linearly (or by log1p) into [0, 1]."""
    clipped = jnp.clip(values, 0.0, config.norm_scale)
    if config.use_log:
        return jnp.log1p(clipped) / jnp.log1p(config.norm_scale)
    return clipped / config.norm_scale


@dataclass
class HashConfig:
    """Number of hash functions per entity type."""

    num_user_hashes: int = 2
    num_item_hashes: int = 2
    num_author_hashes: int = 2
    num_ip_hashes: int = 0


@dataclass
class RecsysEmbeddings:
    """Embeddings already looked up from the hash tables (one row per hash)."""

    user_embeddings: jax.typing.ArrayLike  # [B, nU, D]
    history_post_embeddings: jax.typing.ArrayLike  # [B, S, nI, D]
    candidate_post_embeddings: jax.typing.ArrayLike  # [B, C, nI, D]
    history_author_embeddings: jax.typing.ArrayLike  # [B, S, nA, D]
    candidate_author_embeddings: jax.typing.ArrayLike  # [B, C, nA, D]
    user_ip_embeddings: Optional[jax.typing.ArrayLike] = None  # [B, nIP, D]


def _flatten_embeddings(emb: RecsysEmbeddings):
    return tuple(getattr(emb, f) for f in _EMBEDDING_FIELDS), None


_EMBEDDING_FIELDS = tuple(RecsysEmbeddings.__dataclass_fields__)
# A pytree, so that embeddings can be passed straight into jitted functions.
jax.tree_util.register_pytree_node(
    RecsysEmbeddings, _flatten_embeddings, lambda _, leaves: RecsysEmbeddings(*leaves)
)


class RecsysModelOutput(NamedTuple):
    logits: jax.Array  # [B, C, A]
    continuous_preds: Optional[jax.Array] = None  # [B, C, N]


class RecsysBatch(NamedTuple):
    """Hashed features of a batch; hash 0 marks padding. History runs oldest to newest."""

    user_hashes: jax.typing.ArrayLike  # [B, nU]
    history_post_hashes: jax.typing.ArrayLike  # [B, S, nI]
    history_author_hashes: jax.typing.ArrayLike  # [B, S, nA]
    history_actions: jax.typing.ArrayLike  # [B, S, A] multi-hot
    history_product_surface: jax.typing.ArrayLike  # [B, S]
    candidate_post_hashes: jax.typing.ArrayLike  # [B, C, nI]
    candidate_author_hashes: jax.typing.ArrayLike  # [B, C, nA]
    candidate_product_surface: jax.typing.ArrayLike  # [B, C]
    history_continuous_actions: Optional[jax.typing.ArrayLike] = None  # [B, S, N]
    candidate_impr_ts: Optional[jax.typing.ArrayLike] = None  # [B, C] seconds
    candidate_post_creation_ts: Optional[jax.typing.ArrayLike] = None  # [B, C] seconds
    user_ip_hashes: Optional[jax.typing.ArrayLike] = None  # [B, nIP]


def _fan_out_init(scale: float):
    """Variance-scaling initialiser for [fan_in, D] projections (fan taken from D)."""
    base = hk.initializers.VarianceScaling(scale, mode="fan_out")
    return lambda shape, dtype: base(list(reversed(shape)), dtype).T


def _project(parts: list, name: str, emb_size: int, embed_init_scale: float) -> jax.Array:
    """Concatenate feature blocks on the last axis and project them to D with ``name``."""
    features = jnp.concatenate(parts, axis=-1)  # [..., sum of widths]
    weights = hk.get_parameter(
        name, [features.shape[-1], emb_size], jnp.float32, init=_fan_out_init(embed_init_scale)
    )
    return jnp.dot(features.astype(jnp.float32), weights).astype(features.dtype)  # [..., D]


def _flatten_hashes(embeddings: jax.Array) -> jax.Array:
    """[..., n_hashes, D] -> [..., n_hashes * D]."""
    return embeddings.reshape(*embeddings.shape[:-2], -1)


def block_user_reduce(
    user_hashes: jax.Array,
    user_embeddings: jax.Array,
    num_user_hashes: int,
    emb_size: int,
    embed_init_scale: float = 1.0,
    *,
    user_ip_embeddings: Optional[jax.Array] = None,
    num_ip_hashes: int = 0,
) -> Tuple[jax.Array, jax.Array]:
    """User token [B, 1, D] from its hash embeddings (``proj_mat_1``) and its mask [B, 1]."""
    batch = user_embeddings.shape[0]
    flat = user_embeddings.reshape(batch, 1, num_user_hashes * emb_size)  # [B, 1, nU*D]
    token = _project([flat], "proj_mat_1", emb_size, embed_init_scale)  # [B, 1, D]
    token = token.astype(user_embeddings.dtype)
    if user_ip_embeddings is not None and num_ip_hashes > 0:
        ip = user_ip_embeddings.reshape(batch, num_ip_hashes, emb_size)
        token = token + jnp.sum(ip, axis=1, keepdims=True)  # [B, 1, D]
    mask = (user_hashes[:, 0] != 0).reshape(batch, 1)  # [B, 1]
    return token, mask


def block_history_reduce(
    history_post_hashes: jax.Array,
    history_post_embeddings: jax.Array,
    history_author_embeddings: jax.Array,
    history_product_surface_embeddings: jax.Array,
    history_actions_embeddings: jax.Array,
    num_item_hashes: int,
    num_author_hashes: int,
    embed_init_scale: float = 1.0,
    *,
    history_continuous_embeddings: Optional[jax.Array] = None,
    history_post_age_embeddings: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """History tokens [B, S, D] (``proj_mat_3``) and their mask [B, S].

    Feature order: post hashes, author hashes, actions, product surface, then the optional
    continuous (dwell) and post-age embeddings.
    """
    del num_item_hashes, num_author_hashes  # implied by the embedding shapes
    batch, seq, _, emb_size = history_post_embeddings.shape
    parts = [
        _flatten_hashes(history_post_embeddings),  # [B, S, nI*D]
        _flatten_hashes(history_author_embeddings),  # [B, S, nA*D]
        history_actions_embeddings,  # [B, S, D]
        history_product_surface_embeddings,  # [B, S, D]
    ]
    parts += [
        p for p in (history_continuous_embeddings, history_post_age_embeddings) if p is not None
    ]
    tokens = _project(parts, "proj_mat_3", emb_size, embed_init_scale)  # [B, S, D]
    mask = (history_post_hashes[:, :, 0] != 0).reshape(batch, seq)  # [B, S]
    return tokens, mask


def block_candidate_reduce(
    candidate_post_hashes: jax.Array,
    candidate_post_embeddings: jax.Array,
    candidate_author_embeddings: jax.Array,
    candidate_product_surface_embeddings: jax.Array,
    num_item_hashes: int,
    num_author_hashes: int,
    embed_init_scale: float = 1.0,
    *,
    candidate_post_age_embeddings: Optional[jax.Array] = None,
) -> Tuple[jax.Array, jax.Array]:
    """Candidate tokens [B, C, D] (``proj_mat_2``) and their mask [B, C].

    Feature order: post hashes, author hashes, product surface, optional post age.
    """
    del num_item_hashes, num_author_hashes  # implied by the embedding shapes
    batch, num_candidates, _, emb_size = candidate_post_embeddings.shape
    parts = [
        _flatten_hashes(candidate_post_embeddings),  # [B, C, nI*D]
        _flatten_hashes(candidate_author_embeddings),  # [B, C, nA*D]
        candidate_product_surface_embeddings,  # [B, C, D]
    ]
    if candidate_post_age_embeddings is not None:
        parts.append(candidate_post_age_embeddings)  # [B, C, D]
    tokens = _project(parts, "proj_mat_2", emb_size, embed_init_scale)  # [B, C, D]
    mask = (candidate_post_hashes[:, :, 0] != 0).reshape(batch, num_candidates)  # [B, C]
    return tokens, mask


@dataclass
class PhoenixModelConfig:
    """Configuration of the ranking model."""

    model: TransformerConfig
    emb_size: int
    num_actions: int
    history_seq_len: int = 128
    candidate_seq_len: int = 32
    name: Optional[str] = None
    fprop_dtype: Any = jnp.bfloat16
    hash_config: Optional[HashConfig] = None
    product_surface_vocab_size: int = 16
    post_age_granularity_mins: int = 60
    num_continuous_actions: int = NUM_CONTINUOUS
    continuous_action_hidden_dim: int = 64
    continuous_action_config: Optional[ContinuousActionConfig] = None
    use_ip_address: bool = False
    right_anchored_rope: bool = False
    mask_neg_feedback_on_negatives: bool = True  # training-time option; unused at inference

    _initialized = False

    def __post_init__(self):
        if self.hash_config is None:
            self.hash_config = HashConfig()
        if self.continuous_action_config is None:
            self.continuous_action_config = ContinuousActionConfig()

    @property
    def post_age_vocab_size(self) -> int:
        """Normal buckets + the missing bucket (0) + the overflow bucket."""
        return POST_AGE_MAX_MINUTES // self.post_age_granularity_mins + 2

    def initialize(self):
        self._initialized = True
        return self

    def make(self) -> PhoenixModel:
        if not self._initialized:
            self.initialize()
        return PhoenixModel(model=self.model.make(), config=self, fprop_dtype=self.fprop_dtype)


class _PhoenixFeatures:
    """Embedding helpers shared by the ranking and the retrieval modules (a mixin)."""

    config: Any
    fprop_dtype: Any

    def _get_action_embeddings(self, actions: jax.Array) -> jax.Array:
        """Signed multi-hot actions ({0,1} -> {-1,+1}) @ ``action_projection``; 0 if none."""
        num_actions = actions.shape[-1]
        projection = hk.get_parameter(
            "action_projection",
            [num_actions, self.config.emb_size],
            jnp.float32,
            init=hk.initializers.VarianceScaling(1.0, mode="fan_out"),
        )
        signed = (2 * actions - 1).astype(jnp.float32)  # [B, S, A]
        embedded = jnp.dot(signed, projection)  # [B, S, D]
        any_action = jnp.any(actions, axis=-1, keepdims=True)  # [B, S, 1]
        return (embedded * any_action).astype(self.fprop_dtype)

    def _single_hot_to_embeddings(
        self, input: jax.typing.ArrayLike, vocab_size: int, emb_size: int, name: str
    ) -> jax.Array:
        """Look indices [B, L] up in table ``name`` [vocab, D] (as a one-hot matmul)."""
        table = hk.get_parameter(
            name,
            [vocab_size, emb_size],
            jnp.float32,
            init=hk.initializers.VarianceScaling(1.0, mode="fan_out"),
        )
        return jnp.dot(jax.nn.one_hot(input, vocab_size), table).astype(self.fprop_dtype)


@dataclass
class PhoenixModel(_PhoenixFeatures, hk.Module):
    """Ranking transformer: logits [B, C, A] and continuous predictions [B, C, N]."""

    model: Transformer
    config: PhoenixModelConfig
    fprop_dtype: Any = jnp.bfloat16
    name: Optional[str] = None

    def _dwell_time_embeddings(self, batch: RecsysBatch) -> jax.Array:
        """Dwell seconds -> normalised -> [x] @ proj1 -> GELU -> @ proj2: [B, S, D]."""
        config = self.config
        batch_size, seq = jnp.shape(batch.history_product_surface)
        if batch.history_continuous_actions is None:
            dwell = jnp.zeros((batch_size, seq), jnp.float32)
        else:
            dwell = jnp.asarray(batch.history_continuous_actions)[:, :, DWELL_TIME_INDEX]
        assert config.continuous_action_config is not None  # set by __post_init__
        norm = config.continuous_action_config.norm_config
        assert norm is not None  # set by ContinuousActionConfig.__post_init__
        x = normalize_continuous_value(dwell, norm)[..., None]  # [B, S, 1]
        hidden_dim = config.continuous_action_hidden_dim
        proj1 = hk.get_parameter(
            "history_dwell_time_proj1", [1, hidden_dim], jnp.float32, init=_fan_out_init(1.0)
        )
        proj2 = hk.get_parameter(
            "history_dwell_time_proj2",
            [hidden_dim, config.emb_size],
            jnp.float32,
            init=_fan_out_init(1.0),
        )
        hidden = jax.nn.gelu(jnp.dot(x.astype(jnp.float32), proj1))  # [B, S, hidden]
        return jnp.dot(hidden, proj2).astype(self.fprop_dtype)  # [B, S, D]

    def _post_age_buckets(self, batch: RecsysBatch) -> jax.Array:
        if batch.candidate_impr_ts is None or batch.candidate_post_creation_ts is None:
            return jnp.zeros(jnp.shape(batch.candidate_product_surface), jnp.int32)
        return compute_post_age_bucket(
            jnp.asarray(batch.candidate_impr_ts),
            jnp.asarray(batch.candidate_post_creation_ts),
            self.config.post_age_granularity_mins,
        )

    def _surface_embeddings(self, surfaces: jax.typing.ArrayLike) -> jax.Array:
        """Product surfaces [B, L] -> [B, L, D] (one table shared by history and candidates)."""
        config = self.config
        return self._single_hot_to_embeddings(
            surfaces,
            config.product_surface_vocab_size,
            config.emb_size,
            "product_surface_embedding_table",
        )

    def build_context_inputs(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> Tuple[jax.Array, jax.Array]:
        """User + history tokens [B, 1+S, D] and their padding mask [B, 1+S]."""
        config = self.config
        hashes = config.hash_config
        assert hashes is not None  # set by __post_init__
        ip_embeddings = recsys_embeddings.user_ip_embeddings
        user, user_mask = block_user_reduce(
            jnp.asarray(batch.user_hashes),
            jnp.asarray(recsys_embeddings.user_embeddings),
            hashes.num_user_hashes,
            config.emb_size,
            1.0,
            user_ip_embeddings=None if ip_embeddings is None else jnp.asarray(ip_embeddings),
            num_ip_hashes=hashes.num_ip_hashes,
        )
        history, history_mask = block_history_reduce(
            jnp.asarray(batch.history_post_hashes),
            jnp.asarray(recsys_embeddings.history_post_embeddings),
            jnp.asarray(recsys_embeddings.history_author_embeddings),
            self._surface_embeddings(batch.history_product_surface),
            self._get_action_embeddings(jnp.asarray(batch.history_actions)),
            hashes.num_item_hashes,
            hashes.num_author_hashes,
            1.0,
            history_continuous_embeddings=self._dwell_time_embeddings(batch),
        )
        tokens = jnp.concatenate([user, history], axis=1)  # [B, 1+S, D]
        mask = jnp.concatenate([user_mask, history_mask], axis=1)  # [B, 1+S]
        return tokens.astype(self.fprop_dtype), mask

    def build_candidate_inputs(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> Tuple[jax.Array, jax.Array]:
        """Candidate tokens [B, C, D] and their padding mask [B, C]."""
        config = self.config
        hashes = config.hash_config
        assert hashes is not None  # set by __post_init__
        post_age = self._single_hot_to_embeddings(
            self._post_age_buckets(batch),
            config.post_age_vocab_size,
            config.emb_size,
            "post_age_embedding_table",
        )  # [B, C, D]
        tokens, mask = block_candidate_reduce(
            jnp.asarray(batch.candidate_post_hashes),
            jnp.asarray(recsys_embeddings.candidate_post_embeddings),
            jnp.asarray(recsys_embeddings.candidate_author_embeddings),
            self._surface_embeddings(batch.candidate_product_surface),
            hashes.num_item_hashes,
            hashes.num_author_hashes,
            1.0,
            candidate_post_age_embeddings=post_age,
        )
        return tokens.astype(self.fprop_dtype), mask

    def build_inputs(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> Tuple[jax.Array, jax.Array, int]:
        """Token sequence [B, T, D], padding mask [B, T] and the first candidate index."""
        context, context_mask = self.build_context_inputs(batch, recsys_embeddings)
        candidates, candidate_mask = self.build_candidate_inputs(batch, recsys_embeddings)
        tokens = jnp.concatenate([context, candidates], axis=1)  # [B, T, D]
        mask = jnp.concatenate([context_mask, candidate_mask], axis=1)  # [B, T]
        return tokens, mask, context.shape[1]

    def __call__(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> RecsysModelOutput:
        tokens, mask, candidate_start = self.build_inputs(batch, recsys_embeddings)
        positions = None
        if self.config.right_anchored_rope:
            positions = right_anchored_rope_positions(
                mask, history_seq_len=self.config.history_seq_len, num_user_prefix_tokens=1
            )
        hidden = self.model(
            tokens, mask, candidate_start_offset=candidate_start, positions=positions
        ).embeddings  # [B, T, D]
        hidden = layer_norm(hidden)
        candidates = hidden[:, candidate_start:, :].astype(jnp.float32)  # [B, C, D]

        init = hk.initializers.VarianceScaling(1.0, mode="fan_out")
        D = self.config.emb_size
        unembed = hk.get_parameter(
            "unembeddings", [D, self.config.num_actions], jnp.float32, init=init
        )
        continuous = hk.get_parameter(
            "continuous_unembeddings",
            [D, self.config.num_continuous_actions],
            jnp.float32,
            init=init,
        )
        logits = jnp.dot(candidates, unembed).astype(self.fprop_dtype)  # [B, C, A]
        continuous_preds = jax.nn.sigmoid(jnp.dot(candidates, continuous))  # [B, C, N]
        return RecsysModelOutput(
            logits=logits, continuous_preds=continuous_preds.astype(self.fprop_dtype)
        )
