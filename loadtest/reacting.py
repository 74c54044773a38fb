"""Locust users who react: each is one user of the synthetic world the served models were
trained on, requesting its feed by id and engaging with it by the world's own model.

Each Locust user is a world user drawn reproducibly for ``--world-seed`` (weighted by the
world's activity; ``phoenix.world.simulate``). It asks ``recommend`` for its feed by user id
over gRPC (``user_id`` and ``top_k`` only: the server reads the history from its user-state
store), views the top ``--top-n`` posts, draws its actions and dwell with the function the log
generator drew the training logs with (``phoenix.world.reactions``), and sends the
engagements back through the event path (``UserStateStore.apply`` on ``--redis-url``), so the
user's state fills as it would in production. The feed request and the event write are Locust
requests ("grpc recommend", "redis engagements"): their failures count.

Online metrics per ``--version-label`` (``phoenix.training.online_metrics``, also counted per
user, so that intervals can resample users) are written when Locust quits: JSON at
``--metrics-out`` and a PNG beside it (runs with other labels gather in the same file). The
draws are reproducible for a seed given the same feeds; the feeds depend on what the server
served, which depends on timing.

Against a running server whose user-state store is at REDIS (see loadtest/README.md):
    .venv/bin/locust -f loadtest/reacting.py --headless -u 8 -r 8 -t 30s \\
        --grpc-url 127.0.0.1:8001 --redis-url redis://127.0.0.1:6379/0 \\
        --artifacts artifacts/trained-demo --version-label trained-demo
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Optional

import gevent
import numpy as np
import tritonclient.grpc as grpcclient
from locust import User, between, events, task

from harness.locust_runs import add_server_options
from harness.results import REPO_ROOT, shown_path
from loadtest.grpc_pool import close_client, threads_for
from phoenix.client.client import infer_inputs, model_inputs, result_arrays
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.training.online_metrics import OnlineMetrics, plot
from phoenix.user_state import UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.world.simulate import SimulatedUser, WorldClock, draw_user_ids
from phoenix.world.trained import trained_world

DEFAULT_ARTIFACTS = "artifacts/trained-demo"
DEFAULT_METRICS = "bench/results/online-metrics.json"
IN_NETWORK_MARK = "in_network"  # an output with this in its name flags in-network posts


class Simulation:
    """What every Locust user of this process shares: the world, its clock, the drawn users,
    the metrics and the store."""

    def __init__(self, options):
        self.options = options
        self.world = trained_world(Path(options.artifacts))
        self.clock = WorldClock.after_logs(self.world)
        # enough drawn users for every Locust user this run may start
        count = max(int(getattr(options, "num_users", None) or 1), options.simulated_users)
        self.user_ids = draw_user_ids(self.world, count, options.world_seed)
        self.next_user = itertools.count()
        self.metrics = OnlineMetrics(bucket_s=options.bucket_s)
        url = options.redis_url or os.environ.get(USER_STATE_URL_ENV, "")
        self.store = UserStateStore(connect_store(url)) if url else None
        self.engagements_sent = 0

    def simulated_user(self) -> SimulatedUser:
        user_id = self.user_ids[next(self.next_user) % len(self.user_ids)]
        return SimulatedUser(self.world, int(user_id), self.options.world_seed, self.clock)

    def write_metrics(self) -> None:
        out = Path(self.options.metrics_out)
        extra = {
            "what": "online metrics of simulated world users (loadtest/reacting.py)",
            "artifacts": shown_path(Path(self.options.artifacts)),
            "world_seed": self.options.world_seed,
            "top_n": self.options.top_n,
            "top_k": self.options.top_k,
            "engagements_sent": self.engagements_sent,
            "store": "applied" if self.store else "none (engagements not sent)",
        }
        summary = self.metrics.write(out, extra)
        plot(summary, out.with_suffix(".png"))
        print(f"online metrics: {shown_path(out)} and {shown_path(out.with_suffix('.png'))}")


SIMULATION: Optional[Simulation] = None


@events.init_command_line_parser.add_listener
def add_options(parser) -> None:
    add_server_options(
        parser,
        DEFAULT_ARTIFACTS,
        "trained artifact directory the server serves; its training.json gives the world",
    )
    parser.add_argument(
        "--redis-url",
        default="",
        help=f"user-state store the engagements go to (default: ${USER_STATE_URL_ENV}; "
        "without either, engagements are not sent)",
    )
    parser.add_argument("--version-label", default="current", help="model version of the metrics")
    parser.add_argument("--top-n", type=int, default=10, help="posts a user views of its feed")
    parser.add_argument("--top-k", type=int, default=50, help="posts a feed request asks for")
    parser.add_argument("--world-seed", type=int, default=0, help="seed of users and reactions")
    parser.add_argument(
        "--simulated-users", type=int, default=1000, help="world users drawn (Locust users cycle)"
    )
    parser.add_argument("--bucket-s", type=float, default=10.0, help="metrics time bucket (s)")
    parser.add_argument(
        "--metrics-out",
        default=str(REPO_ROOT / DEFAULT_METRICS),
        help="online metrics JSON (a PNG beside it); default: " + DEFAULT_METRICS,
    )


@events.init.add_listener
def build_simulation(environment, **_kwargs) -> None:
    global SIMULATION
    options = environment.parsed_options
    if options is None:  # imported by a tool, not run by Locust
        return
    if options.top_n < 1 or options.top_k < options.top_n:
        raise SystemExit(f"need 1 <= --top-n <= --top-k, got {options.top_n} and {options.top_k}")
    SIMULATION = Simulation(options)
    gevent.get_hub().threadpool.maxsize = threads_for(options.num_users or 1)
    environment.events.quit.add_listener(lambda **_: SIMULATION.write_metrics())
    gevent.get_hub().loop.update_now()  # -t counts from here, not from before the build


def simulation() -> Simulation:
    if SIMULATION is None:
        raise RuntimeError("the simulation is built on Locust's init event; was it fired?")
    return SIMULATION


class ReactingUser(User):
    """One world user: request the feed by id, view the top, engage, send the events back.

    grpcio blocks the gevent loop, so the call runs in gevent's thread pool and is reported to
    Locust by hand (as loadtest/locustfile.py does)."""

    wait_time = between(0.2, 1.0)  # reading a feed takes a moment

    def on_start(self) -> None:
        self.simulation = simulation()
        self.user = self.simulation.simulated_user()
        self.client = grpcclient.InferenceServerClient(url=self.simulation.options.grpc_url)

    def on_stop(self) -> None:
        close_client(self.client)

    def report(self, kind: str, name: str, started: float, error, length: int = 0) -> None:
        self.environment.events.request.fire(
            request_type=kind,
            name=name,
            response_time=1e3 * (time.perf_counter() - started),
            response_length=length,
            exception=error,
            context={"user_id": self.user.user_id},
        )

    def request_feed(self) -> Optional[dict[str, np.ndarray]]:
        options = self.simulation.options
        arrays = model_inputs("recommend", {"user_id": self.user.user_id, "top_k": options.top_k})
        inputs = infer_inputs(grpcclient, arrays)
        started, wall = time.perf_counter(), time.time()
        outputs, error = None, None
        try:
            result = gevent.get_hub().threadpool.apply(self.client.infer, ("recommend", inputs))
            outputs = result_arrays(result)
            if outputs["ranked_post_ids"].ndim != 2 or outputs["ranked_post_ids"].shape[0] != 1:
                raise AssertionError(
                    f"ranked_post_ids has shape {outputs['ranked_post_ids'].shape}"
                )
        except Exception as exception:  # every failure is reported, none ends the user
            outputs, error = None, exception
        latency = time.perf_counter() - started
        self.simulation.metrics.record_request(options.version_label, wall, latency, error is None)
        self.report("grpc", "recommend", started, error)
        return outputs

    def send(self, engagements) -> None:
        store = self.simulation.store
        if store is None or not engagements:
            return
        started, error = time.perf_counter(), None
        try:
            store.apply(engagements)
            self.simulation.engagements_sent += len(engagements)
        except Exception as exception:
            error = exception
        self.report("redis", "engagements", started, error, len(engagements))

    @task
    def read_feed(self) -> None:
        outputs = self.request_feed()
        if outputs is None:
            return
        posts = outputs["ranked_post_ids"][0]
        flags = next((v[0] for k, v in outputs.items() if IN_NETWORK_MARK in k), None)
        now = time.time()
        seen = self.user.react(posts, flags, top_n=self.simulation.options.top_n, now=now)
        label = self.simulation.options.version_label
        self.simulation.metrics.record_views(
            label, now, seen.reactions.actions, seen.in_network, seen.unknown_posts,
            user_id=self.user.user_id,
        )  # fmt: skip
        self.send(seen.events)
