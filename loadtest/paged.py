"""Locust users who page through a feed: each asks the ranker for a few pages of other
candidates for the same user and history, a few seconds apart, then becomes a new user.

What the ranker's prefix cache is for (docs/architecture.md, "The prefix cache"): the user and
history tokens (the prefix) of pages 2 and 3 are those of page 1, so a ranker instance that
holds them computes only the new candidates. Each session is a new user id with a history of
``--history`` posts (default: the artifacts' ``history_seq_len``, every item the ranker reads)
and ``--pages`` pages (3) of ``--candidates`` posts (64), all drawn from the artifact
directory's corpus without repeats; between two pages, and after the last one, the user waits
``--page-interval LOW,HIGH`` seconds (2,4), drawn uniformly. Requests go over HTTP with binary
tensors and are named "page 1", "page 2", ... in Locust's tables; every answer is checked
(the ranked ids are the page's candidates, scores sorted), a failed check is a failure.

    .venv/bin/locust -f loadtest/paged.py --headless -u 32 -r 32 -t 60s \\
        --host http://127.0.0.1:8000 --artifacts artifacts/demo

``make bench-prefix-cache`` runs it against a server with the cache and one without, and reads
the cache's hits and misses from the servers' metrics (bench/bench_prefix_cache.py).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Optional

import gevent
import numpy as np
import tritonclient.http as httpclient
from locust import FastHttpUser, events, task

from clients.workload import CorpusIds
from harness.locust_runs import TOTALS_SUFFIX, add_server_options
from loadtest.checks import check_ranking
from loadtest.workload import DEFAULT_ARTIFACTS, http_body, think_time_arg, think_time_text
from phoenix.checkpoint import load_config
from phoenix.client.client import ranker_inputs, result_arrays

PAGES = 3
CANDIDATES = 64
PAGE_INTERVAL_S = (2.0, 4.0)


class Sessions:
    """What every Locust user of this process shares: the corpus and the session counter."""

    def __init__(self, options):
        artifacts = Path(options.artifacts)
        self.config = load_config(artifacts)
        self.corpus = CorpusIds.load(artifacts, self.config)
        self.history = options.history or self.config.history_seq_len
        self.pages, self.candidates = options.pages, options.candidates
        needed = self.history + self.pages * self.candidates
        if needed > len(self.corpus.post_ids):
            raise SystemExit(
                f"{artifacts}: a session needs {needed} distinct posts (history + pages x "
                f"candidates), the corpus has {len(self.corpus.post_ids)}"
            )
        self.seed = options.workload_seed
        self.next_session = itertools.count()

    def session(self) -> list[dict[str, np.ndarray]]:
        """The requests of one new user's pages: the same user and history, other posts."""
        number = next(self.next_session)
        rng = np.random.default_rng([self.seed, number])
        picks = rng.permutation(len(self.corpus.post_ids))
        posts, authors = self.corpus.post_ids[picks], self.corpus.author_ids[picks]
        size = self.history
        user = {
            "user_id": int(rng.integers(1, 2**62)),
            "history_post_ids": posts[:size],
            "history_author_ids": authors[:size],
            "history_actions": (rng.random((size, self.config.num_actions)) < 0.1).astype(
                np.float32
            ),
            "history_product_surface": rng.integers(0, 4, size),
            "history_dwell_seconds": rng.exponential(8.0, size).astype(np.float32),
        }
        pages = []
        for page in range(self.pages):
            start = size + page * self.candidates
            chosen = slice(start, start + self.candidates)
            pages.append(
                ranker_inputs(
                    {
                        **user,
                        "candidate_post_ids": posts[chosen],
                        "candidate_author_ids": authors[chosen],
                    }
                )
            )
        return pages


SESSIONS: Optional[Sessions] = None


@events.init_command_line_parser.add_listener
def add_options(parser) -> None:
    add_server_options(
        parser, DEFAULT_ARTIFACTS, "artifact directory the server serves; ids from its corpus"
    )
    parser.add_argument("--pages", type=int, default=PAGES, help="pages per user (3)")
    parser.add_argument(
        "--candidates", type=int, default=CANDIDATES, help="candidates per page (64)"
    )
    parser.add_argument(
        "--history", type=int, default=0, help="history items (0: the artifacts' history_seq_len)"
    )
    parser.add_argument(
        "--page-interval",
        type=think_time_arg,
        default=think_time_text(PAGE_INTERVAL_S),
        metavar="LOW,HIGH",
        help="seconds between pages, drawn uniformly (default: %(default)s)",
        include_in_web_ui=False,
    )
    parser.add_argument("--workload-seed", type=int, default=0, help="seed of the sessions")


@events.init.add_listener
def build_sessions(environment, **_kwargs) -> None:
    global SESSIONS
    SESSIONS = Sessions(environment.parsed_options)
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:  # the totals of Locust's closing table, as loadtest/locustfile.py writes them
        path = Path(f"{prefix}{TOTALS_SUFFIX}")
        environment.events.quit.add_listener(lambda **_: write_totals(environment.stats, path))


def write_totals(stats, path: Path) -> None:
    totals = {"requests": stats.total.num_requests, "failures": stats.total.num_failures}
    path.write_text(json.dumps(totals) + "\n")


def sessions() -> Sessions:
    if SESSIONS is None:
        raise RuntimeError("the sessions are built on Locust's init event; was it fired?")
    return SESSIONS


class PagedRankerUser(FastHttpUser):
    """One user at a time: its pages a few seconds apart over HTTP, then the next user."""

    host = "http://127.0.0.1:8000"

    def wait_time(self) -> float:
        return self.interval()

    def on_start(self) -> None:
        self.rng = np.random.default_rng()

    def interval(self) -> float:
        low, high = getattr(self.environment.parsed_options, "page_interval", PAGE_INTERVAL_S)
        return float(self.rng.uniform(low, high))

    @task
    def page_through(self) -> None:
        pages = sessions().session()
        for number, arrays in enumerate(pages, start=1):
            if number > 1:
                gevent.sleep(self.interval())
            self.send(f"page {number}", arrays)

    def send(self, name: str, arrays: dict[str, np.ndarray]) -> None:
        body, json_size = http_body(arrays)
        headers = {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(json_size),
        }
        check = check_ranking(arrays["candidate_post_ids"][0], sessions().config.num_actions)
        with self.client.post(
            "/v2/models/ranker/infer",
            data=body,  # type: ignore[arg-type]  # locust types str; its docs and client take bytes
            headers=headers,
            name=name,
            catch_response=True,
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:300]}")
                return
            try:
                length = response.headers.get("Inference-Header-Content-Length")
                result = httpclient.InferenceServerClient.parse_response_body(
                    response.content, header_length=int(length) if length else None
                )
                problem = check(result_arrays(result))
            except Exception as error:  # an unparsable answer is a failed request
                problem = f"bad response: {error}"
            if problem:
                response.failure(problem)
            else:
                response.success()
