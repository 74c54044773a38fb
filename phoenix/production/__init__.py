"""X's production Phoenix ranker ("xrex", August 2026 release), nano configuration: our own
forward in JAX, equal to X's serving code within bfloat16 rounding.

A second model family beside the original (``phoenix/grok.py``, ``recsys_model.py``): a wider
sequence (user token, user-features token, history, candidates) with right-anchored RoPE,
grouped-query attention with qk-norm, hashed ids plus semantic ids, context features, 64
action slots and 8 continuous heads routed by product surface. docs/production.md is the
guide.

- ``config``: ``ProductionConfig`` (typed, frozen, ``NANO`` by default) and its ``key=value``
  overrides (X's config names are accepted).
- ``hashing``: raw ids to rows of the hashed embedding table, and the gather of those rows.
- ``inputs``: the typed batch (``RankingInputs``) and the gathered rows (``HashedRows``).
- ``params``: parameter names (X's Haiku paths) and shapes, npz save/load, random init, and
  the device weights (``ProductionWeights``) the forward takes.
- ``features``: tokens from features (user, user features, history, candidates).
- ``transformer``: RMSNorm, GQA projections with qk-norm, RoPE, attention, FFN, the layer.
- ``model``: positions, the attention key sets, the heads and the plain full-sequence
  forward (``forward``), the reference the engine's prefix/candidate passes are checked with.
- ``reference``: reads reference folders written with X's code and compares outputs.
- ``examples``: seeded batches of valid inputs (tests, timings, warm-up).

Pure model code: imports jax, haiku, numpy and the standard library only (``reference`` adds
nothing else). The serving engine is ``phoenix/engine/production_ranking.py``.
"""

from phoenix.production.config import NANO, ProductionConfig, apply_overrides
from phoenix.production.inputs import HashedRows, PostSequence, RankingInputs, UserFeatures
from phoenix.production.model import RankingOutputs, forward
from phoenix.production.params import (
    ProductionWeights,
    device_weights,
    init_params,
    load_params,
    save_params,
)

__all__ = [
    "NANO",
    "HashedRows",
    "PostSequence",
    "ProductionConfig",
    "ProductionWeights",
    "RankingInputs",
    "RankingOutputs",
    "UserFeatures",
    "apply_overrides",
    "device_weights",
    "forward",
    "init_params",
    "load_params",
    "save_params",
]
