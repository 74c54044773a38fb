"""Locust load test of the served Phoenix models over HTTP and gRPC (KServe v2).

Two user classes share one weighted mix of traffic: `rank` (the ranker, 1..512 candidates; over
a production-family artifact a full history, its candidate_seq_len candidates and every input
of X's production ranker: 1,022 x 64 for nano, `--rank-history`/`--rank-candidates` to change),
`recommend` (the ensemble with its feed policy, top_k 10..200, half of the requests with seen
posts and excluded authors), `retrieve` (user_encoder, then retriever with the
returned vector) and `recommend_by_id` (the ensemble by `user_id` and `top_k` alone, a quarter
with filters: the server reads the history from its user-state store). Users have histories of
0..history_seq_len posts; post and author ids come from the artifact directory's corpus. By-id
users are the first `--by-id-users` users of a trained world (`--by-id-world`, its
training.json), drawn by Zipf's law (`--zipf-s`) reproducibly for `--workload-seed`; with
`--redis-url` they are loaded into that store first (the server's). Every response is checked
(status, output shapes, ranked ids are the candidates, scores sorted descending, history
excluded, in_network flags 0/1, request_id > 0); a failed check is a failure.
`--exclude-tags recommend_by_id` leaves the by-id traffic out (a server without a store).

Against a running server (see loadtest/README.md):
    .venv/bin/locust -f loadtest/locustfile.py --headless -u 8 -r 8 -t 30s \\
        --host http://127.0.0.1:8000 --grpc-url 127.0.0.1:8001 --artifacts artifacts/demo
With a server of its own, reports and a verdict (what `make loadtest` runs):
    .venv/bin/python loadtest/locustfile.py --help
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

import gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from locust import FastHttpUser, User, events, tag, task

from clients.workload import CorpusIds
from harness.locust_runs import DEFAULT_GRPC_URL, TOTALS_SUFFIX, Totals, add_server_options
from loadtest.grpc_pool import close_client, threads_for
from loadtest.runner import main
from loadtest.workload import (
    BY_ID_TAG,
    BY_ID_WEIGHT,
    DEFAULT_ARTIFACTS,
    DEFAULT_BY_ID_USERS,
    DEFAULT_WORLD,
    TASK_WEIGHTS,
    THINK_TIME_S,
    ByIdTraffic,
    Prepared,
    Workload,
    by_id_population,
    by_id_selected,
    think_time_arg,
    think_time_text,
)
from phoenix.client.client import result_arrays
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.world.popularity import DEFAULT_ZIPF_S

WORKLOAD: Optional[Workload] = None
BY_ID: Optional[ByIdTraffic] = None


def workload() -> Workload:
    if WORKLOAD is None:
        raise RuntimeError("the workload is built on Locust's init event; was it fired?")
    return WORKLOAD


def by_id_traffic() -> ByIdTraffic:
    if BY_ID is None:
        raise RuntimeError("the by-id traffic is built on Locust's init event when its tag is in")
    return BY_ID


# ----------------------------------------------------------------------------------------
# Locust wiring: options, init, a global request cap
# ----------------------------------------------------------------------------------------


@events.init_command_line_parser.add_listener
def add_options(parser) -> None:
    add_server_options(
        parser,
        DEFAULT_ARTIFACTS,
        "artifact directory the server serves; ids are drawn from its corpus",
        env_var="PHOENIX_LOADTEST_ARTIFACTS",
    )
    parser.add_argument(
        "--max-requests",
        type=int,
        default=0,
        help="stop the run after this many requests (0: only --run-time bounds it)",
    )
    parser.add_argument(
        "--think-time",
        type=think_time_arg,
        default=think_time_text(THINK_TIME_S),
        metavar="LOW,HIGH",
        help="seconds each user waits after an answer, drawn uniformly (default: %(default)s)",
        include_in_web_ui=False,  # the web UI would hand the users its text, not (low, high)
    )
    parser.add_argument("--pool-size", type=int, default=64, help="prepared random users per task")
    parser.add_argument(
        "--rank-history",
        type=int,
        default=-1,
        help="history items of every rank request (-1: random up to history_seq_len; a "
        "production-family ranker's: a full history)",
    )
    parser.add_argument(
        "--rank-candidates",
        type=int,
        default=0,
        help="candidates of every rank request (0: random 1..512; a production-family "
        "ranker's: its candidate_seq_len, 64 for X's nano)",
    )
    parser.add_argument("--workload-seed", type=int, default=0, help="seed of the random users")
    parser.add_argument(
        "--redis-url",
        default="",
        env_var=USER_STATE_URL_ENV,
        help="the server's user-state store: the by-id users are loaded into it first "
        f"(default: ${USER_STATE_URL_ENV}, else none: the by-id users are sent unloaded)",
    )
    parser.add_argument(
        "--by-id-world",
        default=DEFAULT_WORLD,
        help="trained artifact directory whose world's users the by-id requests are for",
    )
    parser.add_argument(
        "--by-id-users",
        type=int,
        default=DEFAULT_BY_ID_USERS,
        help="how many of the world's users the by-id requests draw from",
    )
    parser.add_argument(
        "--zipf-s",
        type=float,
        default=DEFAULT_ZIPF_S,
        help="exponent of the Zipf law of the by-id users (0: uniform)",
    )


@events.init.add_listener
def build_workload(environment, **_kwargs) -> None:
    global WORKLOAD
    options = environment.parsed_options
    artifacts = Path(getattr(options, "artifacts", DEFAULT_ARTIFACTS))
    pool_size = getattr(options, "pool_size", 64)
    seed = getattr(options, "workload_seed", 0)
    history = getattr(options, "rank_history", -1)
    candidates = getattr(options, "rank_candidates", 0)
    WORKLOAD = Workload(
        artifacts, pool_size, seed, None if history < 0 else history, candidates or None
    )
    build_by_id_traffic(options, WORKLOAD.corpus, seed)
    # Every gRPC user may have one blocking call and one close in the pool at a time: no queue.
    users = getattr(options, "num_users", None) or 64
    gevent.get_hub().threadpool.maxsize = threads_for(users)
    cap = getattr(options, "max_requests", 0)
    if cap:
        stop_after(environment, cap)
    # Building the pools does not yield to gevent's loop, whose clock stays where it was: -t's
    # timer would count from before it, and a build longer than -t (a loaded machine) ended
    # the run before a request was sent.
    gevent.get_hub().loop.update_now()


def build_by_id_traffic(options, corpus: CorpusIds, seed: int) -> None:
    global BY_ID
    if options is None or not by_id_selected(options):
        return
    if options.by_id_users < 1:
        raise SystemExit(f"--by-id-users must be at least 1, got {options.by_id_users}")
    users = by_id_population(
        Path(options.by_id_world), options.by_id_users, options.zipf_s, options.redis_url
    )
    BY_ID = ByIdTraffic(users, corpus, seed)


@events.init.add_listener
def save_totals_at_quit(environment, **_kwargs) -> None:
    """With --csv PREFIX, write PREFIX_totals.json when Locust quits: the runner's verdict then
    counts what Locust's closing table counts (its CSV can miss the last requests)."""
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:
        path = Path(f"{prefix}{TOTALS_SUFFIX}")
        environment.events.quit.add_listener(lambda **_: save_totals(environment.stats, path))


def locust_totals(stats) -> Totals:
    """Requests and failures of Locust's `stats.total`, the table's Aggregated row."""
    return Totals(stats.total.num_requests, stats.total.num_failures)


def save_totals(stats, path: Path) -> None:
    path.write_text(json.dumps(locust_totals(stats)._asdict()) + "\n")


def stop_after(environment, cap: int) -> None:
    """Quit the run once `cap` requests have been reported."""
    seen = [0]

    def count(**_kwargs):
        seen[0] += 1
        if seen[0] == cap and environment.runner is not None:
            gevent.spawn(environment.runner.quit)

    environment.events.request.add_listener(count)


# ----------------------------------------------------------------------------------------
# Users
# ----------------------------------------------------------------------------------------


class PhoenixTraffic(User):
    """The traffic mix both protocols send; subclasses implement ``send``."""

    abstract = True

    def wait_time(self) -> float:
        low, high = getattr(self.environment.parsed_options, "think_time", THINK_TIME_S)
        return self.rng.uniform(low, high)

    def on_start(self) -> None:
        self.rng = np.random.default_rng()
        self.by_id_rng = by_id_traffic().stream() if BY_ID is not None else None

    def send(self, prepared: Prepared) -> Optional[Mapping[str, np.ndarray]]:
        raise NotImplementedError

    @tag("rank")  # `--tags rank` sends only these
    @task(TASK_WEIGHTS["rank"])
    def rank(self) -> None:
        self.send(workload().pick("rank", self.rng))

    @tag("recommend")  # `--tags recommend` sends only these
    @task(TASK_WEIGHTS["recommend"])
    def recommend(self) -> None:
        self.send(workload().pick("recommend", self.rng))

    @tag(BY_ID_TAG)  # `--exclude-tags recommend_by_id` for a server without a store
    @task(BY_ID_WEIGHT)
    def recommend_by_id(self) -> None:
        traffic = by_id_traffic()  # a RuntimeError without the by-id traffic
        assert self.by_id_rng is not None  # drawn at the start when the traffic was built
        self.send(traffic.prepare(self.by_id_rng))

    @tag("retrieve")  # `--tags retrieve` sends only these
    @task(TASK_WEIGHTS["retrieve"])
    def retrieve(self) -> None:
        first = workload().pick("retrieve", self.rng)
        outputs = self.send(first)
        if outputs is not None:
            self.send(workload().retriever_step(first, outputs["user_embedding"]))


class TritonHttpUser(PhoenixTraffic, FastHttpUser):
    """KServe v2 over HTTP with binary tensor data (FastHttpUser: geventhttpclient)."""

    host = "http://127.0.0.1:8000"

    def send(self, prepared: Prepared) -> Optional[Mapping[str, np.ndarray]]:
        body, json_size = workload().http_body(prepared)
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(json_size),
        }
        url = f"/v2/models/{prepared.model}/infer"
        with self.client.post(
            url,
            data=body,  # type: ignore[arg-type]  # locust types str; its docs and client take bytes
            headers=headers,
            name=prepared.label,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:300]}")
                return None
            try:
                outputs = self.parse(response)
                problem = prepared.check(outputs)
            except Exception as error:  # an unparsable answer is a failed request
                outputs, problem = None, f"bad response: {error}"
            if problem:
                response.failure(problem)
                return None
            response.success()
            return outputs

    @staticmethod
    def parse(response) -> dict[str, np.ndarray]:
        length = response.headers.get("Inference-Header-Content-Length")
        result = httpclient.InferenceServerClient.parse_response_body(
            response.content, header_length=int(length) if length else None
        )
        return result_arrays(result)


class TritonGrpcUser(PhoenixTraffic):
    """KServe v2 over gRPC with tritonclient.grpc.

    grpcio blocks the whole gevent loop (and its gevent integration hung here), so every call
    runs in gevent's thread pool and is reported to Locust's statistics by hand.
    """

    def on_start(self) -> None:
        super().on_start()
        url = getattr(self.environment.parsed_options, "grpc_url", DEFAULT_GRPC_URL)
        self.client = grpcclient.InferenceServerClient(url=url)

    def on_stop(self) -> None:
        close_client(self.client)

    def call(self, prepared: Prepared) -> dict[str, np.ndarray]:
        inputs = workload().grpc_inputs(prepared)
        result = gevent.get_hub().threadpool.apply(self.client.infer, (prepared.model, inputs))
        return result_arrays(result)

    def send(self, prepared: Prepared) -> Optional[dict[str, np.ndarray]]:
        started = time.perf_counter()
        outputs, length = None, 0
        error: Optional[Exception] = None
        try:
            outputs = self.call(prepared)
            length = sum(array.nbytes for array in outputs.values())
            problem = prepared.check(outputs)
            if problem:
                error = AssertionError(problem)
        except Exception as exception:  # every failure is reported, none ends the user
            error = exception
        self.environment.events.request.fire(
            request_type="grpc",
            name=prepared.label,
            response_time=1e3 * (time.perf_counter() - started),
            response_length=length,
            exception=error,
            context={},
        )
        return None if error else outputs


if __name__ == "__main__":
    sys.exit(main())
