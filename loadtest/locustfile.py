"""Locust load test of the served Phoenix models over HTTP and gRPC (KServe v2).

Two user classes share one weighted mix of traffic: `rank` (the ranker, 1..512 candidates),
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

import argparse
import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import gevent
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from locust import FastHttpUser, User, between, events, tag, task
from locust.util.timespan import parse_timespan

from clients.workload import CorpusIds, random_sequence, with_action_width
from harness.locust_runs import (
    DEFAULT_GRPC_URL,
    TOTALS_SUFFIX,
    Totals,
    add_server_options,
    read_totals,
)
from phoenix.checkpoint import load_config
from phoenix.client.client import infer_inputs, model_inputs, recommend_inputs, result_arrays
from phoenix.schema.served import contract
from phoenix.schema.wiring import next_step_inputs, passed_on_history
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import UserStateLimits, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.util.command_line import command_parser
from phoenix.world.popularity import DEFAULT_ZIPF_S, ZipfUsers, user_stream

REPO_ROOT = Path(__file__).resolve().parents[1]

DEFAULT_ARTIFACTS = "artifacts/demo"
DEFAULT_WORLD = "artifacts/trained-demo"  # shipped: the world its users come from
DEFAULT_BY_ID_USERS = 1000
BY_ID_TAG = "recommend_by_id"  # its task's tag and its requests' name in Locust's tables
BY_ID_WEIGHT = 2
BY_ID_FILTERED_SHARE = 0.25
TASK_WEIGHTS = {"rank": 3, "recommend": 2, "retrieve": 1}
MAX_CANDIDATES = 512
TOP_K_RANGE = (10, 200)
FILTERED_SHARE = 0.5  # recommend requests carrying the feed policy's filters
NORM_TOLERANCE = 1e-3

Check = Callable[[Mapping[str, np.ndarray]], Optional[str]]


# ----------------------------------------------------------------------------------------
# Response checks: each returns None when the answer is right, else what is wrong
# ----------------------------------------------------------------------------------------


def shape_problem(
    model: str, outputs: Mapping[str, np.ndarray], shapes: Mapping[str, tuple]
) -> Optional[str]:
    """Every output of the model's contract is there; those in ``shapes`` have that shape."""
    for name in contract(model).output_names:
        if name not in outputs or outputs[name] is None:
            return f"output {name} missing"
    for name, shape in shapes.items():
        if tuple(outputs[name].shape) != shape:
            return f"output {name} has shape {outputs[name].shape}, expected {shape}"
    return None


def sorted_problem(scores: np.ndarray, name: str) -> Optional[str]:
    if not np.all(np.isfinite(scores)):
        return f"{name} has non-finite values"
    if np.any(np.diff(scores) > 0):
        return f"{name} not sorted descending"
    return None


def check_ranking(candidates: np.ndarray, num_actions: int) -> Check:
    count = len(candidates)

    def check(out):
        shapes = {
            "ranked_post_ids": (1, count),
            "scores": (1, count),
            "action_probs": (1, count, num_actions),
        }
        problem = shape_problem("ranker", out, shapes) or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        if not np.array_equal(np.sort(out["ranked_post_ids"][0]), np.sort(candidates)):
            return "ranked_post_ids are not the candidates"
        probs = out["action_probs"]
        if not (np.all(probs >= 0) and np.all(probs <= 1)):
            return "action_probs outside [0, 1]"
        return None

    return check


def check_retrieved(
    model: str, count: int, history: np.ndarray, ids: str, scores: str, extra: Sequence[str] = ()
) -> Check:
    """`count` unique posts, none from the history, scores sorted descending."""

    def check(out):
        shapes = {name: (1, count) for name in (ids, scores, *extra)}
        problem = shape_problem(model, out, shapes)
        problem = problem or sorted_problem(out[scores][0], scores)
        if problem:
            return problem
        posts = out[ids][0]
        if len(np.unique(posts)) != count:
            return f"{ids} has duplicates"
        if np.isin(posts, history).any():
            return f"{ids} contains posts of the user's history"
        return None

    return check


def check_filtered(
    count: int, history: np.ndarray, seen: np.ndarray, excluded: np.ndarray
) -> Check:
    """A feed with filters: at most `count` unique posts, sorted, none from the history, the
    seen posts or the excluded authors."""

    def check(out):
        problem = shape_problem("recommend", out, {})
        posts, authors = out["ranked_post_ids"][0], out["ranked_author_ids"][0]
        problem = problem or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        if len(posts) > count or len(np.unique(posts)) != len(posts):
            return f"ranked_post_ids: {len(posts)} posts, at most {count} unique expected"
        if np.isin(posts, history).any() or np.isin(posts, seen).any():
            return "ranked_post_ids contains posts of the history or seen posts"
        if np.isin(authors, excluded).any():
            return "ranked_author_ids contains an excluded author"
        return None

    return check


def check_by_id(top_k: int, seen: np.ndarray, excluded: np.ndarray) -> Check:
    """A feed by user id: up to top_k retrieved plus the in-network posts, unique, sorted,
    every per-post output as long, in_network flags 0 or 1, a request id > 0, none of the seen
    posts or excluded authors. An empty feed is allowed: a hot user served the whole corpus
    within the served-posts TTL has nothing left but in-network posts, maybe none."""
    most = top_k + UserStateLimits().in_network_total

    def check(out):
        problem = shape_problem("recommend", out, {})
        if problem:
            return problem
        count = out["ranked_post_ids"].shape[-1]
        shapes = {"ranked_post_ids": (1, count), "request_id": (1, 1)}
        shapes.update({name: (1, count) for name in ("scores", "ranked_author_ids", "in_network")})
        problem = shape_problem("recommend", out, shapes)
        problem = problem or sorted_problem(out["scores"][0], "scores")
        if problem:
            return problem
        posts, authors = out["ranked_post_ids"][0], out["ranked_author_ids"][0]
        if count > most or len(np.unique(posts)) != count:
            return f"ranked_post_ids: {count} posts, at most {most} unique expected"
        if not np.isin(out["in_network"][0], (0, 1)).all():
            return "in_network has flags other than 0 and 1"
        if out["request_id"][0, 0] <= 0:
            return f"request_id {out['request_id'][0, 0]} is not positive"
        if np.isin(posts, seen).any() or np.isin(authors, excluded).any():
            return "ranked_post_ids contains seen posts or posts of excluded authors"
        return None

    return check


def check_user_embedding(emb_size: int) -> Check:
    def check(out):
        problem = shape_problem("user_encoder", out, {"user_embedding": (1, emb_size)})
        if problem:
            return problem
        norm = float(np.linalg.norm(out["user_embedding"][0]))
        if not abs(norm - 1.0) < NORM_TOLERANCE:
            return f"user_embedding has L2 norm {norm:.4f}, expected 1"
        return None

    return check


# ----------------------------------------------------------------------------------------
# The workload: pools of prepared, varied requests
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prepared:
    """One request: its model, input arrays and the check of its answer."""

    model: str
    arrays: dict[str, np.ndarray]
    check: Check
    chain: Optional[dict[str, np.ndarray]] = None  # retrieve only: the recommend request
    expected: int = 0  # retrieve only: how many posts the retriever must return
    name: str = ""  # the name in Locust's tables, when not the model's
    # the request encoded per protocol, built on first use (pooled requests are sent many times)
    encoded: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def label(self) -> str:
        return self.name or self.model


def http_body(arrays: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """KServe v2 request body with binary tensors, and the length of its JSON header."""
    inputs = infer_inputs(httpclient, arrays)
    body, json_size = httpclient.InferenceServerClient.generate_request_body(inputs)
    return body, len(body) if json_size is None else json_size


class Workload:
    """Pools of random users per task, ids drawn from the artifact directory's corpus."""

    def __init__(self, artifacts: Path, pool_size: int = 64, seed: int = 0):
        self.config = load_config(artifacts)
        self.corpus = CorpusIds.load(artifacts, self.config)
        self.rng = np.random.default_rng(seed)
        self.pools = {name: [self.prepare(name) for _ in range(pool_size)] for name in TASK_WEIGHTS}

    def user(self, **kwargs) -> dict[str, Any]:
        seq = random_sequence(self.rng, self.config, self.corpus, **kwargs)
        return with_action_width(seq, self.config.num_actions)

    def prepare(self, task_name: str) -> Prepared:
        seq = self.user(top_k=int(self.rng.integers(TOP_K_RANGE[0], TOP_K_RANGE[1] + 1)))
        request = recommend_inputs(seq)  # the user's tensors and top_k
        own = {"user_state": passed_on_history(request)}  # the step a with-history request skips
        users = next_step_inputs(request, own, "user_encoder")
        history = users["history_post_ids"][0]
        if task_name == "rank":
            count = int(self.rng.integers(1, MAX_CANDIDATES + 1))
            posts, authors = self.corpus.draw(self.rng, count)
            arrays = {
                **users,
                "candidate_post_ids": posts[None],
                "candidate_author_ids": authors[None],
            }
            return Prepared("ranker", arrays, check_ranking(posts, self.config.num_actions))
        expected = self.corpus.retrieved_count(seq["top_k"], history)
        if task_name == "recommend" and self.rng.random() < FILTERED_SHARE:
            # the feed policy's filters: a few corpus posts seen, a few authors excluded
            seen, _ = self.corpus.draw(self.rng, 20)
            _, excluded = self.corpus.draw(self.rng, 5)
            request["seen_post_ids"], request["excluded_author_ids"] = seen[None], excluded[None]
            return Prepared("recommend", request, check_filtered(expected, history, seen, excluded))
        if task_name == "recommend":
            extra = ("retrieval_scores", "ranked_author_ids")
            check = check_retrieved(
                "recommend", expected, history, "ranked_post_ids", "scores", extra
            )
            return Prepared("recommend", request, check)
        check = check_user_embedding(self.config.emb_size)
        return Prepared("user_encoder", users, check, request, expected)

    def pick(self, task_name: str, rng: np.random.Generator) -> Prepared:
        pool = self.pools[task_name]
        return pool[int(rng.integers(len(pool)))]

    def retriever_step(self, prepared: Prepared, embedding: np.ndarray) -> Prepared:
        """The retriever request that follows a user_encoder answer, as the ensemble wires it."""
        done = {
            "user_state": passed_on_history(prepared.chain),
            "user_encoder": {"user_embedding": embedding},
        }
        arrays = next_step_inputs(prepared.chain, done, "retriever")
        history = arrays["history_post_ids"][0]
        check = check_retrieved(
            "retriever", prepared.expected, history, "post_ids", "retrieval_scores", ("author_ids",)
        )
        return Prepared("retriever", arrays, check)

    def http_body(self, prepared: Prepared) -> tuple[bytes, int]:
        if "http" not in prepared.encoded:
            prepared.encoded["http"] = http_body(prepared.arrays)
        return prepared.encoded["http"]

    def grpc_inputs(self, prepared: Prepared) -> list:
        if "grpc" not in prepared.encoded:
            prepared.encoded["grpc"] = infer_inputs(grpcclient, prepared.arrays)
        return prepared.encoded["grpc"]


class ByIdTraffic:
    """recommend requests carrying only `user_id` and `top_k` (a quarter also the feed
    filters), for users drawn by Zipf's law; each Locust user draws from its own stream."""

    def __init__(self, users: ZipfUsers, corpus: CorpusIds, seed: int):
        self.users, self.corpus, self.seed = users, corpus, seed
        self.next_client = itertools.count()

    def stream(self) -> np.random.Generator:
        return user_stream(self.seed, next(self.next_client))

    def prepare(self, rng: np.random.Generator) -> Prepared:
        top_k = int(rng.integers(TOP_K_RANGE[0], TOP_K_RANGE[1] + 1))
        values = {"user_id": self.users.draw(rng), "top_k": top_k}
        seen, excluded = np.zeros(0, np.int64), np.zeros(0, np.int64)
        if rng.random() < BY_ID_FILTERED_SHARE:
            seen, _ = self.corpus.draw(rng, 20)
            _, excluded = self.corpus.draw(rng, 5)
            values["seen_post_ids"], values["excluded_author_ids"] = seen, excluded
        arrays = model_inputs("recommend", values)  # the contract's dtypes and shapes
        return Prepared("recommend", arrays, check_by_id(top_k, seen, excluded), name=BY_ID_TAG)


def by_id_population(world_dir: Path, count: int, s: float, store_url: str) -> ZipfUsers:
    """The first ``count`` users of the trained world of ``world_dir``, loaded into the store at
    ``store_url`` when one is given (their engagements, follows and the authors' posts)."""
    from phoenix.checkpoint import ArtifactError
    from phoenix.world.users import WorldUsers, load_users

    try:
        world = WorldUsers.from_artifacts(world_dir)
    except ArtifactError as error:
        raise SystemExit(f"--by-id-world: {error}") from None
    population = world.population(count)
    if store_url:
        loaded = load_users(UserStateStore(connect_store(store_url)), world, population)
        print(loaded.summary(store_url), flush=True)
    return ZipfUsers(world.user_ids[population], s)


def by_id_selected(options) -> bool:
    """Whether Locust's --tags / --exclude-tags leave the by-id task in."""
    tags, excluded = getattr(options, "tags", None), getattr(options, "exclude_tags", None)
    return (not tags or BY_ID_TAG in tags) and BY_ID_TAG not in (excluded or [])


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
    parser.add_argument("--pool-size", type=int, default=64, help="prepared random users per task")
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
    WORKLOAD = Workload(artifacts, pool_size, seed)
    build_by_id_traffic(options, WORKLOAD.corpus, seed)
    # Every gRPC user may have one blocking call in the pool at a time; don't queue them.
    users = getattr(options, "num_users", None) or 64
    gevent.get_hub().threadpool.maxsize = max(10, int(users))
    cap = getattr(options, "max_requests", 0)
    if cap:
        stop_after(environment, cap)


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
    wait_time = between(0.0, 0.1)

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
        self.send(by_id_traffic().prepare(self.by_id_rng))

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
            url, data=body, headers=headers, name=prepared.label, catch_response=True
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
        self.client.close()

    def call(self, prepared: Prepared) -> dict[str, np.ndarray]:
        inputs = workload().grpc_inputs(prepared)
        result = gevent.get_hub().threadpool.apply(self.client.infer, (prepared.model, inputs))
        return result_arrays(result)

    def send(self, prepared: Prepared) -> Optional[dict[str, np.ndarray]]:
        started = time.perf_counter()
        outputs, error, length = None, None, 0
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


# ----------------------------------------------------------------------------------------
# Runner: `python loadtest/locustfile.py` (what `make loadtest` runs)
# ----------------------------------------------------------------------------------------


def parse_runner_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = command_parser(
        "python loadtest/locustfile.py",
        "Run this Locust file headless with both user classes (HTTP and gRPC) "
        "against a Triton server, write Locust's CSV and HTML reports and fail when any "
        "request failed. Without --http-port it starts a server of its own on free loopback "
        "ports over --model-repository, with a redis-server as its user-state store (the "
        "by-id users loaded into it), and stops both afterwards. With --http-port, the by-id "
        "traffic is sent only when --redis-url names that server's store.",
        "Examples:\n"
        "  python loadtest/locustfile.py --users 8 --run-time 30s\n"
        "  python loadtest/locustfile.py --host 127.0.0.1 --http-port 8000 --grpc-port 8001\n"
        "  python loadtest/locustfile.py --http-port 8000 --redis-url redis://127.0.0.1:6379/0\n",
    )

    def add_defaulted(flag: str, text: str, **kwargs) -> None:
        """An option whose help ends with its default."""
        parser.add_argument(flag, help=f"{text} (default: %(default)s)", **kwargs)

    add_defaulted("--artifacts", "artifact directory", type=Path, default=Path(DEFAULT_ARTIFACTS))
    parser.add_argument(
        "--model-repository",
        type=Path,
        default=REPO_ROOT / "model_repository",
        help="repository of the server this starts (default: model_repository)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="host of a running server (with --http-port; default: %(default)s)",
    )
    parser.add_argument(
        "--http-port", type=int, help="test the running server at --host with this HTTP port"
    )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=8001,
        help="its gRPC port (with --http-port; default: %(default)s)",
    )
    parser.add_argument(
        "--redis-url",
        default="",
        help="the running server's user-state store (with --http-port): by-id users are loaded "
        "into it and by-id traffic is sent; without it, none is sent",
    )
    add_defaulted(
        "--by-id-world",
        "trained artifacts whose world's users are the by-id users",
        type=Path,
        default=Path(DEFAULT_WORLD),
    )
    add_defaulted(
        "--by-id-users",
        "how many of the world's users by-id requests draw from, by Zipf's law",
        type=int,
        default=DEFAULT_BY_ID_USERS,
    )
    add_defaulted("--users", "simulated users, half HTTP, half gRPC", type=int, default=8)
    add_defaulted("--spawn-rate", "users started per second", type=float, default=4.0)
    add_defaulted("--run-time", "how long the load runs, Locust syntax", default="30s")
    add_defaulted(
        "--max-requests", "stop earlier after this many requests", type=int, default=20000
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=REPO_ROOT / "loadtest" / "results",
        help="folder for the reports (default: loadtest/results)",
    )
    return parser.parse_args(argv)


def locust_command(args, http_url: str, grpc_url: str) -> list[str]:
    prefix = args.results / "locust"
    return [
        sys.executable, "-m", "locust", "-f", str(Path(__file__).resolve()), "--headless",
        "--users", str(args.users), "--spawn-rate", str(args.spawn_rate),
        "--run-time", args.run_time, "--stop-timeout", "10", "--only-summary",
        "--host", f"http://{http_url}", "--grpc-url", grpc_url,
        "--artifacts", str(args.artifacts.resolve()), "--max-requests", str(args.max_requests),
        "--csv", str(prefix), "--html", f"{prefix}.html", "--exit-code-on-error", "1",
        *by_id_options(args),
    ]  # fmt: skip


def by_id_options(args) -> list[str]:
    """Locust's by-id options: the store to load the users into, or the by-id task left out."""
    if not args.redis_url:
        return ["--exclude-tags", BY_ID_TAG]
    return [
        "--redis-url", args.redis_url, "--by-id-world", str(args.by_id_world.resolve()),
        "--by-id-users", str(args.by_id_users),
    ]  # fmt: skip


def totals_file(results: Path) -> Path:
    return results / f"locust{TOTALS_SUFFIX}"


def closing_line(totals: Optional[Totals], exit_code: int) -> str:
    """The verdict's counts: those of the table Locust printed above (its Aggregated row)."""
    if totals is None:
        return f"Locust saved no totals (it did not finish); Locust exit code {exit_code}"
    return (
        f"{totals.requests} requests, {totals.failures} failed (Locust's Aggregated row above); "
        f"Locust exit code {exit_code}"
    )


def run_locust(args, http_url: str, grpc_url: str) -> int:
    args.results.mkdir(parents=True, exist_ok=True)
    limit = parse_timespan(args.run_time) + 120  # start-up, pools and stop-timeout on top
    command = locust_command(args, http_url, grpc_url)
    totals_file(args.results).unlink(missing_ok=True)  # a previous run's must not count
    try:
        code = subprocess.run(command, timeout=limit).returncode
    except subprocess.TimeoutExpired:
        print(f"error: locust did not finish within {limit:.0f} s", file=sys.stderr)
        return 1
    totals = read_totals(totals_file(args.results))
    print("\n" + closing_line(totals, code))
    print(f"reports in {args.results}/")
    if totals is None or totals.requests == 0 or totals.failures or code:
        print("load test FAILED", file=sys.stderr)
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_runner_args(argv)
    if args.http_port:
        if not args.redis_url:
            print(f"no --redis-url: the {BY_ID_TAG} traffic is left out", flush=True)
        return run_locust(args, f"{args.host}:{args.http_port}", f"{args.host}:{args.grpc_port}")
    from harness.triton import triton_server
    from phoenix.user_state.server import RedisServer

    log = args.results / "tritonserver.log"
    with RedisServer() as store:
        args.redis_url = store.url
        env = {USER_STATE_URL_ENV: store.url}
        server = triton_server(
            args.model_repository, args.artifacts, log_path=log, env=env, exit_timeout_secs=5
        )
        print(f"starting tritonserver over {args.model_repository} (log: {log}), "
              f"user-state store {store.url}", flush=True)  # fmt: skip
        with server:
            print(f"ready after {server.ready_after_s:.0f} s at {server.http_url}", flush=True)
            return run_locust(args, server.http_url, server.grpc_url)


if __name__ == "__main__":
    sys.exit(main())
