"""End-to-end recommendation through the `recommend` ensemble.

Ask the served `recommend` ensemble (user_encoder -> retriever -> ranker -> feed_policy) for
one user's feed: it encodes the user, retrieves the top_k corpus posts the user has not seen,
ranks them, and applies the feed policy (filters, a score over every action, author
diversity; docs/policy.md). This prints the feed: rank, post id, policy score, retrieval
score and the most likely actions. --exclude-authors, --seen-posts and --max-age send the
feed's optional filters; --no-policy also prints the ranker's own ranking beside the feed.

Examples:
  python -m clients.recommend                      # the artifacts' example user
  python -m clients.recommend --generate --seed 3 --top-k 100 --protocol grpc
  python -m clients.recommend --input user.json --check
  python -m clients.recommend --no-policy --seen-posts 12,34 --max-age 86400
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from clients import cli
from phoenix.serving.client import feed_table, recommend_inputs, served_models, side_by_side
from phoenix.serving.ensemble import run_until
from phoenix.serving.inprocess import SERVICE_MODELS

RANKED_IDS = ("ranked_post_ids",)


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__, artifacts_from_server=True)
    cli.add_user_args(parser)
    parser.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="posts to retrieve and rank (default: the input's top_k; random 10..200 "
        "with --generate)",
    )
    parser.add_argument(
        "--rows", type=int, default=20, help="feed rows to print (default: %(default)s)"
    )
    parser.add_argument(
        "--exclude-authors",
        type=id_list,
        metavar="IDS",
        help="comma-separated author ids the feed must leave out (blocked or muted)",
    )
    parser.add_argument(
        "--seen-posts",
        type=id_list,
        metavar="IDS",
        help="comma-separated post ids already seen or served, left out of the feed",
    )
    parser.add_argument(
        "--max-age",
        type=float,
        metavar="SECONDS",
        help="leave out posts older than this (where the corpus has creation times)",
    )
    parser.add_argument(
        "--no-policy",
        action="store_true",
        help="also print the ranker's own ranking (before the feed policy) beside the feed",
    )
    cli.add_check_arg(parser)
    return parser.parse_args(argv)


def id_list(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def filter_inputs(args) -> dict[str, np.ndarray]:
    """The feed's optional filters the arguments ask for, as recommend inputs."""
    arrays = {}
    if args.exclude_authors is not None:
        arrays["excluded_author_ids"] = np.array([args.exclude_authors], np.int64)
    if args.seen_posts is not None:
        arrays["seen_post_ids"] = np.array([args.seen_posts], np.int64)
    if args.max_age is not None:
        arrays["max_age_seconds"] = np.array([[args.max_age]], np.float32)
    return arrays


def check_feed(args, client, arrays: dict, served: dict[str, Any]) -> int:
    """The ensemble's steps in this process, wired as recommend/config.pbtxt wires them."""
    expected = cli.reference_models(args, client, *SERVICE_MODELS).run("recommend", arrays)
    problems = cli.compare_outputs(served, expected, id_names=RANKED_IDS)
    return cli.report_check(problems, "the served feed")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(recommend, parse_args(argv))


def recommend(args) -> int:
    config, user = cli.request_user(args)
    top_k = int(args.top_k or user["top_k"])
    history = len(user["history_post_ids"])
    title = f"Feed for user {user['user_id']} ({history} history items, top_k {top_k}):"
    arrays = {**recommend_inputs(user, top_k), **filter_inputs(args)}
    if not args.no_policy:
        return cli.show_feed(args, "recommend", arrays, title, config.action_names, check_feed)
    client, served = cli.ask(args, "recommend", arrays)
    try:
        raw = run_until(served_models(client, args.protocol), arrays, "ranker")
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        return cli.no_answer(args, "ranker", error)
    print(title + "\n")
    rows, names = args.rows, config.action_names
    left = "the ranker alone (no policy)\n" + feed_table(raw, names, rows=rows, top_actions=1)
    right = "after the feed policy\n" + feed_table(served, names, rows=rows, top_actions=1)
    print(side_by_side(left, right))
    return cli.run_check(args, check_feed, client, arrays, served)


if __name__ == "__main__":
    sys.exit(main())
