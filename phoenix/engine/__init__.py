"""Fast jitted inference for the Phoenix ranker and retriever.

- ``kernels``: the transformer passes (context cache, isolated candidates) as jittable functions.
- ``device_ranking``: ``DeviceRanker``, the ranker's cached-context passes: a request batch
  from raw ids to ranked order on the device (hashing, lookups, both passes, blend and sort;
  what the ranker serves), or the original model's hashed features to logits (``score``).
- ``prefix_cache``: ``PrefixCache``, a per-user prefix cache across requests, whatever the
  model family: exact keys, a byte budget with the least recently used out, a time to live.
- ``prefix_ranking``: the original ranker's part of it (``DeviceRanker(prefix_cache=...)``):
  the prefix computed for the misses only, the candidates against the users' cached keys and
  values.
- ``ranking_inputs``: what the ranking programs share: the batch fields they read, hashing on
  the device, the context inputs, the blend and sort.
- ``retrieval``: ``RetrievalEngine``, the two towers and exact top-k over a resident corpus.
- ``candidate_tower``: ``CandidateTower``, raw post and author ids to unit vectors in this
  process (the one candidate tower the server, artifacts, training and the corpus store use).
- ``score_inputs``: the score path's hashed features padded on the host.
- ``batching``: buckets, padding, per-platform defaults and example inputs.
- ``production_passes``: X's production ranker's (``phoenix.production``) two serving passes:
  the prefix pass, whose per-layer keys and values the candidate pass takes.
- ``production_ranking``: ``ProductionRanker``, those passes as jitted programs over weights
  on the device.
- ``production_prefix``: the production ranker's part of the prefix cache
  (``ProductionRanker(prefix_cache=...)``): keys over every field its prefix reads, the
  misses' prefixes in their own bucket, the candidates over the stacked entries.

May import the model layer and the checkpoint only: nothing that serves, stores or trains.
"""

from phoenix.engine.batching import (
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_TOP_K_BUCKETS,
    bucket_for,
    example_inputs,
)
from phoenix.engine.candidate_tower import CandidateTower
from phoenix.engine.device_ranking import DeviceRanker, RankingScores
from phoenix.engine.retrieval import RetrievalEngine

__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "DEFAULT_TOP_K_BUCKETS",
    "CandidateTower",
    "DeviceRanker",
    "RankingScores",
    "RetrievalEngine",
    "bucket_for",
    "example_inputs",
]
