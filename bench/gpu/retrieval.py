"""Retrieval on the device: a batch of users against corpora of the profile's sizes, top 100.

    python -m bench.gpu.retrieval --profile gpu --out bench/results/gpu/retrieval.json

The measurement is bench_engine.py's `bench_retrieval` (RetrievalEngine, mini config, a
random unit-norm corpus): queries/s of top-k alone and of the user tower plus top-k.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.gpu import profiles


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu.retrieval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--profile", choices=sorted(profiles.PROFILES), default="gpu")
    parser.add_argument("--out", type=Path, required=True, help="JSON written here")
    args = parser.parse_args(argv)
    profile = profiles.PROFILES[args.profile]
    profiles.select_platform(profile)
    profiles.require_device(profile)
    bench_engine = profiles.import_bench_engine()
    rows = bench_engine.bench_retrieval(
        profile.retrieval_sizes, profile.min_seconds, batch=profile.retrieval_batch
    )
    result = {"machine": profiles.machine_info(), "profile": profile.name, "retrieval": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
