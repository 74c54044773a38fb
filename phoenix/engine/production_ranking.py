"""The production ranker on the device: ``ProductionRanker`` runs the two passes of
``production_passes`` as jitted programs, the prefix once per request, then the candidates
against it; with a per-user cache (``production_prefix``) across requests.

Shapes: L layers, B requests, P prefix tokens, C candidates, K key/value heads, d key size.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np

from phoenix.engine.batching import DEFAULT_BATCH_BUCKETS
from phoenix.engine.prefix_cache import PrefixCache as PrefixStore
from phoenix.engine.production_passes import PrefixCache, prefix, score_candidates
from phoenix.production.config import ProductionConfig
from phoenix.production.hashing import check_rows_in_table, gather_rows
from phoenix.production.inputs import HashedRows, RankingInputs
from phoenix.production.model import (
    RankingOutputs,
    compiler_options,
)
from phoenix.production.params import (
    device_table,
    device_weights,
)

if TYPE_CHECKING:  # the cache wraps this ranker
    from phoenix.engine.production_prefix import ProductionPrefixRanker


class Programs(NamedTuple):
    """The jitted passes of one config: the weights are arguments, so every ranker of that
    config shares them (and their compiled programs, one per input shape)."""

    prefix: Callable
    score_candidates: Callable
    gather: Callable


@functools.lru_cache(maxsize=8)
def programs(config: ProductionConfig) -> Programs:
    """The jitted passes for ``config``, compiled to round as X's program does."""
    options = compiler_options()
    jit = lambda f: jax.jit(functools.partial(f, config=config), compiler_options=options)  # noqa: E731
    return Programs(jit(prefix), jit(score_candidates), jax.jit(gather_rows))


class ProductionRanker:
    """The serving forward over weights resident on the device.

    ``rank(inputs, rows)`` from gathered rows runs the two passes, ``prefix`` then
    ``score_candidates``, as two programs with the ``PrefixCache`` between them;
    ``rank_ids(inputs)`` gathers the rows from the parameters' ``emb_table`` first. With a
    ``prefix_cache`` (a ``prefix_cache.PrefixCache`` store), ``rank_ids`` keeps each user's
    rows of the ``PrefixCache`` in it across calls and computes only the misses' prefixes,
    padded to ``miss_buckets`` (``production_prefix``); ``rank`` never uses it (the rows it
    is given come from the caller, which no key covers).
    """

    def __init__(
        self,
        config: ProductionConfig,
        params: Mapping[str, np.ndarray],
        *,
        prefix_cache: Optional[PrefixStore] = None,
        miss_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
    ):
        self.config = config
        self.weights = device_weights(params, config)
        self.table = device_table(params, config) if "emb_table" in params else None
        self.programs = programs(config)
        self.prefix_cache = prefix_cache
        self.cached: Optional[ProductionPrefixRanker] = None
        if prefix_cache is not None:
            from phoenix.engine.production_prefix import ProductionPrefixRanker

            self.cached = ProductionPrefixRanker(self, prefix_cache, miss_buckets)

    def rank(self, inputs: RankingInputs, rows: HashedRows) -> RankingOutputs:
        return self.score_candidates(self.prefix(inputs, rows), inputs, rows)

    def rank_ids(self, inputs: RankingInputs, users: Optional[int] = None) -> RankingOutputs:
        """Rank with the rows of the parameters' table; a hash outside it is refused, named.
        With a prefix cache, the first ``users`` requests (None: all) are users whose
        prefixes it keeps, the rest padding."""
        if self.table is None:
            raise ValueError("the parameters hold no 'emb_table': call rank with gathered rows")
        if self.cached is not None:
            return self.cached.rank_ids(inputs, users)
        check_rows_in_table(inputs, self.table.shape[0])
        return self.rank(inputs, self.programs.gather(self.table, inputs))

    def prefix(self, inputs: RankingInputs, rows: HashedRows) -> PrefixCache:
        return self.programs.prefix(self.weights, inputs, rows)

    def score_candidates(
        self, cache: PrefixCache, inputs: RankingInputs, rows: HashedRows
    ) -> RankingOutputs:
        return self.programs.score_candidates(self.weights, cache, inputs, rows)
