"""Start Triton, recommend one user's feed end to end, stop: the `make demo` feed.

Starts tritonserver over model_repository/ as `python -m phoenix.serving.serve` does (the
device's configs, the admin key, no supervisor) on free ports, waits until every model is
ready, asks the ``recommend`` ensemble for the artifacts' example user, prints the feed and
stops the server. The server log and the admin key go to --build-dir.

With trained artifacts (``python -m phoenix.training``), the artifact directory carries a
``metadata.npz`` sidecar (each post's topic and author handle) and ``training.json`` (the
example user's planted interests); the demo then prints the user's history topics next to
the recommended posts' topics and authors, so the match can be seen.

Examples:
  python -m clients.demo                                       # artifacts/demo on the CPU
  python -m clients.demo --artifacts artifacts/trained-demo --device gpu
"""

from __future__ import annotations

import json
import signal
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tritonclient.utils import InferenceServerException

from clients import cli
from phoenix.checkpoint import (
    ArtifactError,
    load_config,
    load_example_sequence,
    read_npz,
    resolve_inside,
)
from phoenix.config import NEGATIVE_ACTIONS
from phoenix.serving.admin_key import AdminKeyError, server_admin_key
from phoenix.serving.client import (
    connect,
    feed_rows,
    feed_table,
    infer,
    more_line,
    recommend_inputs,
)
from phoenix.serving.compile import CompileError, ensure_programs
from phoenix.serving.serve import (
    DEFAULT_BUILD_DIR,
    DEFAULT_MODEL_REPOSITORY,
    ServeError,
    make_server,
    stop_with_parent,
    validate_artifacts,
    warn_if_no_gpu_jax,
)
from phoenix.serving.serve import (
    DEFAULT_READY_TIMEOUT_S as READY_TIMEOUT_S,
)
from phoenix.serving.triton_server import LOOPBACK, TritonServerError

METADATA_FILE = "metadata.npz"
TRAINING_FILE = "training.json"
FEED_ROWS = 20
# What the demo reports in one line (exit 3) rather than with a traceback.
FAILURES = (
    ServeError,
    AdminKeyError,
    TritonServerError,
    ArtifactError,
    InferenceServerException,
    CompileError,
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


def run_demo(http_url: str, artifacts_dir: str | Path, top_k: int = 50) -> None:
    """Recommend ``top_k`` posts for the artifact's example user and print the feed."""
    config = load_config(artifacts_dir)
    seq = load_example_sequence(artifacts_dir).to_dict()
    client = connect(http_url, "http")
    started = time.perf_counter()
    result = infer(client, "http", "recommend", recommend_inputs(seq, top_k))
    elapsed_ms = 1e3 * (time.perf_counter() - started)
    history = len(seq["history_post_ids"])
    info = PostInfo.load(artifacts_dir)
    if info is None:
        print(
            f"\nRecommended feed for user {seq['user_id']} ({history} history items, "
            f"retrieve {top_k} then rank) in {elapsed_ms:.0f} ms over HTTP:\n"
        )
        print(feed_table(result, config.action_names, rows=FEED_ROWS))
        return
    print(f"\nDemo user {seq['user_id']}, {history} history items:")
    for line in history_summary(seq, info, list(config.action_names)) + planted_truth(
        artifacts_dir
    ):
        print(line)
    print(f"\nRecommended feed (retrieve {top_k} then rank) in {elapsed_ms:.0f} ms over HTTP:\n")
    print(topic_feed_table(result, info, config.action_names))


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
    add(
        "--build-dir",
        type=Path,
        default=DEFAULT_BUILD_DIR,
        help="where the log and admin key go (default: %(default)s)",
    )
    # The rest of what serve.make_server reads: free ports, serve's patience.
    parser.set_defaults(http_port=0, grpc_port=0, metrics_port=0, ready_timeout=READY_TIMEOUT_S)
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    # SIGTERM (sent too when `make demo` dies) raises KeyboardInterrupt, so that the `with`
    # below stops the server on the way out.
    stop_with_parent()
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        artifacts = validate_artifacts(args.artifacts)
        warn_if_no_gpu_jax(args.device)
        ensure_programs(artifacts, args.device)  # once here; the model instances only load
        admin_key, _ = server_admin_key(args.build_dir)
        server = make_server(args, artifacts, DEFAULT_MODEL_REPOSITORY, admin_key, supervised=False)
        print(f"starting tritonserver (log: {server.log_path})", flush=True)
        with server:  # started, ready, and stopped on the way out
            print(f"tritonserver {server.pid} ready after {server.ready_after_s:.1f} s", flush=True)
            run_demo(server.http_url, artifacts)
    except FAILURES as error:
        return cli.fail(str(error))
    except KeyboardInterrupt:
        return 130
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
