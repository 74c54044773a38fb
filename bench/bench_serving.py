"""Serving benchmark: Triton (perf_analyzer) against the in-process services, same requests.

Workloads: `ranker` with 64 and with 512 candidates per user, and the `recommend` ensemble
(top_k 100); users have full histories, ids drawn from the artifact corpus. For each workload
perf_analyzer measures throughput and p50/p95/p99 latency at each concurrency, over HTTP and
gRPC, with dynamic batching on (model_repository as it is) and off (a derived copy without
dynamic_batching). Both servers run at once and the settings are measured back to back at each
point, so drifting load from other work on the machine distorts the ratios less. In the same
run the services that the models wrap are timed in this process on the same requests, one user
per call and 8 users per call (what the batcher can form).

    python bench/bench_serving.py            # full run: writes bench/results/serving.{json,png}
    python bench/bench_serving.py --quick    # sanity run: bench/results/serving-quick.*

Writes a JSON of every figure, a plot (throughput and p99 latency against concurrency, one
line per setting) and, with --docs, the ratio table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a file: make `phoenix` and `clients` importable
    sys.path.insert(0, str(REPO_ROOT))

from clients._common import CorpusIds, random_sequence, with_action_width  # noqa: E402
from phoenix.checkpoint import load_config  # noqa: E402
from phoenix.serving.client import (  # noqa: E402
    connect,
    ranker_inputs,
    recommend_inputs,
)
from phoenix.serving.repository import derive_repository  # noqa: E402
from phoenix.serving.triton_adapter import model_parameters  # noqa: E402
from phoenix.serving.triton_server import TritonServer, flags_to_args  # noqa: E402

RESULTS = REPO_ROOT / "bench" / "results"
DOCS = REPO_ROOT / "docs" / "performance.md"
TABLE_START, TABLE_END = "<!-- serving-table:start -->", "<!-- serving-table:end -->"
WORKLOADS = {  # name: (model, candidates per user or None)
    "ranker-64": ("ranker", 64),
    "ranker-512": ("ranker", 512),
    "recommend": ("recommend", None),
}
RECOMMEND_TOP_K = 100
IN_PROCESS_BATCH = 8  # the ranker's and retriever's max_batch_size
UNSTABLE = "Failed to obtain stable measurement"
PERF_ANALYZER_LIMIT_S = 300  # one concurrency level; a stuck run is killed, not waited for


# ----------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------


def int_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def name_list(choices: Sequence[str]):
    def parse(text: str) -> list[str]:
        names = [v.strip() for v in text.split(",") if v.strip()]
        unknown = sorted(set(names) - set(choices))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {list(choices)}")
        return names

    return parse


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/bench_serving.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=REPO_ROOT / "artifacts" / "demo",
        help="artifact directory to serve (default: artifacts/demo)",
    )
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=REPO_ROOT / "model_repository",
        help="repository measured with batching on; batching off is a derived "
        "copy (default: model_repository)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fast sanity run: concurrency 1,16, short windows and timings; "
        "writes serving-quick.json/png and leaves the docs alone",
    )
    parser.add_argument(
        "--concurrency",
        type=int_list,
        help="comma-separated concurrency levels (default: 1,4,16,64)",
    )
    parser.add_argument(
        "--protocols",
        type=name_list(("http", "grpc")),
        default=["http", "grpc"],
        help="comma-separated, from http,grpc (default: both)",
    )
    parser.add_argument(
        "--batching",
        type=name_list(("on", "off")),
        default=["on", "off"],
        help="dynamic batching settings, from on,off (default: both)",
    )
    parser.add_argument(
        "--workloads",
        type=name_list(tuple(WORKLOADS)),
        default=list(WORKLOADS),
        help=f"comma-separated, from {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--window-requests",
        type=int,
        help="requests per perf_analyzer measurement window, at least twice the concurrency "
        "(default: 60; quick: 20)",
    )
    parser.add_argument(
        "--users",
        type=int,
        default=16,
        help="distinct random users cycled through (default: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the users (default: 0)")
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON of all figures (default: "
        "bench/results/serving.json, serving-quick.json with --quick)",
    )
    parser.add_argument("--plot", type=Path, help="PNG plot (default: beside --out)")
    parser.add_argument(
        "--docs",
        type=Path,
        help="markdown file whose serving table (between the markers "
        f"{TABLE_START} ... {TABLE_END}) is rewritten (default: "
        "docs/performance.md, none with --quick)",
    )
    parser.add_argument(
        "--build-dir",
        type=Path,
        default=REPO_ROOT / "build" / "bench",
        help="derived repository, input data and server logs (default: build/bench)",
    )
    args = parser.parse_args(argv)
    stem = "serving-quick" if args.quick else "serving"
    args.concurrency = args.concurrency or ([1, 16] if args.quick else [1, 4, 16, 64])
    args.window_requests = args.window_requests or (20 if args.quick else 60)
    args.out = args.out or RESULTS / f"{stem}.json"
    args.plot = args.plot or args.out.with_suffix(".png")
    if args.docs is None and not args.quick:
        args.docs = DOCS
    args.timing_s = 0.5 if args.quick else 3.0
    return args


# ----------------------------------------------------------------------------------------
# Requests: the same users for the server and for the in-process services
# ----------------------------------------------------------------------------------------


def make_users(artifacts: Path, count: int, seed: int) -> list[dict]:
    """Users with full histories (the ranker's cost does not depend on the history length)."""
    config = load_config(artifacts)
    corpus = CorpusIds.load(artifacts, config)
    rng = np.random.default_rng(seed)
    return [
        with_action_width(
            random_sequence(rng, config, corpus, config.history_seq_len, 512, RECOMMEND_TOP_K),
            config.num_actions,
        )
        for _ in range(count)
    ]


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
    times = []
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


class InProcess:
    """The services built as the Triton adapter builds them, from the server's parameters."""

    def __init__(self, artifacts: Path, params: dict[str, dict[str, str]], max_batch: dict):
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        from phoenix.serving.triton_adapter import build_service, enable_compilation_cache

        enable_compilation_cache()
        self.services = {
            model: build_service(model, params[model], artifacts, max_batch[model])
            for model in ("user_encoder", "retriever", "ranker")
        }

    def run(self, model: str, requests: list[dict]) -> list[dict]:
        results = self.services[model].handle(requests)
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results

    def recommend(self, requests: list[dict]) -> list[dict]:
        """The ensemble's three steps, batched like the batcher would batch them."""
        users = [{k: v for k, v in r.items() if k != "top_k"} for r in requests]
        embeddings = self.run("user_encoder", users)
        retrieved = self.run(
            "retriever",
            [
                {
                    "user_embedding": e["user_embedding"],
                    "top_k": r["top_k"],
                    "history_post_ids": r["history_post_ids"],
                }
                for e, r in zip(embeddings, requests, strict=True)
            ],
        )
        return self.run(
            "ranker",
            [
                {
                    **u,
                    "candidate_post_ids": got["post_ids"],
                    "candidate_author_ids": got["author_ids"],
                    "candidate_retrieval_scores": got["retrieval_scores"],
                }
                for u, got in zip(users, retrieved, strict=True)
            ],
        )

    def call(self, workload: str, requests: list[dict]):
        model, _ = WORKLOADS[workload]
        if model == "recommend":
            return self.recommend(requests)
        return self.run(model, requests)

    def measure(self, workload: str, requests: list[dict], min_seconds: float) -> dict:
        """One user per call and IN_PROCESS_BATCH users per call, cycling through ``requests``."""
        cursor = [0]

        def take(n: int) -> list[dict]:
            start = cursor[0]
            cursor[0] = (start + n) % len(requests)
            return [requests[(start + i) % len(requests)] for i in range(n)]

        out = {}
        for batch in (1, IN_PROCESS_BATCH):
            out[f"batch_{batch}"] = timed_rate(
                lambda b=batch: self.call(workload, take(b)), batch, min_seconds
            )
        return out


# ----------------------------------------------------------------------------------------
# Served: perf_analyzer against a running server
# ----------------------------------------------------------------------------------------


def perf_analyzer_env() -> dict[str, str]:
    """LD_LIBRARY_PATH with the nvidia-cuda-runtime-cu12 wheel's lib (perf_analyzer links it)."""
    import nvidia.cuda_runtime

    lib = Path(next(iter(nvidia.cuda_runtime.__path__))) / "lib"
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(lib), env.get("LD_LIBRARY_PATH")) if p)
    return env


def perf_analyzer_binary() -> Path:
    binary = Path(sys.executable).parent / "perf_analyzer"
    if not binary.is_file():
        raise SystemExit(f"{binary} not found: it ships in the tritonclient==2.51.0 wheel")
    return binary


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
        str(perf_analyzer_binary()), "-m", m.model, "-u", url, "-i", m.protocol,
        "--input-data", str(data), "--concurrency-range", f"{m.concurrency}:{m.concurrency}",
        "--measurement-mode", "count_windows",
        "--measurement-request-count", str(max(window, 2 * m.concurrency)),
        "--stability-percentage", str(stability), "--max-trials", str(trials), "-f", str(csv_path),
    ]  # fmt: skip
    limit = PERF_ANALYZER_LIMIT_S
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=perf_analyzer_env(), timeout=limit
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
    with urllib.request.urlopen(f"http://{http_url}/v2/models/stats", timeout=10) as response:
        stats = json.load(response)
    return {s["name"]: int(s["inference_stats"]["fail"]["count"]) for s in stats["model_stats"]}


def served_parameters(http_url: str) -> tuple[dict, dict]:
    client = connect(http_url, "http")
    params, max_batch = {}, {}
    for model in ("user_encoder", "retriever", "ranker"):
        config = client.get_model_config(model)
        params[model] = model_parameters(config)
        max_batch[model] = int(config.get("max_batch_size", 1) or 1)
    return params, max_batch


def start_server(repo: Path, artifacts: Path, log: Path) -> TritonServer:
    server = TritonServer(
        repo,
        artifacts_dir=artifacts,
        extra_args=flags_to_args({"exit_timeout_secs": 5}),
        log_path=log,
        ready_timeout=600,
    )
    server.start_ready()
    return server


# ----------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------


def repository_for(batching: str, args) -> Path:
    if batching == "on":
        return args.model_repository.resolve()
    dest = args.build_dir / "model_repository-nobatch"
    derive_repository(args.model_repository, dest, dynamic_batching=False)
    restore_ensembles(args.model_repository, dest)
    return dest


def restore_ensembles(source: Path, dest: Path) -> None:
    """Put the ensembles' own configs back into a derived copy.

    derive_repository gives every model an instance_group, which Triton refuses for an ensemble
    ("instance group should not be specified for ensemble"); ensembles have no batcher anyway.
    """
    for config in source.glob("*/config.pbtxt"):
        text = config.read_text()
        if re.search(r'^\s*platform\s*:\s*"ensemble"', text, re.MULTILINE):
            (dest / config.parent.name / config.name).write_text(text)


def start_servers(args) -> dict[str, TritonServer]:
    """One server per batching setting, all up at once (an idle server costs no CPU)."""
    servers: dict[str, TritonServer] = {}
    try:
        for batching in args.batching:
            log = args.build_dir / f"tritonserver-batching-{batching}.log"
            print(f"== dynamic batching {batching}: starting tritonserver (log {log})", flush=True)
            servers[batching] = start_server(repository_for(batching, args), args.artifacts, log)
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, TritonServer]) -> None:
    for server in servers.values():
        server.stop()


def measure_all(servers: dict[str, TritonServer], args, data: dict[str, Path], results) -> None:
    """Every workload and concurrency, with the settings back to back.

    On a shared machine the load of others drifts over minutes: measuring the settings one
    after the other at each point keeps that drift out of the on/off and gRPC/HTTP ratios.
    """
    before = {b: failure_counts(s.http_url) for b, s in servers.items()}
    for workload in args.workloads:
        for concurrency in args.concurrency:
            for batching, server in servers.items():
                for protocol in args.protocols:
                    url = server.http_url if protocol == "http" else server.grpc_url
                    model = WORKLOADS[workload][0]
                    m = Measurement(workload, model, protocol, batching, concurrency)
                    measure_served(m, url, data[workload], args.window_requests, args.quick)
                    print_measurement(m)
                    results["served"].append(asdict(m))
    for batching, server in servers.items():
        after = failure_counts(server.http_url)
        failed = {k: after[k] - before[batching].get(k, 0) for k in after}
        results["failed_requests"][batching] = failed


def measure_in_process(http_url: str, args, results: dict) -> None:
    print("== in process (the servers idle meanwhile)", flush=True)
    params, max_batch = served_parameters(http_url)
    engine = InProcess(args.artifacts.resolve(), params, max_batch)
    users = make_users(args.artifacts, args.users, args.seed)
    results["in_process"] = {}
    for workload in args.workloads:
        requests = [request_arrays(workload, user) for user in users]
        figures = engine.measure(workload, requests, args.timing_s)
        results["in_process"][workload] = figures
        print(
            f"  {workload:<11} batch 1: {figures['batch_1']['throughput']:8.1f} req/s   "
            f"batch {IN_PROCESS_BATCH}: {figures[f'batch_{IN_PROCESS_BATCH}']['throughput']:8.1f}"
            " req/s",
            flush=True,
        )


def print_measurement(m: Measurement) -> None:
    where = f"  {m.workload:<11} batching {m.batching:<3} {m.protocol:<4} c={m.concurrency:<3}"
    if m.error:
        print(f"{where} ERROR {m.error}", flush=True)
        return
    flag = " (unstable)" if m.unstable else ""
    print(
        f"{where} {m.throughput:8.1f} req/s  "
        f"p50 {m.p50_ms:7.1f}  p95 {m.p95_ms:7.1f}  p99 {m.p99_ms:7.1f} ms  "
        f"batch {m.avg_batch:4.1f}{flag}",
        flush=True,
    )


def machine_info() -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg(),
    }


# ----------------------------------------------------------------------------------------
# Ratios, table, plot
# ----------------------------------------------------------------------------------------


def served_rows(results: dict, **match) -> list[dict]:
    return [
        r for r in results["served"]
        if not r["error"] and all(r[k] == v for k, v in match.items())
    ]  # fmt: skip


def best(rows: list[dict]) -> Optional[dict]:
    return max(rows, key=lambda r: r["throughput"]) if rows else None


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def summarize(results: dict, concurrency_for_batching: int = 16) -> dict[str, dict]:
    """Per workload: served best vs in-process best, batching on/off, gRPC/HTTP."""
    summary = {}
    for workload, figures in results.get("in_process", {}).items():
        in_process = max(f["throughput"] for f in figures.values())
        top = best(served_rows(results, workload=workload, batching="on"))
        row = {
            "in_process_batch_1": figures["batch_1"]["throughput"],
            "in_process_best": in_process,
            "served_best": top["throughput"] if top else None,
            "served_best_setting": (f"{top['protocol']}, c={top['concurrency']}" if top else None),
            "served_vs_in_process": ratio(top and top["throughput"], in_process),
        }
        for protocol in ("http", "grpc"):
            on = served_rows(results, workload=workload, protocol=protocol, batching="on",
                             concurrency=concurrency_for_batching)  # fmt: skip
            off = served_rows(results, workload=workload, protocol=protocol, batching="off",
                              concurrency=concurrency_for_batching)  # fmt: skip
            row[f"batching_on_off_{protocol}"] = ratio(
                on[0]["throughput"] if on else None, off[0]["throughput"] if off else None
            )
        grpc = best(served_rows(results, workload=workload, protocol="grpc", batching="on"))
        http = best(served_rows(results, workload=workload, protocol="http", batching="on"))
        row["grpc_vs_http"] = ratio(grpc and grpc["throughput"], http and http["throughput"])
        summary[workload] = row
    return summary


def fmt(value: Optional[float], spec: str = ".2f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(results: dict) -> str:
    lines = [
        "| workload | in-process req/s (1 / 8 users per call) | served best req/s | "
        "served / in-process | batching on / off at c=16 (HTTP, gRPC) | gRPC / HTTP |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for workload, row in results["summary"].items():
        in_process = results["in_process"][workload]
        lines.append(
            f"| {workload} | {in_process['batch_1']['throughput']:.0f} / "
            f"{in_process[f'batch_{IN_PROCESS_BATCH}']['throughput']:.0f} | "
            f"{fmt(row['served_best'], '.0f')} ({row['served_best_setting']}) | "
            f"{fmt(row['served_vs_in_process'], '.0%')} | "
            f"{fmt(row['batching_on_off_http'], '.2f', 'x')}, "
            f"{fmt(row['batching_on_off_grpc'], '.2f', 'x')} | "
            f"{fmt(row['grpc_vs_http'], '.2f', 'x')} |"
        )
    failed = sum(sum(v.values()) for v in results["failed_requests"].values())
    errors = sum(1 for r in results["served"] if r["error"])
    lines.append("")
    lines.append(
        f"Failed requests (server statistics): {failed}; perf_analyzer runs with errors: {errors}."
    )
    return "\n".join(lines)


def short_path(path: str) -> str:
    """``path`` relative to the repository root when it lies inside it."""
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def update_docs(path: Path, table: str, results: dict) -> None:
    """Rewrite the table between the markers of ``path`` (left alone without markers)."""
    if not path.is_file():
        print(f"note: {path} does not exist; table not written there")
        return
    text = path.read_text()
    if TABLE_START not in text or TABLE_END not in text:
        print(f"note: {path} has no {TABLE_START} ... {TABLE_END} markers; table not written")
        return
    head, rest = text.split(TABLE_START, 1)
    _, tail = rest.split(TABLE_END, 1)
    machine, settings = results["machine"], results["settings"]
    loads = machine["load_average_at_start"][0], machine.get("load_average_at_end", [0])[0]
    stamp = (
        f"Measured {results['date']} on {machine['cpu_count']} CPU cores (1-minute load average "
        f"{loads[0]:.1f} at the start, {loads[1]:.1f} at the end), artifacts "
        f"`{short_path(settings['artifacts'])}`, repository "
        f"`{short_path(settings.get('model_repository', 'model_repository'))}`."
    )
    path.write_text(f"{head}{TABLE_START}\n{stamp}\n\n{table}\n{TABLE_END}{tail}")
    print(f"updated the table in {path}")


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(results["in_process"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(11, 3.4 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        thr, lat = axes[row]
        for protocol in ("http", "grpc"):
            for batching in ("on", "off"):
                rows = sorted(
                    served_rows(results, workload=workload, protocol=protocol, batching=batching),
                    key=lambda r: r["concurrency"],
                )
                if not rows:
                    continue
                style = "-" if batching == "on" else "--"
                label = f"{protocol}, batching {batching}"
                xs = [r["concurrency"] for r in rows]
                thr.plot(xs, [r["throughput"] for r in rows], style, marker="o", label=label)
                lat.plot(xs, [r["p99_ms"] for r in rows], style, marker="o", label=label)
        in_process = results["summary"][workload]["in_process_best"]
        thr.axhline(in_process, color="gray", linestyle=":", label="in-process best")
        thr.set_title(f"{workload}: throughput")
        thr.set_ylabel("requests / s")
        lat.set_title(f"{workload}: p99 latency")
        lat.set_ylabel("ms")
        lat.set_yscale("log")
        for ax in (thr, lat):
            ax.set_xscale("log", base=2)
            ax.set_xticks(results["settings"]["concurrency"])
            ax.set_xticklabels([str(c) for c in results["settings"]["concurrency"]])
            ax.set_xlabel("concurrency")
            ax.grid(alpha=0.3)
        thr.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    args.build_dir.mkdir(parents=True, exist_ok=True)
    users = make_users(args.artifacts, args.users, args.seed)
    data = {
        w: write_input_data(args.build_dir / f"{w}.json", [request_arrays(w, u) for u in users])
        for w in args.workloads
    }
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine_info(),
        "settings": {
            "artifacts": str(args.artifacts),
            "model_repository": str(args.model_repository),
            "concurrency": args.concurrency,
            "window_requests": args.window_requests,
            "users": args.users,
            "history": "full (history_seq_len)",
            "recommend_top_k": RECOMMEND_TOP_K,
            "quick": args.quick,
        },
        "served": [],
        "failed_requests": {},
    }
    started = time.monotonic()
    servers = start_servers(args)
    try:
        measure_in_process(next(iter(servers.values())).http_url, args, results)
        measure_all(servers, args, data, results)
    finally:
        stop_servers(servers)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["wall_s"] = time.monotonic() - started
    results["summary"] = summarize(results)
    table = markdown_table(results)
    print(f"\n{table}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.plot)
    print(f"wrote {args.out} and {args.plot} ({results['wall_s']:.0f} s)")
    if args.docs:
        update_docs(args.docs, table, results)
    failed = sum(sum(v.values()) for v in results["failed_requests"].values())
    return 1 if failed or any(r["error"] for r in results["served"]) else 0


if __name__ == "__main__":
    sys.exit(main())
