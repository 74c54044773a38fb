"""End-to-end recommendation through the `recommend` ensemble.

Ask the served `recommend` ensemble (user_encoder -> retriever -> ranker) for one user's
feed: it encodes the user, retrieves the top_k corpus posts the user has not seen and ranks
them. This prints the feed: rank, post id, blended score, retrieval score and the most
likely actions.

Examples:
  python -m clients.recommend                      # the artifacts' example user
  python -m clients.recommend --generate --seed 3 --top-k 100 --protocol grpc
  python -m clients.recommend --input user.json --check
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

from clients import cli
from phoenix.serving.client import recommend_inputs
from phoenix.serving.inprocess import SERVICE_MODELS

RANKED_IDS = ("ranked_post_ids",)


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__)
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
    cli.add_check_arg(parser)
    return parser.parse_args(argv)


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
    arrays = recommend_inputs(user, top_k)
    return cli.show_feed(args, "recommend", arrays, title, config.action_names, check_feed)


if __name__ == "__main__":
    sys.exit(main())
