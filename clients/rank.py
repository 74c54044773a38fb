"""Rank one user's candidates with the served `ranker`: `python -m clients.rank --help`."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

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
from phoenix.serving.client import feed_table, infer, ranker_inputs


def parse_args(argv: Optional[Sequence[str]]):
    parser = build_parser(
        "python -m clients.rank",
        "Send one user's history and candidates to the served `ranker` and print the "
        "candidates in ranked order: rank, post id, blended score and the most likely actions. "
        "The input's candidate_* lists are the candidates.",
        [
            "python -m clients.rank                           # the artifacts' example user",
            "python -m clients.rank --generate --candidates 512 --protocol grpc --check",
            "python -m clients.rank --input user.json --url 10.0.0.5:8000",
        ],
    )
    add_user_args(parser, candidates=True)
    parser.add_argument(
        "--rows", type=int, default=20, help="ranked rows to print (default: %(default)s)"
    )
    add_check_arg(parser)
    return parser.parse_args(argv)


def check_ranking(args, client, arrays: dict, served: dict) -> int:
    params = server_parameters(client, args.protocol, "ranker")
    expected = InProcessModels(args.artifacts).run("ranker", params, arrays)
    problems = compare_outputs(served, expected, id_names=("ranked_post_ids",))
    return report_check(problems, "the served ranking")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        config = load_config(args.artifacts)
        user = load_user(args, config)
    except ArtifactError as error:
        return fail(str(error))
    arrays = ranker_inputs(user)
    try:
        client = open_client(args)
        served = infer(client, args.protocol, "ranker", arrays)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        return fail(f"ranker at {server_url(args)} ({args.protocol}): {error}")
    count = len(user["candidate_post_ids"])
    print(f"{count} candidates of user {user['user_id']}, ranked:\n")
    print(feed_table(served, config.action_names, rows=args.rows))
    if not args.check:
        return 0
    try:
        return check_ranking(args, client, arrays, served)
    except Exception as error:
        print(f"error: --check could not compute the reference: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
