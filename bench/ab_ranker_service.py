"""Users/s of `RankerService.handle` in this process, at several (users, candidates) points.

Written to run unchanged in an older checkout too, for side-by-side release comparisons:

    .venv/bin/python bench/ab_ranker_service.py artifacts/demo
    (cd OLD_CHECKOUT && PYTHONPATH=. .venv/bin/python \\
        /path/to/bench/ab_ranker_service.py /path/to/artifacts/demo)

Run the two alternately (old, new, old, new) so that load from other work hits both alike.
Prints one JSON line {"<users>x<candidates>": users per second}.
"""

import json
import sys
import time

import numpy as np

from phoenix.schema import contracts
from phoenix.stub.services.ranker import RankerService
from phoenix.stub.services.resources import PhoenixResources

POINTS = [(1, 64), (8, 64), (1, 512), (8, 512), (1, 1024)]


def random_request(config, rng, candidates: int) -> dict:
    """One user with a full history and ``candidates`` random candidates."""
    S, A = config.history_seq_len, config.num_actions
    ids = lambda *shape: rng.integers(1, 2**62, shape)  # noqa: E731
    return {
        "user_id": ids(1, 1),
        "history_post_ids": ids(1, S),
        "history_author_ids": ids(1, S),
        "history_actions": (rng.random((1, S, A)) > 0.7).astype(np.float32),
        "history_product_surface": rng.integers(0, 4, (1, S)).astype(np.int32),
        "candidate_post_ids": ids(1, candidates),
        "candidate_author_ids": ids(1, candidates),
    }


def users_per_second(service, requests, min_seconds: float = 3.0) -> float:
    service.handle(requests)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        service.handle(requests)
        times.append(time.perf_counter() - t0)
    return len(requests) / float(np.median(times))


def main(artifact_dir: str) -> None:
    resources = PhoenixResources(artifact_dir)
    service = RankerService(
        resources,
        contracts.RANKER_SCORE_WEIGHTS,
        candidate_buckets=contracts.RANKER_CANDIDATE_BUCKETS,
        batch_buckets=(1, 2, 4, 8),
        prefix_cache_mib=0,  # the same requests again and again: with the cache, all hits
    )
    service.warm_up()
    rng = np.random.default_rng(0)
    result = {}
    for users, candidates in POINTS:
        requests = [random_request(resources.config, rng, candidates) for _ in range(users)]
        result[f"{users}x{candidates}"] = users_per_second(service, requests)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
