"""A closed-loop (or fixed-rate) load of tritonclient requests that records every request's
due, start and end times and its error, and checks every answer.

Why beside Locust and perf_analyzer: the fault tests line each request's outcome up with the
fault they inject (a kill, a SIGTERM, a corpus swap, an overload), and the soak (bench/soak.py)
is an open loop whose latency counts from when a request was due, reported in windows over
time. Locust's users are closed loops (a stalled server slows the senders and hides its
backlog) and perf_analyzer reports one aggregate per measurement; neither gives per-request
timings relative to an event. Throughput and latency figures come from the benchmarks.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from phoenix.client.client import client_module, infer_inputs

DEFAULT_TIMEOUT_S = 30.0


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


def alternating_callers(
    http_url: str, grpc_url: str, model: str, inputs: Mapping[str, np.ndarray], **options
) -> Callable[[int], Caller]:
    """A LoadRun's `make_caller` whose even workers send over HTTP and odd ones over gRPC, so
    one run loads both endpoints; `options` are Caller's keyword arguments."""

    def make(index: int) -> Caller:
        protocol = "http" if index % 2 == 0 else "grpc"
        url = http_url if protocol == "http" else grpc_url
        return Caller(url, protocol, model, inputs, **options)

    return make


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


# How a client sees a server going away: refused before any work (retry elsewhere is safe) ...
REFUSED = (
    "Connection refused",
    "failed to connect to all addresses",
    "Server is stopping",
    "has no available versions",  # the models are unloading
)
# ... or its connection cut while a request was on it.
CUT = (
    "Connection reset",
    "Socket closed",
    "Broken pipe",
    "connection closed",
    "Disconnected",
    "CANCELLED",
)


def error_kind(error: str) -> str:
    """'refused', 'cut' or 'other': how a failed request met a server going away."""
    for kind, markers in (("refused", REFUSED), ("cut", CUT)):
        if any(marker.lower() in error.lower() for marker in markers):
            return kind
    return "other"


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
        assert self.rate is not None  # an open loop has a rate
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
        except Exception as setup_error:  # noqa: BLE001 (a failed request of its own, so it shows)
            now = time.monotonic()
            failed = Outcome(now, now, now, f"setup: {short_error(setup_error)}", "", "")
            with self._lock:
                self.outcomes.append(failed)
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
        assert self.rate is not None  # an open loop has a rate
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
