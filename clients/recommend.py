"""End-to-end recommendation through the `recommend` ensemble: `python -m clients.recommend --help`.

The ensemble encodes the user, retrieves the top_k corpus posts the user has not seen and
ranks them; this prints the ranked feed.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from clients._common import (
    EXIT_ERROR,
    InProcessModels,
    add_check_arg,
    add_user_args,
    build_parser,
    compare_outputs,
    fail,
    load_user,
    open_client,
    report_check,
    server_parameters,
    server_url,
)
from phoenix.checkpoint import ArtifactError, load_config
from phoenix.serving.client import feed_table, infer, recommend_inputs, user_inputs

RANKED_IDS = ("ranked_post_ids",)


def parse_args(argv: Optional[Sequence[str]]):
    parser = build_parser(
        "python -m clients.recommend",
        "Ask the served `recommend` ensemble (user_encoder -> retriever -> ranker) for one "
        "user's feed and print it: rank, post id, blended score, retrieval score and the most "
        "likely actions.",
        [
            "python -m clients.recommend                      # the artifacts' example user",
            "python -m clients.recommend --generate --seed 3 --top-k 100 --protocol grpc",
            "python -m clients.recommend --input user.json --check",
        ],
    )
    add_user_args(parser)
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
    add_check_arg(parser)
    return parser.parse_args(argv)


def reference_feed(models: InProcessModels, params: dict, user: dict, top_k: int) -> dict:
    """The ensemble's three steps in this process, wired as recommend/config.pbtxt wires them."""
    users = user_inputs(user)
    embedding = models.run("user_encoder", params["user_encoder"], users)["user_embedding"]
    retrieved = models.run(
        "retriever",
        params["retriever"],
        {
            "user_embedding": embedding,
            "top_k": np.array([[top_k]], np.int32),
            "history_post_ids": users["history_post_ids"],
        },
    )
    ranked = models.run(
        "ranker",
        params["ranker"],
        {
            **users,
            "candidate_post_ids": retrieved["post_ids"],
            "candidate_author_ids": retrieved["author_ids"],
            "candidate_retrieval_scores": retrieved["retrieval_scores"],
        },
    )
    ranked["retrieval_scores"] = ranked.pop("ranked_retrieval_scores")
    return ranked


def check_feed(args, client, user: dict, top_k: int, served: dict[str, Any]) -> int:
    params = {
        model: server_parameters(client, args.protocol, model)
        for model in ("user_encoder", "retriever", "ranker")
    }
    expected = reference_feed(InProcessModels(args.artifacts), params, user, top_k)
    problems = compare_outputs(served, expected, id_names=RANKED_IDS)
    return report_check(problems, "the served feed")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.artifacts)
        user = load_user(args, config)
    except ArtifactError as error:
        return fail(str(error))
    top_k = int(args.top_k or user["top_k"])
    try:
        client = open_client(args)
        served = infer(client, args.protocol, "recommend", recommend_inputs(user, top_k))
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        return fail(f"recommend at {server_url(args)} ({args.protocol}): {error}")
    history = len(user["history_post_ids"])
    print(f"Feed for user {user['user_id']} ({history} history items, top_k {top_k}):\n")
    print(feed_table(served, config.action_names, rows=args.rows))
    if not args.check:
        return 0
    try:
        return check_feed(args, client, user, top_k, served)
    except Exception as error:
        print(f"error: --check could not compute the reference: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
