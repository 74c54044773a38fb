"""The host's share of a served ranker request: `RankerService.handle` with the device call's
answer cached, so what is timed is the checks, the padded batch and the split (what bounds the
served rate on a GPU, docs/performance.md "On a GPU"), at 1, 8 and 64 requests a batch.

    .venv/bin/python -m bench.bench_service_host [--artifacts DIR] [--out FILE]

Written to run unchanged in an older checkout too, for side-by-side comparisons (run the two
alternately, old, new, old, new, so that load from other work hits both alike):

    (cd OLD_CHECKOUT && PYTHONPATH=. /path/to/.venv/bin/python /path/to/bench/bench_service_host.py)

Prints a table and writes JSON: microseconds of host work a request, best of the rounds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from phoenix.client.client import ranker_inputs
from phoenix.schema.contracts import RANKER
from phoenix.stub.services.catalog import build_service
from phoenix.stub.services.common import ServiceSettings

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 8, 64)
CANDIDATES = 64
HISTORY = 32


def ranker_service(artifacts: Path):
    """The ranker's service with its contract's defaults, compiled for BATCHES."""
    texts = RANKER.parameter_texts({"batch_buckets": BATCHES})
    return build_service(ServiceSettings.parsed(RANKER.name, artifacts, max(BATCHES), texts))


def with_cached_device_answers(service) -> None:
    """The device call answers each batch shape once, then from memory: host work alone."""
    real, answers = service.ranker.rank, {}

    def rank(batch, rows=None):
        shape = batch.candidate_post_ids.shape
        if shape not in answers:
            answers[shape] = real(batch, rows)
        return answers[shape]

    service.ranker.rank = rank


def host_us_per_request(service, requests, rounds: int, min_seconds: float = 0.3) -> float:
    service.handle(requests)
    best = float("inf")
    for _ in range(rounds):
        calls, started = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - started) < min_seconds or calls < 3:
            service.handle(requests)
            calls += 1
        best = min(best, elapsed / calls)
    return best / len(requests) * 1e6


def shown_artifacts(path: Path) -> str:
    """The artifacts as the result names them: relative to the folder it ran in, or their
    folder's name (this module imports nothing newer than older checkouts have)."""
    resolved = path.resolve()
    cwd = Path.cwd().resolve()
    return str(resolved.relative_to(cwd)) if resolved.is_relative_to(cwd) else resolved.name


def main(argv=None) -> int:
    from clients.workload import random_users

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, default=REPO_ROOT / "artifacts/trained-demo")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, help="JSON file (default: print only)")
    args = parser.parse_args(argv)
    service = ranker_service(args.artifacts)
    with_cached_device_answers(service)
    users = random_users(
        args.artifacts, max(BATCHES), seed=0, history_len=HISTORY, num_candidates=CANDIDATES,
        top_k=10,
    )  # fmt: skip
    arrays = [ranker_inputs(u) for u in users]
    rows = {}
    print(f"host work a ranker request ({CANDIDATES} candidates, {HISTORY} history items), us")
    for batch in BATCHES:
        rows[str(batch)] = host_us_per_request(service, arrays[:batch], args.rounds)
        print(f"  {batch:>3} requests a batch: {rows[str(batch)]:8.1f}", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        result = {"artifacts": shown_artifacts(args.artifacts), "us_per_request_by_batch": rows}
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
