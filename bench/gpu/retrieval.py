"""Retrieval on the device: a batch of users against corpora of the profile's sizes, top 100.

    python -m bench.gpu.retrieval --profile gpu --out bench/results/gpu/retrieval.json

The measurement is bench_engine.py's `bench_retrieval` (RetrievalEngine, mini config, a
random unit-norm corpus): queries/s of top-k alone and of the user tower plus top-k. The engine
compiles the batch sizes the served retriever does in the profile's deployment (the GPU
profile's 1, 8, 64): with the engine's default ones (up to 16) a batch of 64 users became four
device calls, each reading the whole corpus (the `engine` column of bench/results/gpu/topk.json).
"""

from __future__ import annotations

import sys

from harness.gpu_bench import profiles


def served_batch_buckets(device: str) -> tuple[int, ...]:
    """The batch sizes the retriever compiles in the deployment profile of ``device``."""
    from phoenix.ops.profiles import profile

    return tuple(profile(device).models["retriever"].parameter_values("retriever")["batch_buckets"])


def main(argv=None) -> int:
    args = profiles.step_parser("bench.gpu.retrieval", __doc__).parse_args(argv)
    profile = profiles.chosen_profile(args)
    profiles.require_device(profile)
    from bench import bench_engine  # here: JAX is imported once the platform is chosen

    buckets = served_batch_buckets(profile.device)
    rows = bench_engine.bench_retrieval(
        profile.retrieval_sizes,
        profile.min_seconds,
        batch=profile.retrieval_batch,
        batch_buckets=buckets,
    )
    profiles.write_result(
        args.out, {"profile": profile.name, "batch_buckets": list(buckets), "retrieval": rows}
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
