"""End-to-end recommendation through the `recommend` ensemble.

Ask the served `recommend` ensemble (user_encoder -> retriever -> ranker -> feed_policy) for
one user's feed: it encodes the user, retrieves the top_k corpus posts the user has not seen,
ranks them, and applies the feed policy (filters, a score over every action, author
diversity; docs/policy.md). This prints the feed: rank, post id, policy score, retrieval
score and the most likely actions. --exclude-authors, --seen-posts and --max-age send the
feed's optional filters; --no-policy also prints the ranker's own ranking beside the feed.

--user-id N asks by user id alone (with top_k and the filters): the server reads the user's
history from its user-state store (docs/user-state.md); the title says how many history items
it read (from the served user_state model).

Examples:
  phoenix-recommend                          # the artifacts' example user
  phoenix-recommend --user-id 7 --top-k 50   # the history the server's store holds
  phoenix-recommend --generate --seed 3 --top-k 100 --protocol grpc
  phoenix-recommend --input user.json --check
  phoenix-recommend --no-policy --seen-posts 12,34 --max-age 86400
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from clients import cli
from phoenix.checkpoint import ArtifactError, load_config
from phoenix.client.client import (
    feed_table,
    input_row,
    model_inputs,
    recommend_inputs,
    served_models,
    side_by_side,
)
from phoenix.client.inprocess import SERVICE_MODELS
from phoenix.schema.recommend import RECOMMEND
from phoenix.schema.wiring import run_until
from phoenix.util.command_line import id_number, id_numbers

RANKED_IDS = ("ranked_post_ids",)
DEFAULT_TOP_K = 50  # --user-id without --top-k


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__, artifacts_from_server=True)
    cli.add_user_args(parser)
    add = parser.add_argument
    by_id = "ask by user id only: the server hydrates the history from its user-state store "
    by_id += "(not with --input, --generate or --check)"
    add("--user-id", type=id_number, metavar="N", help=by_id)
    cli.add_top_k_and_rows(parser, "retrieve and rank")
    excluded = "comma-separated author ids the feed must leave out (blocked or muted)"
    add("--exclude-authors", type=id_numbers, metavar="IDS", help=excluded)
    seen = "comma-separated post ids already seen or served, left out of the feed"
    add("--seen-posts", type=id_numbers, metavar="IDS", help=seen)
    max_age = "leave out posts older than this (where the corpus has creation times)"
    add("--max-age", type=float, metavar="SECONDS", help=max_age)
    both = "also print the ranker's own ranking (before the feed policy) beside the feed"
    add("--no-policy", action="store_true", help=both)
    cli.add_check_arg(parser)
    args = parser.parse_args(argv)
    if args.user_id is not None and (args.input or args.generate or args.check):
        parser.error("--user-id asks with the server's stored history: not with --input, "
                     "--generate or --check")  # fmt: skip
    return args


def filter_inputs(args) -> dict[str, np.ndarray]:
    """The feed's optional filters the arguments ask for, as recommend inputs."""
    values = {
        "excluded_author_ids": args.exclude_authors,
        "seen_post_ids": args.seen_posts,
        "max_age_seconds": args.max_age,
    }
    return {
        name: input_row(RECOMMEND.input(name), value)  # the contract's dtype and shape
        for name, value in values.items()
        if value is not None
    }


def check_feed(args, client, arrays: dict, served: dict[str, Any]) -> int:
    """The ensemble's steps in this process, wired as recommend/config.pbtxt wires them."""
    expected = cli.reference_models(args, client, *SERVICE_MODELS).run("recommend", arrays)
    problems = cli.compare_outputs(served, expected, id_names=RANKED_IDS)
    return cli.report_check(problems, "the served feed")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(recommend, parse_args(argv))


def stored_history_length(args, user_id: int) -> int:
    """How many history items the server's user_state step reads for ``user_id``."""
    _, state = cli.ask(args, "user_state", model_inputs("user_state", {"user_id": user_id}))
    return int(np.count_nonzero(state["history_post_ids"][0]))


def by_id_user(args) -> tuple:
    """(config, user, title) of a --user-id request: no history in the request."""
    try:
        config = load_config(cli.artifacts(args))
    except ArtifactError as error:
        raise cli.Exit(cli.fail(str(error))) from None
    top_k = int(args.top_k or DEFAULT_TOP_K)
    history = stored_history_length(args, args.user_id)
    title = (f"Feed for user {args.user_id} by id ({history} history items read by the server "
             f"from its user-state store, top_k {top_k}):")  # fmt: skip
    return config, {"user_id": args.user_id, "top_k": top_k}, title


def recommend(args) -> int:
    if args.user_id is not None:
        config, user, title = by_id_user(args)
        top_k = user["top_k"]
    else:
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
