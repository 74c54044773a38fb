"""Approximate FLOP counts of the engine's passes, for the benchmarks' GFLOP/s figures."""

from __future__ import annotations

from phoenix.grok import ffn_size
from phoenix.recsys_model import PhoenixModelConfig


def _dense_flops_per_token(config: PhoenixModelConfig) -> float:
    """Q/K/V/O projections and the gated FFN, per token and layer."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    projections = 2 * D * d * (tc.num_q_heads * 2 + tc.num_kv_heads * 2)
    return projections + 2 * 3 * D * ffn_size(D, tc.widening_factor)


def flops_per_candidate(config: PhoenixModelConfig) -> float:
    """Approximate FLOPs the engine spends per scored candidate (transformer + heads)."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    T = 1 + config.history_seq_len
    attention = 2 * 2 * tc.num_q_heads * d * (T + 1)
    assert config.hash_config is not None  # set by the config's __post_init__
    hashes = config.hash_config.num_item_hashes + config.hash_config.num_author_hashes
    inputs = 2 * D * D * hashes  # surface and post age are pre-projected lookups
    heads = 2 * D * (config.num_actions + config.num_continuous_actions)
    return tc.num_layers * (_dense_flops_per_token(config) + attention) + inputs + heads


def flops_per_context(config: PhoenixModelConfig) -> float:
    """Approximate FLOPs of one user's context pass."""
    tc = config.model
    D, d = config.emb_size, tc.key_size
    T = 1 + config.history_seq_len
    attention = 2 * 2 * tc.num_q_heads * d * T * T
    inputs = T * 2 * D * D * 7
    return tc.num_layers * (T * _dense_flops_per_token(config) + attention) + inputs
