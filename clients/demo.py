"""Start Triton, recommend one user's feed end to end, stop: the `make demo` feed.

Starts tritonserver over model_repository/ as `python -m phoenix.ops.serve` does (the
device's configs, the admin key, no supervisor) on free ports, waits until every model is
ready, asks the ``recommend`` ensemble for the artifacts' example user, prints the feed (after
the feed policy: filters, every action's weight, author diversity) and how many of the top 10
posts the most frequent author holds, in the ranker's own ranking (the steps asked one by one)
and in the feed, and stops the server. With --no-policy it prints the ranker's own ranking
beside the feed, so what the policy changed can be seen whole. The server log and the admin
key go to --build-dir.

With trained artifacts (``python -m phoenix.training``), the artifact directory carries a
``metadata.npz`` sidecar (each post's topic and author handle) and ``training.json`` (the
example user's planted interests); the demo then prints the user's history topics next to
the recommended posts' topics and authors, so the match can be seen.

With trained artifacts the demo also recommends by user id: it starts a local redis-server
for the user state (the server's --redis), loads the world's users into it (the example user
and the first --world-users others: engagements before the held-out days and follows,
phoenix.world.users), shows the example user's feed by id, then sends an engagement
event (the user favourites posts of a topic new to their history) and shows the feed again,
then a new post of an author the user follows (a post event) and says whether it appears.

Examples:
  python -m clients.demo                                       # artifacts/demo on the CPU
  python -m clients.demo --artifacts artifacts/trained-demo --device gpu
  python -m clients.demo --artifacts artifacts/trained-demo --no-policy
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tritonclient.utils import InferenceServerException

from clients import cli, demo_by_id
from phoenix.checkpoint import (
    ArtifactError,
    load_config,
    load_example_sequence,
    read_npz,
    resolve_inside,
)
from phoenix.checkpoint.files import TRAINING_FILE
from phoenix.checkpoint.identity import servable_artifact_dir
from phoenix.client.client import (
    connect,
    feed_rows,
    feed_table,
    infer,
    more_line,
    most_posts_by_one_author,
    recommend_inputs,
    served_models,
    side_by_side,
)
from phoenix.config import NEGATIVE_ACTIONS
from phoenix.feed_policy import in_network_share
from phoenix.ops.admin_key import AdminKeyError, server_admin_key
from phoenix.ops.compile import CompileError, ensure_programs, warn_if_no_gpu_jax
from phoenix.ops.serve import (
    DEFAULT_BUILD_DIR,
    DEFAULT_MODEL_REPOSITORY,
    ServeError,
    make_server,
    stop_with_parent,
)
from phoenix.ops.serve import (
    DEFAULT_READY_TIMEOUT_S as READY_TIMEOUT_S,
)
from phoenix.ops.triton_server import TritonServerError
from phoenix.schema.wiring import run_until
from phoenix.user_state import UserStateError
from phoenix.user_state.server import RedisServer, RedisServerError, RedisServerMissing
from phoenix.util.command_line import port_number
from phoenix.util.processes import LOOPBACK

METADATA_FILE = "metadata.npz"
FEED_ROWS = 20
WORLD_USERS = 2_000  # loaded in a few seconds; all 100,000 take over a minute
BY_ID_ROWS = 10
DIVERSITY_ROWS = 10  # the feed policy's author diversity is reported over the top 10
# What the demo reports in one line (exit 3) rather than with a traceback.
FAILURES = (
    ServeError,
    AdminKeyError,
    TritonServerError,
    ArtifactError,
    InferenceServerException,
    CompileError,
    UserStateError,
)


class PostInfo:
    """Topic and author handle of each post id, from the ``metadata.npz`` sidecar."""

    def __init__(self, arrays: dict):
        self.topic_names = [str(t) for t in arrays["topic_names"]]
        handles = dict(zip(arrays["author_ids"].tolist(), arrays["author_handles"].tolist()))
        self._topic = dict(zip(arrays["post_ids"].tolist(), arrays["post_topics"].tolist()))
        self._author = {
            post: handles.get(author, str(author))
            for post, author in zip(arrays["post_ids"].tolist(), arrays["post_author_ids"].tolist())
        }

    @classmethod
    def load(cls, artifacts_dir) -> Optional[PostInfo]:
        path = resolve_inside(Path(artifacts_dir), METADATA_FILE)
        return cls(read_npz(path, METADATA_FILE)) if path.is_file() else None

    def topic(self, post_id: int) -> str:
        index = self._topic.get(int(post_id))
        return "?" if index is None else self.topic_names[index]

    def author(self, post_id: int) -> str:
        return self._author.get(int(post_id), "?")

    def add(self, post_id: int, topic: str, author: str) -> None:
        """A post made after the metadata was written (the demo's post event)."""
        if topic not in self.topic_names:
            self.topic_names.append(topic)
        self._topic[int(post_id)] = self.topic_names.index(topic)
        self._author[int(post_id)] = author


def _counts(items) -> str:
    return ", ".join(f"{name} {count}" for name, count in Counter(items).most_common())


def history_summary(seq: dict, info: PostInfo, action_names) -> list[str]:
    """The history's topics, and the topics the user gave negative feedback on."""
    topics = [info.topic(p) for p in seq["history_post_ids"]]
    negative = [action_names.index(n) for n in NEGATIVE_ACTIONS if n in action_names]
    disliked = [
        topic
        for topic, actions in zip(topics, seq["history_actions"])
        if any(actions[i] for i in negative)
    ]
    lines = [f"  history topics:   {_counts(topics)}"]
    if disliked:
        lines.append(f"  negative feedback on: {_counts(disliked)}")
    return lines


def planted_truth(artifacts_dir) -> list[str]:
    """The example user's planted interests, when training.json has them."""
    path = resolve_inside(Path(artifacts_dir), TRAINING_FILE)
    if not path.is_file():
        return []
    user = json.loads(path.read_text(encoding="utf-8")).get("example_user") or {}
    if not user.get("interests"):
        return []
    interests = ", ".join(f"{k} {v:.1f}" for k, v in user["interests"].items())
    line = f"  planted interests (ground truth of the synthetic logs): {interests}"
    if user.get("dislikes"):
        line += f"; dislikes {', '.join(user['dislikes'])}"
    return [line]


def topic_feed_table(result: dict, info: PostInfo, action_names, rows: int = FEED_ROWS) -> str:
    """Rank, topic, author, blended score, retrieval score and the top actions."""
    posts = result["ranked_post_ids"][0]
    lines = [f"{'rank':>4}  {'topic':<10} {'author':<16} {'score':>7}  {'retr.':>6}  top actions"]
    for r in feed_rows(result, action_names, rows):
        lines.append(
            f"{r.rank:>4}  {info.topic(r.post_id):<10} {info.author(r.post_id):<16} "
            f"{r.score:>7.3f}  {r.retrieval_score:>6.3f}  {r.top_actions}"
        )
    lines += more_line(result, rows)
    lines.append(
        f"\n  topics of the top {min(rows, len(posts))}: "
        f"{_counts(info.topic(p) for p in posts[:rows])}"
    )
    return "\n".join(lines)


def compact_feed_table(result: dict, info: Optional[PostInfo], rows: int = FEED_ROWS) -> str:
    """Rank, topic and author (or post id without metadata) and score: one column of the
    side-by-side comparison."""
    posts, scores = result["ranked_post_ids"][0], result["scores"][0]
    if info is None:
        lines = [f"{'rank':>4}  {'post id':>20}  {'score':>7}"]
        lines += [
            f"{i + 1:>4}  {posts[i]:>20}  {scores[i]:>7.3f}" for i in range(min(rows, len(posts)))
        ]
    else:
        lines = [f"{'rank':>4}  {'topic':<10} {'author':<14} {'score':>7}"]
        lines += [
            f"{i + 1:>4}  {info.topic(posts[i]):<10} {info.author(posts[i]):<14} {scores[i]:>7.3f}"
            for i in range(min(rows, len(posts)))
        ]
    return "\n".join(lines)


def diversity_line(result: dict, info: Optional[PostInfo], what: str) -> str:
    """How many of the top posts the most frequent author holds."""
    author, count = most_posts_by_one_author(result, DIVERSITY_ROWS)
    name = str(author)
    if info is not None and count:
        first = result["ranked_post_ids"][0][result["ranked_author_ids"][0].tolist().index(author)]
        name = info.author(first)
    return f"  {what}: at most {count} of the top {DIVERSITY_ROWS} posts by one author ({name})"


def in_network_line(result: dict) -> str:
    """The feed's in-network share: its posts from the followed authors' newest posts."""
    flags = result["in_network"][0]
    top = flags[:DIVERSITY_ROWS]
    return (
        f"  in-network: {int(top.sum())} of the top {len(top)} posts, "
        f"{in_network_share(flags):.0%} of the feed's {len(flags)}"
    )


def ranking_before_policy(client, request: dict) -> dict:
    """The ranker's own outputs for ``request``: the recommend steps asked one by one."""
    return run_until(served_models(client, "http"), request, "ranker")


def run_demo(
    http_url: str, artifacts_dir: str | Path, top_k: int = 50, no_policy: bool = False
) -> None:
    """Recommend ``top_k`` posts for the artifact's example user and print the feed; with
    ``no_policy`` the ranker's own ranking beside it."""
    config = load_config(artifacts_dir)
    seq = load_example_sequence(artifacts_dir).to_dict()
    client = connect(http_url, "http")
    request = recommend_inputs(seq, top_k)
    started = time.perf_counter()
    result = infer(client, "http", "recommend", request)
    elapsed_ms = 1e3 * (time.perf_counter() - started)
    history = len(seq["history_post_ids"])
    info = PostInfo.load(artifacts_dir)
    what = f"retrieve {top_k}, rank, feed policy"
    if info is None:
        print(
            f"\nRecommended feed for user {seq['user_id']} ({history} history items, "
            f"{what}) in {elapsed_ms:.0f} ms over HTTP:\n"
        )
    else:
        print(f"\nDemo user {seq['user_id']}, {history} history items:")
        for line in history_summary(seq, info, list(config.action_names)) + planted_truth(
            artifacts_dir
        ):
            print(line)
        print(f"\nRecommended feed ({what}) in {elapsed_ms:.0f} ms over HTTP:\n")
    raw = ranking_before_policy(client, request)  # what the policy changed: the diversity lines
    if no_policy:
        left = "the ranker alone (no policy)\n" + compact_feed_table(raw, info)
        right = "after the feed policy\n" + compact_feed_table(result, info)
        print(side_by_side(left, right))
        print()
    elif info is None:
        print(feed_table(result, config.action_names, rows=FEED_ROWS))
    else:
        print(topic_feed_table(result, info, config.action_names))
    print(diversity_line(raw, info, "ranker alone"))
    print(diversity_line(result, info, "after the feed policy"))
    print(in_network_line(result))


def ports_line(server, args) -> str:
    """The ports the demo's server listens on; "(free)" where none was asked for (port 0)."""
    ports = (server.http_port, server.grpc_port, server.metrics_port)
    asked = (args.http_port, args.grpc_port, args.metrics_port)
    shown = [f"{what} {port}{'' if wanted else ' (free)'}"
             for what, port, wanted in zip(("HTTP", "gRPC", "metrics"), ports, asked)]  # fmt: skip
    return (
        f"  ports on {server.host}: {', '.join(shown)} (make demo HTTP_PORT=N GRPC_PORT=N "
        "METRICS_PORT=N; no supervisor here)"
    )


def start_user_state(running: contextlib.ExitStack, artifacts: Path) -> str:
    """A local redis-server for the by-id part (trained artifacts only), stopped on the way
    out; "" for artifacts without a trained world."""
    if not (artifacts / TRAINING_FILE).is_file():
        return ""
    try:
        server = running.enter_context(RedisServer())
    except (RedisServerMissing, RedisServerError) as error:
        print(f"no by-id demo: {error}", flush=True)
        return ""
    print(f"user state: a local redis-server at {server.url}", flush=True)
    return server.url


def parse_args(argv: Optional[Sequence[str]]):
    exit_codes = "Exit status: 0 ok, 2 bad arguments, 3 server or input error, 130 interrupted."
    parser = cli.docstring_parser(__file__, __doc__, exit_codes)
    add = parser.add_argument
    add(
        "--artifacts",
        type=Path,
        default=cli.DEFAULT_ARTIFACTS,
        help="the artifact directory to serve (default: %(default)s)",
    )
    add(
        "--device",
        choices=("cpu", "gpu"),
        default="cpu",
        help="the device the models run on (default: %(default)s)",
    )
    add("--host", default=LOOPBACK, help="address to bind (default: %(default)s)")
    for option, variable, what in (
        ("--http-port", "HTTP_PORT", "HTTP/REST (KServe v2)"),
        ("--grpc-port", "GRPC_PORT", "gRPC (KServe v2)"),
        ("--metrics-port", "METRICS_PORT", "Prometheus metrics"),
    ):
        add(option, type=port_number, default=0, metavar="PORT",
            help=f"{what} port (default: 0, a free one; make demo {variable}=N)")  # fmt: skip
    add(
        "--build-dir",
        type=Path,
        default=DEFAULT_BUILD_DIR,
        help="where the log and admin key go (default: %(default)s)",
    )
    add(
        "--world-users",
        type=int,
        default=WORLD_USERS,
        metavar="N",
        help="users of the trained world loaded into the store besides the example user "
        "(default: %(default)s; loading all 100,000 takes minutes, docs/user-state.md)",
    )
    add(
        "--no-policy",
        action="store_true",
        help="also print the ranker's own ranking (before the feed policy) beside the feed",
    )
    # The rest of what serve.make_server reads: serve's patience.
    parser.set_defaults(ready_timeout=READY_TIMEOUT_S)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    # SIGTERM (sent too when `make demo` dies) raises KeyboardInterrupt, so that the `with`
    # below stops the server on the way out.
    stop_with_parent()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        artifacts = servable_artifact_dir(args.artifacts)
        warn_if_no_gpu_jax(args.device)
        ensure_programs(artifacts, args.device)  # once here; the model instances only load
        admin_key, _ = server_admin_key(args.build_dir)
        with contextlib.ExitStack() as running:
            store_url = start_user_state(running, artifacts)
            server = make_server(args, artifacts, DEFAULT_MODEL_REPOSITORY, admin_key,
                                 supervised=False, user_state_url=store_url)  # fmt: skip
            # the world's users load while the server starts (a subprocess)
            loading = (
                demo_by_id.start_loading(store_url, artifacts, args.world_users)
                if store_url
                else None
            )
            print(f"starting tritonserver (log: {server.log_path})", flush=True)
            running.enter_context(server)  # started, ready, and stopped on the way out
            print(f"tritonserver {server.pid} ready after {server.ready_after_s:.1f} s", flush=True)
            print(ports_line(server, args), flush=True)
            run_demo(server.http_url, artifacts, no_policy=args.no_policy)
            if loading is not None:
                demo_by_id.run(
                    server.http_url,
                    store_url,
                    artifacts,
                    loading.result(),
                    PostInfo.load(artifacts),
                )
    except FAILURES as error:
        return cli.fail(str(error))
    except KeyboardInterrupt:
        return 130
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
