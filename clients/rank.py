"""Rank one user's candidates with the served `ranker`.

Send one user's history and candidates to the served `ranker` and print the candidates in
ranked order: rank, post id, blended score, the retrieval score when the input has
candidate_retrieval_scores, and the most likely actions. The input's candidate_* lists are the
candidates.

Examples:
  phoenix-rank     # the artifacts' example user
  phoenix-rank --generate --candidates 512 --protocol grpc --check
  phoenix-rank --input user.json --url 10.0.0.5:8000
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Optional

import numpy as np

from clients import cli
from phoenix.client.client import ranker_inputs


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__, artifacts_from_server=True)
    cli.add_user_args(parser, candidates=True)
    parser.add_argument(
        "--rows", type=int, default=20, help="ranked rows to print (default: %(default)s)"
    )
    cli.add_check_arg(parser)
    return parser.parse_args(argv)


def check_ranking(args, client, arrays: dict, served: dict) -> int:
    expected = cli.reference_models(args, client, "ranker").run("ranker", arrays)
    problems = cli.compare_outputs(served, expected, id_names=("ranked_post_ids",))
    return cli.report_check(problems, "the served ranking")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(rank, parse_args(argv))


def rank(args) -> int:
    config, user = cli.request_user(args)
    title = f"{len(user['candidate_post_ids'])} candidates of user {user['user_id']}, ranked:"
    arrays = ranker_inputs(user)
    return cli.show_feed(
        args, "ranker", arrays, title, config.action_names, check_ranking,
        shown=lambda served: shown_result(arrays, served),
    )  # fmt: skip


def shown_result(
    arrays: Mapping[str, np.ndarray], served: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The ranker's answer as the table shows it: the ranker answers zeros for retrieval scores
    it was not sent, and a column of zeros would read as scores, so it goes."""
    if "candidate_retrieval_scores" in arrays:
        return dict(served)
    return {name: value for name, value in served.items() if name != "ranked_retrieval_scores"}


if __name__ == "__main__":
    sys.exit(main())
