"""Fast jitted inference for the Phoenix ranker and retriever.

- ``kernels``: the transformer passes (context cache, isolated candidates) as jittable functions.
- ``ranking``: ``RankingEngine``, any number of candidates per user against a cached context.
- ``device_ranking``: ``DeviceRanker``, one request batch from raw ids to ranked order on the
  device (hashing, lookups, both passes, blend and sort).
- ``retrieval``: ``RetrievalEngine``, the two towers and exact top-k over a resident corpus.
- ``candidate_tower``: ``CandidateTower``, raw post and author ids to unit vectors in this
  process (the one candidate tower the server, artifacts, training and the corpus store use).
- ``batching``: buckets, padding and per-platform defaults.
"""

from phoenix.engine.batching import (
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_TOP_K_BUCKETS,
    bucket_for,
)
from phoenix.engine.candidate_tower import CandidateTower
from phoenix.engine.ranking import RankingEngine, RankingScores, example_inputs
from phoenix.engine.retrieval import RetrievalEngine

__all__ = [
    "DEFAULT_BATCH_BUCKETS",
    "DEFAULT_TOP_K_BUCKETS",
    "CandidateTower",
    "RankingEngine",
    "RankingScores",
    "RetrievalEngine",
    "bucket_for",
    "example_inputs",
]
