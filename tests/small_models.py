"""Small model configs and random weights that the unit tests of the models share.

Float32 everywhere (the published bfloat16 would hide errors under its rounding), 19 actions
like the original, and weights drawn at random so that no layer is near the identity.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine import RetrievalEngine
from phoenix.grok import TransformerConfig
from phoenix.recsys_model import PhoenixModelConfig
from phoenix.recsys_retrieval_model import PhoenixRetrievalModelConfig


def small_transformer(
    emb: int, key: int, heads: int, kv_heads: int, layers: int, attn_multiplier: float
) -> TransformerConfig:
    """A transformer with a widening factor of 2."""
    sizes = dict(emb_size=emb, key_size=key, num_q_heads=heads, num_kv_heads=kv_heads)
    return TransformerConfig(
        **sizes, num_layers=layers, widening_factor=2.0, attn_output_multiplier=attn_multiplier
    )


def small_ranker(transformer: TransformerConfig, history: int, candidates: int, **extra):
    """A float32 ranker config over ``transformer`` with 19 actions."""
    return _small(PhoenixModelConfig, transformer, history, candidates, num_actions=19, **extra)


def small_retriever(transformer: TransformerConfig, history: int, candidates: int, **extra):
    """A float32 retrieval config over ``transformer``."""
    return _small(PhoenixRetrievalModelConfig, transformer, history, candidates, **extra)


def _small(kind, transformer, history, candidates, **extra):
    return kind(
        model=transformer,
        emb_size=transformer.emb_size,
        history_seq_len=history,
        candidate_seq_len=candidates,
        fprop_dtype=jnp.float32,
        **extra,
    )


def randomized(params, seed: int, scale: float):
    """``params`` redrawn: N(0, scale) for every weight, plus 1 on vectors (norm scales)."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda p: jnp.asarray(rng.normal(size=p.shape) * scale + (p.ndim == 1), jnp.float32),
        params,
    )


def random_params(transformed, seed: int, scale: float, *inputs):
    """``randomized`` weights of the shapes ``transformed.init`` gives for ``inputs``, read
    with ``jax.eval_shape``: an eager init would run every initializer and the whole model op
    by op first (10 s of a 2-core CPU for a small ranker)."""
    return randomized(jax.eval_shape(transformed.init, jax.random.PRNGKey(0), *inputs), seed, scale)


def engine_with_corpus(corpus: np.ndarray, tile=None, encoding="float", **options):
    """A float32 RetrievalEngine (no tower weights: top-k reads none) holding ``corpus``
    [M, D] in tiles of ``tile`` rows, encoded as ``encoding``; batch bucket 4."""
    dim = corpus.shape[1]
    config = small_retriever(small_transformer(dim, 8, 2, 2, 1, 0.125), 4, 2)
    engine = RetrievalEngine(
        config,
        {},
        compute_dtype=jnp.float32,
        batch_buckets=(4,),
        corpus_tile=tile,
        corpus_encoding=encoding,
        **options,
    )
    engine.set_corpus(corpus)
    return engine
