"""Measuring for the serving benchmark: the requests, the in-process services, perf_analyzer.

The same users go to the server (as perf_analyzer's --input-data) and to the services run in
this process; each side reports throughput and latency percentiles.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from harness import perf_analyzer
from harness.serving_repository import IN_PROCESS_BATCH, RECOMMEND_TOP_K, WORKLOADS
from phoenix.client.client import connect, ranker_inputs, recommend_inputs
from phoenix.client.inprocess import InProcessModels

UNSTABLE = "Failed to obtain stable measurement"
PERF_ANALYZER_LIMIT_S = 300  # one concurrency level; a stuck run is killed, not waited for


# ----------------------------------------------------------------------------------------
# Requests: the same users for the server and for the in-process services
# ----------------------------------------------------------------------------------------


def request_arrays(workload: str, user: dict) -> dict[str, np.ndarray]:
    """One user's request tensors (batch dimension 1) for a workload."""
    model, candidates = WORKLOADS[workload]
    if model == "recommend":
        return recommend_inputs(user, RECOMMEND_TOP_K)
    cut = {
        **user,
        "candidate_post_ids": user["candidate_post_ids"][:candidates],
        "candidate_author_ids": user["candidate_author_ids"][:candidates],
        "candidate_product_surface": user["candidate_product_surface"][:candidates],
    }
    return ranker_inputs(cut)


def write_input_data(path: Path, requests: Sequence[dict[str, np.ndarray]]) -> Path:
    """perf_analyzer's --input-data JSON: one step per request, shapes without the batch dim."""
    steps = [
        {
            name: {"content": array[0].ravel().tolist(), "shape": list(array.shape[1:])}
            for name, array in arrays.items()
        }
        for arrays in requests
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"data": steps}))
    return path


# ----------------------------------------------------------------------------------------
# In process: the services the served models wrap, on the same requests
# ----------------------------------------------------------------------------------------


def timed_rate(fn, requests_per_call: int, min_seconds: float) -> dict[str, float]:
    """Requests per second and latency percentiles of repeated calls (after one warm call)."""
    fn()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - started < min_seconds:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    seconds = np.asarray(times)
    return {
        "throughput": requests_per_call * len(seconds) / float(seconds.sum()),
        "p50_ms": 1e3 * float(np.percentile(seconds, 50)),
        "p99_ms": 1e3 * float(np.percentile(seconds, 99)),
        "calls": len(seconds),
    }


def measure_in_process(
    models: InProcessModels, workload: str, requests: list[dict], min_seconds: float
) -> dict:
    """One user per call and IN_PROCESS_BATCH users per call, cycling through ``requests``;
    the recommend ensemble runs its steps batched like the batcher would batch them."""
    model, _ = WORKLOADS[workload]
    cursor = [0]

    def take(n: int) -> list[dict]:
        start = cursor[0]
        cursor[0] = (start + n) % len(requests)
        return [requests[(start + i) % len(requests)] for i in range(n)]

    out = {}
    for batch in (1, IN_PROCESS_BATCH):
        out[f"batch_{batch}"] = timed_rate(
            lambda b=batch: models.run_many(model, take(b)), batch, min_seconds
        )
    return out


# ----------------------------------------------------------------------------------------
# Served: perf_analyzer against a running server
# ----------------------------------------------------------------------------------------


@dataclass
class Measurement:
    workload: str
    model: str
    protocol: str
    batching: str
    concurrency: int
    throughput: float = 0.0
    p50_ms: float = 0.0
    p95_ms: float = 0.0
    p99_ms: float = 0.0
    avg_batch: float = 0.0  # server executions per request: how well the batcher grouped
    unstable: bool = False
    error: Optional[str] = None
    extra: dict = field(default_factory=dict)


def parse_pa_csv(path: Path) -> dict[str, float]:
    header, values = path.read_text().strip().splitlines()[:2]
    return dict(zip(header.split(","), (float(v) for v in values.split(",")), strict=True))


def parse_avg_batch(output: str) -> float:
    """Server inference count / execution count from perf_analyzer's report."""
    inferences = re.search(r"Inference count: (\d+)", output)
    executions = re.search(r"Execution count: (\d+)", output)
    if not inferences or not executions or not int(executions.group(1)):
        return 0.0
    return int(inferences.group(1)) / int(executions.group(1))


def run_perf_analyzer(
    m: Measurement, url: str, data: Path, window: int, stability: float, trials: int
) -> tuple[int, str, Optional[dict]]:
    """One perf_analyzer run at m.concurrency: (exit code, its output, its CSV row or None).

    Windows are counted in requests, not time: the slowest settings take seconds per request
    at high concurrency, where a fixed time window often holds no completed request.
    """
    with tempfile.NamedTemporaryFile(suffix=".csv", delete=False) as handle:
        csv_path = Path(handle.name)
    command = [
        str(perf_analyzer.binary()), "-m", m.model, "-u", url, "-i", m.protocol,
        "--input-data", str(data), "--concurrency-range", f"{m.concurrency}:{m.concurrency}",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", str(max(window, 2 * m.concurrency)),
        "--stability-percentage", str(stability), "--max-trials", str(trials), "-f", str(csv_path),
    ]  # fmt: skip
    limit = PERF_ANALYZER_LIMIT_S
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=perf_analyzer.environment(), timeout=limit
        )
    except subprocess.TimeoutExpired:
        return 124, f"perf_analyzer ran past {limit:.0f} s", None
    output = done.stdout + done.stderr
    row = parse_pa_csv(csv_path) if done.returncode == 0 and csv_path.stat().st_size else None
    csv_path.unlink(missing_ok=True)
    return done.returncode, output, row


def measure_served(m: Measurement, url: str, data: Path, window: int, quick: bool) -> None:
    """Fill ``m`` from perf_analyzer; an unstable load is measured once more, accepted as is."""
    trials = 3 if quick else 5
    code, output, row = run_perf_analyzer(m, url, data, window, 50, trials)
    if row is None and UNSTABLE in output:
        m.unstable = True  # a shared machine: say so rather than loop
        code, output, row = run_perf_analyzer(m, url, data, window, 10_000, 3)
    if row is None:
        m.error = (output.strip().splitlines() or [f"exit code {code}"])[-1][:500]
        return
    m.throughput = row["Inferences/Second"]
    m.p50_ms, m.p95_ms = row["p50 latency"] / 1e3, row["p95 latency"] / 1e3
    m.p99_ms = row["p99 latency"] / 1e3
    m.avg_batch = parse_avg_batch(output)
    m.extra = {"server_queue_ms": row["Server Queue"] / 1e3,
               "server_infer_ms": row["Server Compute Infer"] / 1e3}  # fmt: skip


def failure_counts(http_url: str) -> dict[str, int]:
    """Failed inferences per model so far, from Triton's statistics."""
    stats = connect(http_url, "http").get_inference_statistics()
    return {s["name"]: int(s["inference_stats"]["fail"]["count"]) for s in stats["model_stats"]}
