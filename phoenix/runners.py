"""Original-style inference runners (API-compatible with the original ``runners`` module).

These wrap the Haiku models in the original calling convention: build a config, wrap it in
``ModelRunner`` / ``RetrievalModelRunner``, wrap that in an inference runner, call
``initialize()`` and then ``rank`` / ``encode_user`` / ``retrieve``. They run the plain
model un-jitted, exactly as the original does; ``phoenix.engine`` is the fast path.

Deliberate difference: the original ``initialize()`` forces ``fprop_dtype = bfloat16``; here
the config's ``fprop_dtype`` is kept (its default is bfloat16, so default behaviour matches)
so that float32 runs are possible on CPUs, where bfloat16 is emulated and slow.

Shape glossary
  B  batch (users)   S  history length   C  candidates   D  emb_size   A  num_actions
  N  corpus size     K  top_k
"""

from __future__ import annotations

import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, List, NamedTuple, Optional, Tuple

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from phoenix.grok import TrainingState
from phoenix.recsys_model import (
    PhoenixModelConfig,
    RecsysBatch,
    RecsysEmbeddings,
    RecsysModelOutput,
)
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig
from phoenix.recsys_retrieval_model import RetrievalOutput as ModelRetrievalOutput

rank_logger = logging.getLogger("rank")

ACTIONS: List[str] = [
    "favorite_score",
    "reply_score",
    "repost_score",
    "photo_expand_score",
    "click_score",
    "profile_click_score",
    "vqv_score",
    "share_score",
    "share_via_dm_score",
    "share_via_copy_link_score",
    "dwell_score",
    "quote_score",
    "quoted_click_score",
    "follow_author_score",
    "not_interested_score",
    "block_author_score",
    "mute_author_score",
    "report_score",
    "dwell_time",
]

CONTINUOUS_ACTIONS: List[str] = [
    "reserved",
    "dwell_time",
    "video_watch_time",
    "scroll_depth",
    "reserved_3",
    "reserved_4",
    "reserved_5",
    "reserved_6",
]

NEGATIVE_FEEDBACK_INDICES: List[int] = [14, 15, 16, 17]


def load_model_params(checkpoint_path: str) -> Mapping[str, Mapping[str, jax.Array]]:
    """Read a ``model_params.npz`` ('module/param' keys) into Haiku's nested mapping."""
    params: dict = {}
    with np.load(checkpoint_path, allow_pickle=False) as data:
        for key in data.files:
            module, _, name = key.rpartition("/")
            params.setdefault(module, {})[name] = jnp.asarray(data[key])
    return params


def load_embedding_table(path: str) -> dict:
    """Read ``embedding_tables.npz`` into a dict of numpy arrays."""
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def create_dummy_batch_from_config(
    hash_config: Any,
    history_len: int,
    num_candidates: int,
    num_actions: int,
    batch_size: int = 1,
) -> RecsysBatch:
    """All-padding batch of the given shapes (for initialisation)."""
    zeros = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
    return RecsysBatch(
        user_hashes=zeros(batch_size, hash_config.num_user_hashes),
        history_post_hashes=zeros(batch_size, history_len, hash_config.num_item_hashes),
        history_author_hashes=zeros(batch_size, history_len, hash_config.num_author_hashes),
        history_actions=np.zeros((batch_size, history_len, num_actions), np.float32),
        history_product_surface=zeros(batch_size, history_len),
        candidate_post_hashes=zeros(batch_size, num_candidates, hash_config.num_item_hashes),
        candidate_author_hashes=zeros(batch_size, num_candidates, hash_config.num_author_hashes),
        candidate_product_surface=zeros(batch_size, num_candidates),
    )


def create_dummy_embeddings_from_config(
    hash_config: Any,
    emb_size: int,
    history_len: int,
    num_candidates: int,
    batch_size: int = 1,
) -> RecsysEmbeddings:
    """All-zero embeddings of the given shapes (for initialisation)."""
    zeros = lambda *shape: np.zeros(shape + (emb_size,), np.float32)  # noqa: E731
    return RecsysEmbeddings(
        user_embeddings=zeros(batch_size, hash_config.num_user_hashes),
        history_post_embeddings=zeros(batch_size, history_len, hash_config.num_item_hashes),
        candidate_post_embeddings=zeros(batch_size, num_candidates, hash_config.num_item_hashes),
        history_author_embeddings=zeros(batch_size, history_len, hash_config.num_author_hashes),
        candidate_author_embeddings=zeros(
            batch_size, num_candidates, hash_config.num_author_hashes
        ),
    )


@dataclass
class BaseModelRunner(ABC):
    """Shared set-up of the model runners."""

    bs_per_device: float = 2.0
    rng_seed: int = 42

    @property
    @abstractmethod
    def model(self) -> Any:
        """The model config."""

    @abstractmethod
    def make_forward_fn(self):
        """The ``hk.transform``-ed forward function."""

    def initialize(self):
        self.model.initialize()
        self.batch_size = max(1, int(self.bs_per_device * len(jax.local_devices())))
        rank_logger.info("Initializing %s", type(self.model).__name__)
        self.forward = self.make_forward_fn()


@dataclass
class BaseInferenceRunner(ABC):
    """Shared dummy-input helpers of the inference runners."""

    name: str

    @property
    @abstractmethod
    def runner(self) -> BaseModelRunner:
        """The wrapped model runner."""

    def _num_actions(self) -> int:
        return getattr(self.runner.model, "num_actions", len(ACTIONS))

    def create_dummy_batch(self, batch_size: int = 1) -> RecsysBatch:
        config = self.runner.model
        return create_dummy_batch_from_config(
            config.hash_config,
            config.history_seq_len,
            config.candidate_seq_len,
            self._num_actions(),
            batch_size,
        )

    def create_dummy_embeddings(self, batch_size: int = 1) -> RecsysEmbeddings:
        config = self.runner.model
        return create_dummy_embeddings_from_config(
            config.hash_config,
            config.emb_size,
            config.history_seq_len,
            config.candidate_seq_len,
            batch_size,
        )

    @abstractmethod
    def initialize(self):
        """Build parameters and the inference functions."""


class RankingOutput(NamedTuple):
    """Sigmoid probabilities [B, C, A], ranking by favorite [B, C], one field per action."""

    scores: jax.Array
    ranked_indices: jax.Array
    p_favorite_score: jax.Array
    p_reply_score: jax.Array
    p_repost_score: jax.Array
    p_photo_expand_score: jax.Array
    p_click_score: jax.Array
    p_profile_click_score: jax.Array
    p_vqv_score: jax.Array
    p_share_score: jax.Array
    p_share_via_dm_score: jax.Array
    p_share_via_copy_link_score: jax.Array
    p_dwell_score: jax.Array
    p_quote_score: jax.Array
    p_quoted_click_score: jax.Array
    p_follow_author_score: jax.Array
    p_not_interested_score: jax.Array
    p_block_author_score: jax.Array
    p_mute_author_score: jax.Array
    p_report_score: jax.Array
    p_dwell_time: jax.Array
    continuous_preds: Optional[jax.Array] = None


def ranking_output_from_logits(logits: jax.Array, continuous_preds=None) -> RankingOutput:
    """Sigmoid the logits [B, C, A] and rank each row by P(favorite) (column 0)."""
    probs = jax.nn.sigmoid(logits)  # [B, C, A]
    per_action = {f"p_{name}": probs[:, :, i] for i, name in enumerate(ACTIONS)}
    return RankingOutput(
        scores=probs,
        ranked_indices=jnp.argsort(-probs[:, :, 0], axis=-1),  # [B, C]
        continuous_preds=continuous_preds,
        **per_action,
    )


@dataclass
class ModelRunner(BaseModelRunner):
    """Holds the ranking model config and its transformed forward function."""

    _model: Optional[PhoenixModelConfig] = None

    def __init__(self, model: PhoenixModelConfig, bs_per_device: float = 2.0, rng_seed: int = 42):
        self._model = model
        self.bs_per_device = bs_per_device
        self.rng_seed = rng_seed

    @property
    def model(self) -> PhoenixModelConfig:
        assert self._model is not None  # set by __init__
        return self._model

    def make_forward_fn(self):
        return hk.transform(lambda batch, emb: self.model.make()(batch, emb))

    def init(
        self, rng: jax.Array, data: RecsysBatch, embeddings: RecsysEmbeddings
    ) -> TrainingState:
        _, init_rng = jax.random.split(rng)
        return TrainingState(params=self.forward.init(init_rng, data, embeddings))

    def load_or_init(
        self,
        init_data: RecsysBatch,
        init_embeddings: RecsysEmbeddings,
        checkpoint_path: Optional[str] = None,
    ):
        if checkpoint_path is not None:
            return TrainingState(params=load_model_params(checkpoint_path))
        return self.init(jax.random.PRNGKey(self.rng_seed), init_data, init_embeddings)


@dataclass
class RecsysInferenceRunner(BaseInferenceRunner):
    """Ranks candidates with the plain (un-jitted) ranking model."""

    _runner: Optional[ModelRunner] = None

    def __init__(self, runner: ModelRunner, name: str):
        self.name = name
        self._runner = runner

    @property
    def runner(self) -> ModelRunner:
        assert self._runner is not None  # set by __init__
        return self._runner

    def initialize(self):
        runner = self.runner
        runner.initialize()
        state = runner.load_or_init(self.create_dummy_batch(1), self.create_dummy_embeddings(1))
        self.params = state.params

        @functools.lru_cache
        def model():
            return runner.model.make()

        def rank_candidates(batch, recsys_embeddings) -> RankingOutput:
            output: RecsysModelOutput = model()(batch, recsys_embeddings)
            return ranking_output_from_logits(output.logits, output.continuous_preds)

        self.rank_candidates = hk.without_apply_rng(hk.transform(rank_candidates)).apply

    def rank(self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings) -> RankingOutput:
        return self.rank_candidates(self.params, batch, recsys_embeddings)


def create_example_batch(
    batch_size: int,
    emb_size: int,
    history_len: int,
    num_candidates: int,
    num_actions: int,
    num_user_hashes: int = 2,
    num_item_hashes: int = 2,
    num_author_hashes: int = 2,
    product_surface_vocab_size: int = 16,
    num_user_embeddings: int = 1_000_000,
    num_post_embeddings: int = 1_000_000,
    num_author_embeddings: int = 1_000_000,
    include_continuous_actions: bool = False,
    include_timestamps: bool = False,
    num_continuous_actions: int = 8,
) -> Tuple[RecsysBatch, RecsysEmbeddings]:
    """Random valid batch: history lengths in [history_len/2, history_len], hash 0 pads."""
    rng = np.random.default_rng(42)

    def hashes(vocab: int, *shape: int) -> np.ndarray:
        return rng.integers(1, vocab, size=shape).astype(np.int32)

    def pad_history(h: np.ndarray) -> np.ndarray:
        for row in range(batch_size):
            h[row, rng.integers(history_len // 2, history_len + 1) :, :] = 0
        return h

    user_hashes = hashes(num_user_embeddings, batch_size, num_user_hashes)
    history_post = pad_history(
        hashes(num_post_embeddings, batch_size, history_len, num_item_hashes)
    )
    history_author = pad_history(
        hashes(num_author_embeddings, batch_size, history_len, num_author_hashes)
    )
    history_actions = (rng.random((batch_size, history_len, num_actions)) > 0.7).astype(np.float32)
    history_surface = rng.integers(0, product_surface_vocab_size, (batch_size, history_len))
    candidate_post = hashes(num_post_embeddings, batch_size, num_candidates, num_item_hashes)
    candidate_author = hashes(num_author_embeddings, batch_size, num_candidates, num_author_hashes)
    candidate_surface = rng.integers(0, product_surface_vocab_size, (batch_size, num_candidates))

    continuous = None
    if include_continuous_actions:
        continuous = np.zeros((batch_size, history_len, num_continuous_actions), np.float32)
        continuous[:, :, 1] = rng.exponential(10.0, (batch_size, history_len))
    impr_ts = creation_ts = None
    if include_timestamps:
        impr_ts = np.full((batch_size, num_candidates), 1_700_000_000, np.int32)
        age = rng.integers(60, 72 * 3600, (batch_size, num_candidates))
        creation_ts = (impr_ts - age).astype(np.int32)

    batch = RecsysBatch(
        user_hashes=user_hashes,
        history_post_hashes=history_post,
        history_author_hashes=history_author,
        history_actions=history_actions,
        history_product_surface=history_surface.astype(np.int32),
        candidate_post_hashes=candidate_post,
        candidate_author_hashes=candidate_author,
        candidate_product_surface=candidate_surface.astype(np.int32),
        history_continuous_actions=continuous,
        candidate_impr_ts=impr_ts,
        candidate_post_creation_ts=creation_ts,
    )

    def normal(*shape: int) -> np.ndarray:
        return rng.normal(size=shape + (emb_size,)).astype(np.float32)

    embeddings = RecsysEmbeddings(
        user_embeddings=normal(batch_size, num_user_hashes),
        history_post_embeddings=normal(batch_size, history_len, num_item_hashes),
        candidate_post_embeddings=normal(batch_size, num_candidates, num_item_hashes),
        history_author_embeddings=normal(batch_size, history_len, num_author_hashes),
        candidate_author_embeddings=normal(batch_size, num_candidates, num_author_hashes),
    )
    return batch, embeddings


class RetrievalOutput(NamedTuple):
    user_representation: jax.Array  # [B, D]
    top_k_indices: jax.Array  # [B, K]
    top_k_scores: jax.Array  # [B, K]


def _retrieval_forward(config: PhoenixRetrievalModelConfig):
    """Forward that creates every retrieval parameter (both towers and the temperature)."""

    def forward(batch, recsys_embeddings, corpus_embeddings, top_k) -> ModelRetrievalOutput:
        model = config.make()
        out = model(batch, recsys_embeddings, corpus_embeddings, top_k)
        model.build_candidate_representation(batch, recsys_embeddings)
        # Training-time softmax temperature: stored in published checkpoints, unused here.
        hk.get_parameter("log_temperature", [], jnp.float32, init=jnp.zeros)
        return out

    return forward


@dataclass
class RetrievalModelRunner(BaseModelRunner):
    """Holds the retrieval model config and its transformed forward function."""

    _model: Optional[PhoenixRetrievalModelConfig] = None

    def __init__(
        self, model: PhoenixRetrievalModelConfig, bs_per_device: float = 2.0, rng_seed: int = 42
    ):
        self._model = model
        self.bs_per_device = bs_per_device
        self.rng_seed = rng_seed

    @property
    def model(self) -> PhoenixRetrievalModelConfig:
        assert self._model is not None  # set by __init__
        return self._model

    def make_forward_fn(self):
        return hk.transform(_retrieval_forward(self.model))

    def init(
        self,
        rng: jax.Array,
        data: RecsysBatch,
        embeddings: RecsysEmbeddings,
        corpus_embeddings: jax.Array,
        top_k: int,
    ) -> TrainingState:
        _, init_rng = jax.random.split(rng)
        params = self.forward.init(init_rng, data, embeddings, corpus_embeddings, top_k)
        return TrainingState(params=params)

    def load_or_init(
        self,
        init_data: RecsysBatch,
        init_embeddings: RecsysEmbeddings,
        corpus_embeddings: jax.Array,
        top_k: int,
    ):
        rng = jax.random.PRNGKey(self.rng_seed)
        return self.init(rng, init_data, init_embeddings, corpus_embeddings, top_k)


@dataclass
class RecsysRetrievalInferenceRunner(BaseInferenceRunner):
    """Encodes users and candidates and retrieves top-k from a corpus (plain model)."""

    _runner: Optional[RetrievalModelRunner] = None
    corpus_embeddings: Optional[jax.Array] = None
    corpus_post_ids: Optional[jax.Array] = None

    def __init__(self, runner: RetrievalModelRunner, name: str):
        self.name = name
        self._runner = runner
        self.corpus_embeddings = None
        self.corpus_post_ids = None

    @property
    def runner(self) -> RetrievalModelRunner:
        assert self._runner is not None  # set by __init__
        return self._runner

    def initialize(self):
        runner = self.runner
        runner.initialize()
        dummy_corpus = jnp.zeros((10, runner.model.emb_size), jnp.float32)
        state = runner.load_or_init(
            self.create_dummy_batch(1), self.create_dummy_embeddings(1), dummy_corpus, 5
        )
        self.params = state.params

        @functools.lru_cache
        def model():
            return runner.model.make()

        def encode_user(batch, recsys_embeddings):
            return model().build_user_representation(batch, recsys_embeddings)[0]

        def encode_candidates(batch, recsys_embeddings):
            return model().build_candidate_representation(batch, recsys_embeddings)[0]

        def retrieve(batch, recsys_embeddings, corpus_embeddings, top_k):
            return model()(batch, recsys_embeddings, corpus_embeddings, top_k)

        apply = lambda fn: hk.without_apply_rng(hk.transform(fn)).apply  # noqa: E731
        self.encode_user_fn = apply(encode_user)
        self.encode_candidates_fn = apply(encode_candidates)
        self.retrieve_fn = apply(retrieve)

    def encode_user(self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings) -> jax.Array:
        """Unit user vectors [B, D]."""
        return self.encode_user_fn(self.params, batch, recsys_embeddings)

    def encode_candidates(
        self, batch: RecsysBatch, recsys_embeddings: RecsysEmbeddings
    ) -> jax.Array:
        """Unit candidate vectors [B, C, D]."""
        return self.encode_candidates_fn(self.params, batch, recsys_embeddings)

    def set_corpus(self, corpus_embeddings: jax.Array, corpus_post_ids: jax.Array):
        self.corpus_embeddings = corpus_embeddings
        self.corpus_post_ids = corpus_post_ids

    def retrieve(
        self,
        batch: RecsysBatch,
        recsys_embeddings: RecsysEmbeddings,
        top_k: int = 100,
        corpus_embeddings: Optional[jax.Array] = None,
    ) -> RetrievalOutput:
        """Top-k corpus entries per user, best first."""
        if corpus_embeddings is None:
            corpus_embeddings = self.corpus_embeddings
        if corpus_embeddings is None:
            raise ValueError("no corpus: call set_corpus() or pass corpus_embeddings")
        out = self.retrieve_fn(self.params, batch, recsys_embeddings, corpus_embeddings, top_k)
        return RetrievalOutput(*out)


def create_example_corpus(
    corpus_size: int, emb_size: int, seed: int = 123
) -> Tuple[jax.Array, jax.Array]:
    """Random unit vectors [N, D] and post ids 0..N-1 (int64)."""
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(corpus_size, emb_size)).astype(np.float32)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)
    return jnp.asarray(vectors), jnp.asarray(np.arange(corpus_size, dtype=np.int64))
