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


def production_flops(config, candidates: int) -> dict[str, float]:
    """Matmul FLOPs (2 per multiply-add) of one request's forward through X's production
    ranker (``phoenix.production.ProductionConfig``): the prefix (user, user features, the
    history: every layer over P = 2 + H tokens, each query against all P keys, as the serving
    kernel's blocks compute whatever the history's length) and ``candidates`` candidates
    (each against the P prefix keys and its own), inputs and heads included. Elementwise
    work (norms, RoPE, softmax) is left out."""
    c, h = config, config.hashes
    D, W, A = c.emb_size, c.emb_table_width, c.output_vocab_size
    heads_d, kv_d = c.num_q_heads * c.key_size, c.num_kv_heads * c.key_size
    dense = 2 * D * (heads_d + 2 * kv_d) + 2 * heads_d * D + 2 * 2 * D * c.ffn_size  # a token
    P = c.prefix_len
    sid = 2 * c.sid_embed_dim * D if c.sid_embed_dim != D else 0
    counts = 2 * 6 * c.engagement_count_mlp_hidden_dim + 2 * c.engagement_count_mlp_hidden_dim * D
    post = 2 * W * D * (h.num_item_hashes + h.num_author_hashes) + sid + counts
    user = 2 * W * D * (h.num_user_hashes + h.num_ip_hashes)
    user += 2 * (4 * c.location_num_frequencies + c.num_installed_apps) * D
    history_inputs = c.history_seq_len * (post + 2 * A * D)
    prefix = c.num_layers * (P * dense + 2 * 2 * heads_d * P * P) + history_inputs + user
    per_candidate = c.num_layers * (dense + 2 * 2 * heads_d * (P + 1)) + post
    per_candidate += 2 * D * (A + c.num_continuous_actions)
    return {
        "prefix": float(prefix),
        "candidates": float(candidates * per_candidate),
        "total": float(prefix + candidates * per_candidate),
    }
