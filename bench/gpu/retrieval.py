"""Retrieval on the device: a batch of users against corpora of the profile's sizes, top 100.

    python -m bench.gpu.retrieval --profile gpu --out bench/results/gpu/retrieval.json

The measurement is bench_engine.py's `bench_retrieval` (RetrievalEngine, mini config, a
random unit-norm corpus): queries/s of top-k alone and of the user tower plus top-k.
"""

from __future__ import annotations

import sys

from bench.gpu import profiles


def main(argv=None) -> int:
    args = profiles.step_parser("bench.gpu.retrieval", __doc__).parse_args(argv)
    profile = profiles.chosen_profile(args)
    profiles.require_device(profile)
    bench_engine = profiles.import_bench_engine()
    rows = bench_engine.bench_retrieval(
        profile.retrieval_sizes, profile.min_seconds, batch=profile.retrieval_batch
    )
    profiles.write_result(args.out, {"profile": profile.name, "retrieval": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
