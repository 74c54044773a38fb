"""Soak test: a long run at about half capacity, with failures, latency over time and memory.

    python bench/soak.py --duration 600                 # what `make soak` runs
    python bench/soak.py --duration 60 --out-prefix bench/results/soak-short

Starts its own server (the serve command's flags: explicit model control, supervisor) over
--artifacts on free loopback ports, unless --http-url/--grpc-url name a running one. It
measures capacity (closed loop), then sends requests at a fixed rate (open loop: latency is
counted from when a request was due, so a stalled server cannot hide its backlog), half over
HTTP and half over gRPC, and samples the resident memory (RSS) of tritonserver and every stub.
Writes JSON and PNG; exits 1 when a request failed or memory grew by more than --max-rss-growth.

Why a load generator of its own (`LoadRun`) and not Locust or perf_analyzer: the soak is an
open loop, each request due at a fixed time and its latency counted from then, with every
answer checked, reported in 10 s windows over 10 minutes. Locust's users are closed loops
(`constant_throughput` waits for the answer, so a stalled server slows the senders and hides
its backlog: coordinated omission), and perf_analyzer's request-rate mode reports one aggregate
per measurement, neither a time series nor checked answers. The tests do not use this module.
Every run is bounded in time and in request count.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from phoenix.serving.client import client_module, infer_inputs

REPO_ROOT = Path(__file__).resolve().parents[1]

DEFAULT_TIMEOUT_S = 30.0


# ------------------------------------------------------------------------------------------
# One client sending one kind of request
# ------------------------------------------------------------------------------------------


class Caller:
    """A client connection of its own (one per thread) that sends one request shape.

    `check(outputs)` may raise to flag a wrong answer (the request then counts as failed) and
    may return a label recorded with the outcome (say, which corpus answered).
    """

    def __init__(
        self,
        url: str,
        protocol: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        *,
        outputs: Sequence[str] | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        check: Callable[[dict[str, np.ndarray]], str | None] | None = None,
    ):
        self.protocol, self.model, self.check, self.timeout_s = protocol, model, check, timeout_s
        module = client_module(protocol)
        if protocol == "http":
            self.client = module.InferenceServerClient(
                url, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        else:
            self.client = module.InferenceServerClient(url)
        self.tensors = infer_inputs(module, inputs)
        self.output_names = list(outputs or [])
        self.outputs = [module.InferRequestedOutput(name) for name in self.output_names] or None

    def __call__(self) -> str:
        """Send the request once; returns the check's label ('' without one)."""
        extra = {"client_timeout": self.timeout_s} if self.protocol == "grpc" else {}
        result = self.client.infer(self.model, self.tensors, outputs=self.outputs, **extra)
        arrays = {name: result.as_numpy(name) for name in self.output_names}
        return (self.check(arrays) or "") if self.check is not None else ""

    def send_async(self, on_done: Callable[[str, str], None]) -> None:
        """gRPC only: send without waiting; `on_done(label, error)` runs on the answer."""

        def done(result, error) -> None:
            if error is not None:
                on_done("", short_error(error))
                return
            try:
                arrays = {name: result.as_numpy(name) for name in self.output_names}
                on_done((self.check(arrays) or "") if self.check else "", "")
            except Exception as exc:  # noqa: BLE001 (a wrong answer is a failure like any)
                on_done("", short_error(exc))

        self.client.async_infer(
            self.model, self.tensors, done, outputs=self.outputs, client_timeout=self.timeout_s
        )

    def close(self) -> None:
        self.client.close()


# ------------------------------------------------------------------------------------------
# Bounded background load
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One request: when it was due, sent and answered (time.monotonic()), and how it ended."""

    due: float
    started: float
    ended: float
    error: str  # '' when the answer was right
    protocol: str
    label: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def latency(self) -> float:
        """Seconds from due to answered (open loop: includes waiting for a free worker)."""
        return self.ended - self.due


def short_error(error: BaseException) -> str:
    text = str(error).replace("\n", " ")
    return (text or type(error).__name__)[:300]


class LoadRun:
    """`workers` threads sending requests until `duration_s` passes, `max_requests` are sent or
    stop() is called. Closed loop by default (each worker sends its next request when the
    last one is answered); with `rate` an open loop: requests are due at a fixed rate.
    With `rate` and `asynchronous` (gRPC callers only) one thread sends every request at its
    due time without waiting for answers: no worker pool to run out of, and little client CPU.

    `make_caller(worker_index)` builds each worker's Caller (in that worker's thread).
    """

    def __init__(
        self,
        make_caller: Callable[[int], Caller],
        *,
        workers: int,
        duration_s: float,
        rate: float | None = None,
        max_requests: int | None = None,
        pause_after_error_s: float = 0.0,
        asynchronous: bool = False,
    ):
        if asynchronous and rate is None:
            raise ValueError("an asynchronous run needs a rate")
        self.asynchronous = asynchronous
        self.make_caller = make_caller
        self.workers = workers
        self.duration_s = duration_s
        self.rate = rate
        self.max_requests = max_requests or int(1e9)
        self.pause_after_error_s = pause_after_error_s
        self.outcomes: list[Outcome] = []
        self.setup_errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tickets: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._sent = 0
        self.started_at = self.deadline = 0.0

    # -- tickets -------------------------------------------------------------------------
    def _take_ticket(self) -> float | None:
        """When the next request is due, or None when the run is over."""
        if self.rate is None:
            with self._lock:
                if self._stop.is_set() or time.monotonic() >= self.deadline:
                    return None
                if self._sent >= self.max_requests:
                    return None
                self._sent += 1
            return time.monotonic()
        while not self._stop.is_set():
            try:
                return self._tickets.get(timeout=0.1)
            except queue.Empty:
                if time.monotonic() >= self.deadline + 1.0:
                    return None
        return None

    def _pace(self) -> None:
        """Open loop: put one ticket per 1/rate seconds, then one None per worker."""
        count = min(self.max_requests, int(self.rate * self.duration_s))
        for index in range(count):
            due = self.started_at + index / self.rate
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            self._tickets.put(due)
        for _ in range(self.workers):
            self._tickets.put(None)

    # -- workers -------------------------------------------------------------------------
    def _work(self, index: int) -> None:
        try:
            caller = self.make_caller(index)
        except Exception as error:  # noqa: BLE001 (reported with the results)
            self.setup_errors.append(short_error(error))
            return
        try:
            while (due := self._take_ticket()) is not None:
                started = time.monotonic()
                label = error = ""
                try:
                    label = caller()
                except Exception as exc:  # noqa: BLE001 (every failure is data here)
                    error = short_error(exc)
                outcome = Outcome(due, started, time.monotonic(), error, caller.protocol, label)
                with self._lock:
                    self.outcomes.append(outcome)
                if error and self.pause_after_error_s:
                    self._stop.wait(self.pause_after_error_s)
        finally:
            caller.close()  # in the thread that made it (the HTTP client is gevent-based)

    def _send_asynchronously(self) -> None:
        """Open loop without workers: send each request at its due time, answers arrive on
        gRPC's threads; then wait (bounded) for the last answers."""
        caller = self.make_caller(0)
        pending = threading.Semaphore(0)
        sent = 0
        try:
            count = min(self.max_requests, int(self.rate * self.duration_s))
            for index in range(count):
                due = self.started_at + index / self.rate
                if self._stop.wait(max(0.0, due - time.monotonic())):
                    break
                started = time.monotonic()

                def done(label, error, due=due, started=started) -> None:
                    outcome = Outcome(due, started, time.monotonic(), error, "grpc", label)
                    with self._lock:
                        self.outcomes.append(outcome)
                    pending.release()

                caller.send_async(done)
                sent += 1
            end = time.monotonic() + caller.timeout_s + 5
            for _ in range(sent):
                if not pending.acquire(timeout=max(0.0, end - time.monotonic())):
                    break
        finally:
            caller.close()

    def start(self) -> LoadRun:
        self.started_at = time.monotonic()
        self.deadline = self.started_at + self.duration_s
        if self.asynchronous:
            self._threads = [threading.Thread(target=self._send_asynchronously, daemon=True)]
            self._threads[0].start()
            return self
        self._threads = [
            threading.Thread(target=self._work, args=(i,), daemon=True) for i in range(self.workers)
        ]
        if self.rate is not None:
            self._threads.append(threading.Thread(target=self._pace, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def wait(self, timeout: float | None = None) -> LoadRun:
        """Wait for the run to end (duration, count or stop) and its last answers."""
        end = time.monotonic() + (timeout if timeout is not None else self.duration_s + 120)
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        return self

    def stop(self, timeout: float = 60.0) -> LoadRun:
        self._stop.set()
        return self.wait(timeout)

    def __enter__(self) -> LoadRun:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)


# ------------------------------------------------------------------------------------------
# Summaries
# ------------------------------------------------------------------------------------------


def percentiles_ms(latencies: Sequence[float]) -> dict[str, float | None]:
    if not len(latencies):
        return {"p50_ms": None, "p95_ms": None, "p99_ms": None, "max_ms": None}
    values = np.percentile(np.asarray(latencies) * 1e3, [50, 95, 99, 100])
    return {k: round(float(v), 2) for k, v in zip(("p50_ms", "p95_ms", "p99_ms", "max_ms"), values)}


def summarize(outcomes: Sequence[Outcome], seconds: float | None = None) -> dict:
    """Counts, error kinds and latency percentiles of the right answers."""
    ok = [o for o in outcomes if o.ok]
    errors = Counter(o.error[:160] for o in outcomes if not o.ok)
    if seconds is None and outcomes:
        seconds = max(o.ended for o in outcomes) - min(o.due for o in outcomes)
    return {
        "requests": len(outcomes),
        "ok": len(ok),
        "failed": len(outcomes) - len(ok),
        "ok_per_s": round(len(ok) / seconds, 2) if seconds else None,
        **percentiles_ms([o.latency for o in ok]),
        "errors": dict(errors.most_common(10)),
    }


def measure_capacity(
    make_caller: Callable[[int], Caller], workers: int = 8, duration_s: float = 8.0
) -> dict:
    """Summary of a closed loop with `workers` concurrent requests; its `ok_per_s` (right
    answers per second) is the capacity."""
    run = LoadRun(make_caller, workers=workers, duration_s=duration_s).start().wait()
    return summarize(run.snapshot(), duration_s)


# ------------------------------------------------------------------------------------------
# Memory
# ------------------------------------------------------------------------------------------


def process_rss(server_pid: int) -> dict[str, int]:
    """RSS in bytes of tritonserver and each of its stubs (by instance name), and the total."""
    from phoenix.serving.supervisor import list_stubs, rss_bytes

    sizes = {"tritonserver": rss_bytes(server_pid) or 0}
    for stub in list_stubs(server_pid):
        sizes[stub.instance] = rss_bytes(stub.pid) or 0
    sizes["total"] = sum(sizes.values())
    return sizes


def rss_growth_pct(start: Mapping[str, int], end: Mapping[str, int]) -> dict[str, float]:
    return {
        name: round(100.0 * (end[name] - start[name]) / start[name], 2)
        for name in start
        if start[name] and name in end
    }


# ------------------------------------------------------------------------------------------
# The soak
# ------------------------------------------------------------------------------------------


def recommend_caller_factory(http_url: str, grpc_url: str, artifacts: Path, top_k: int):
    """Callers of the end-to-end `recommend` ensemble, even workers HTTP, odd ones gRPC."""
    from phoenix.checkpoint import load_example_sequence
    from phoenix.serving.client import recommend_inputs

    inputs = recommend_inputs(load_example_sequence(artifacts).to_dict(), top_k=top_k)

    def check(outputs: dict[str, np.ndarray]) -> None:
        ranked = outputs["ranked_post_ids"]
        if ranked.shape[0] != 1 or not 0 < ranked.shape[1] <= top_k:
            raise AssertionError(f"wrong answer: ranked_post_ids of shape {ranked.shape}")

    def make(index: int) -> Caller:
        protocol = "http" if index % 2 == 0 else "grpc"
        url = http_url if protocol == "http" else grpc_url
        return Caller(url, protocol, "recommend", inputs, outputs=["ranked_post_ids"], check=check)

    return make


def windows(outcomes: Sequence[Outcome], start: float, width_s: float) -> list[dict]:
    """Per-window counts and latency percentiles (by due time)."""
    if not outcomes:
        return []
    last = max(o.due for o in outcomes)
    rows = []
    for index in range(int((last - start) // width_s) + 1):
        lo = start + index * width_s
        chosen = [o for o in outcomes if lo <= o.due < lo + width_s]
        ok = [o.latency for o in chosen if o.ok]
        rows.append(
            {
                "t_s": round(index * width_s, 1),
                "requests": len(chosen),
                "failed": len(chosen) - len(ok),
                **percentiles_ms(ok),
            }
        )
    return rows


def sample_memory(server_pid: int, stop: threading.Event, every_s: float, out: list) -> None:
    start = time.monotonic()
    while True:
        out.append({"t_s": round(time.monotonic() - start, 1), **process_rss(server_pid)})
        if stop.wait(every_s):
            return


def start_own_server(artifacts: Path, log_dir: Path):
    """A server configured like `serve` (explicit control mode + supervisor) on free ports."""
    from phoenix.serving.admin_key import server_admin_key
    from phoenix.serving.serve import DEFAULT_MODEL_REPOSITORY, server_flags
    from phoenix.serving.supervisor import Supervisor
    from phoenix.serving.triton_server import TritonServer, flags_to_args

    admin_key, _ = server_admin_key(log_dir)  # $PHOENIX_ADMIN_KEY, else log_dir/admin-key
    server = TritonServer(
        REPO_ROOT / DEFAULT_MODEL_REPOSITORY,
        artifacts_dir=artifacts,
        extra_args=flags_to_args(server_flags(supervised=True, admin_key=admin_key)),
        log_path=log_dir / f"soak-tritonserver-{int(time.time())}.log",
        ready_timeout=900,
    )
    server.start_ready()
    supervisor = Supervisor(server.http_url, server.pid, admin_key=admin_key).start()
    return server, supervisor


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lat, mem) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    rows = result["windows"]
    t = [r["t_s"] for r in rows]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        lat.plot(t, [r[key] if r[key] is not None else np.nan for r in rows], label=key[:3])
    failed = [r["t_s"] for r in rows if r["failed"]]
    if failed:
        lat.scatter(failed, [0] * len(failed), color="red", marker="x", label="failures")
    lat.set_ylabel("latency of right answers (ms)")
    lat.set_title(
        f"soak: {result['rate_rps']:.0f} req/s for {result['duration_s']:.0f} s, "
        f"{result['totals']['failed']} failed of {result['totals']['requests']}"
    )
    lat.legend()
    lat.grid(alpha=0.3)
    samples = result["memory"]["samples"]
    names = [n for n in samples[0] if n not in ("t_s", "total")]
    for name in names:
        mem.plot([s["t_s"] for s in samples], [s.get(name, 0) / 2**20 for s in samples], label=name)
    mem.set_ylabel("RSS (MiB)")
    mem.set_xlabel("seconds into the soak")
    mem.legend(fontsize=8)
    mem.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_soak(args: argparse.Namespace) -> dict:
    server = supervisor = None
    if args.http_url:
        http_url, grpc_url, server_pid = args.http_url, args.grpc_url, args.server_pid
    else:
        server, supervisor = start_own_server(args.artifacts, args.log_dir)
        http_url, grpc_url, server_pid = server.http_url, server.grpc_url, server.pid
        print(f"server ready after {server.ready_after_s:.1f} s", flush=True)
    try:
        make = recommend_caller_factory(http_url, grpc_url, args.artifacts, args.top_k)
        capacity = args.capacity or measure_capacity(make, 8, 10.0)["ok_per_s"] or 0.0
        rate = args.rate or max(1.0, args.load_fraction * capacity)
        print(
            f"capacity {capacity:.1f} req/s; soaking at {rate:.1f} req/s for {args.duration:.0f} s",
            flush=True,
        )
        samples: list[dict] = []
        stop_sampling = threading.Event()
        sampler = None
        if server_pid:
            sampler = threading.Thread(
                target=sample_memory,
                args=(server_pid, stop_sampling, args.window, samples),
                daemon=True,
            )
            sampler.start()
        run = LoadRun(make, workers=args.workers, duration_s=args.duration, rate=rate)
        run.start().wait(args.duration + 120)
        stop_sampling.set()
        if sampler:
            sampler.join(10)
            samples.append(
                {"t_s": round(time.monotonic() - run.started_at, 1), **process_rss(server_pid)}
            )
        outcomes = run.snapshot()
        result = {
            "model": "recommend",
            "top_k": args.top_k,
            "artifacts": str(args.artifacts),
            "protocols": "http+grpc (alternating workers)",
            "capacity_rps": round(capacity, 2),
            "rate_rps": round(rate, 2),
            "duration_s": args.duration,
            "workers": args.workers,
            "totals": summarize(outcomes, args.duration),
            "windows": windows(outcomes, run.started_at, args.window),
            "supervisor_events": supervisor.events if supervisor else [],
        }
        if samples:
            start, end = samples[0], samples[-1]
            growth = rss_growth_pct(start, end)
            result["memory"] = {
                "start": start,
                "end": end,
                "growth_pct": growth,
                "samples": samples,
                "max_growth_pct_allowed": args.max_rss_growth,
            }
        return result
    finally:
        if supervisor:
            supervisor.stop()
        if server:
            server.stop()


def verdict(result: dict, max_growth: float) -> list[str]:
    """Reasons the soak failed (empty when it passed)."""
    problems = []
    if result["totals"]["failed"]:
        problems.append(
            f"{result['totals']['failed']} requests failed: {result['totals']['errors']}"
        )
    for name, pct in result.get("memory", {}).get("growth_pct", {}).items():
        if pct > max_growth:
            problems.append(f"RSS of {name} grew by {pct:.1f}% (> {max_growth}%)")
    return problems


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/soak.py",
        description="Soak the end-to-end `recommend` model at a fraction of its capacity and "
        "report failures, latency percentiles over time and RSS growth of tritonserver and "
        "its stubs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of soak")
    parser.add_argument(
        "--artifacts",
        type=Path,
        default=Path("artifacts/demo"),
        help="artifact directory (served, and the example request)",
    )
    parser.add_argument(
        "--load-fraction",
        type=float,
        default=0.5,
        help="rate as a fraction of the measured capacity",
    )
    parser.add_argument("--rate", type=float, help="requests per second (skips the fraction)")
    parser.add_argument("--capacity", type=float, help="known capacity (skips measuring it)")
    parser.add_argument("--top-k", type=int, default=50, help="top_k of each request")
    parser.add_argument("--workers", type=int, default=16, help="client threads")
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds per latency window and memory sample"
    )
    parser.add_argument(
        "--max-rss-growth",
        type=float,
        default=10.0,
        help="percent RSS growth (start to end) that fails the soak",
    )
    parser.add_argument(
        "--http-url",
        help="use a running server (host:port) instead of "
        "starting one; needs --grpc-url, and --server-pid for memory",
    )
    parser.add_argument("--grpc-url", help="gRPC host:port of the running server")
    parser.add_argument("--server-pid", type=int, help="tritonserver pid (memory sampling)")
    parser.add_argument(
        "--log-dir", type=Path, default=Path("build/soak"), help="where the server log goes"
    )
    parser.add_argument(
        "--out-prefix",
        type=Path,
        default=Path("bench/results/soak"),
        help="writes PREFIX.json and PREFIX.png",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.http_url and not args.grpc_url:
        print("error: --http-url needs --grpc-url too", file=sys.stderr)
        return 2
    args.log_dir.mkdir(parents=True, exist_ok=True)
    result = run_soak(args)
    problems = verdict(result, args.max_rss_growth)
    result["passed"] = not problems
    result["problems"] = problems
    args.out_prefix.parent.mkdir(parents=True, exist_ok=True)
    json_path = args.out_prefix.with_suffix(".json")
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    if result.get("memory"):
        plot(result, args.out_prefix.with_suffix(".png"))
    totals = result["totals"]
    print(json.dumps({k: totals[k] for k in ("requests", "failed", "p50_ms", "p99_ms")}))
    if result.get("memory"):
        print("RSS growth %:", result["memory"]["growth_pct"])
    print(f"wrote {json_path}" + (" and .png" if result.get("memory") else ""))
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
