"""Retrieve corpus posts for one user.

Two served models: `user_encoder` embeds the user, then `retriever` returns the exact top_k
corpus posts by dot product, leaving out the posts of the user's history. This prints rank,
post id, author id and score. --check uses the corpus file the server's retriever reports
(parameter corpus_file).

Examples:
  phoenix-retrieve --top-k 20
  phoenix-retrieve --generate --seed 7 --protocol grpc --check
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

import numpy as np

from clients import cli
from phoenix.client.client import input_row, user_inputs
from phoenix.schema.contracts import RETRIEVER
from phoenix.schema.wiring import next_step_inputs, passed_on_history

RETRIEVED_IDS = ("post_ids", "author_ids")


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__, artifacts_from_server=True)
    cli.add_user_args(parser)
    cli.add_top_k_and_rows(parser, "retrieve")
    cli.add_check_arg(parser)
    return parser.parse_args(argv)


def retriever_inputs(users: dict, top_k: int, embedding: np.ndarray) -> dict:
    """The retriever's request after the user_encoder's answer, as the ensemble wires it."""
    request = {**users, "top_k": input_row(RETRIEVER.input("top_k"), top_k)}
    done = {
        "user_state": passed_on_history(request),  # the history, passed on as the server does
        "user_encoder": {"user_embedding": embedding},
    }
    return next_step_inputs(request, done, "retriever")


def retrieved_table(result: dict, rows: int) -> str:
    posts, authors = result["post_ids"][0], result["author_ids"][0]
    scores = result["retrieval_scores"][0]
    lines = [f"{'rank':>4}  {'post id':>20}  {'author id':>20}  {'score':>8}"]
    for i in range(min(rows, len(posts))):
        lines.append(f"{i + 1:>4}  {posts[i]:>20}  {authors[i]:>20}  {scores[i]:>8.4f}")
    if len(posts) > rows:
        lines.append(f"... {len(posts) - rows} more")
    return "\n".join(lines)


def check_retrieval(args, client, users: dict, top_k: int, embedding, served: dict) -> int:
    """The user tower and, on the server's own user vector, the retriever (isolates each)."""
    models = cli.reference_models(args, client, "user_encoder", "retriever")
    expected_user = models.run("user_encoder", users)
    problems = cli.compare_outputs({"user_embedding": embedding}, expected_user)
    expected = models.run("retriever", retriever_inputs(users, top_k, embedding))
    problems += cli.compare_outputs(served, expected, id_names=RETRIEVED_IDS)
    corpus = models.params["retriever"].get("corpus_file", "corpus.npz")
    return cli.report_check(problems, f"the served retrieval (corpus {corpus})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(retrieve, parse_args(argv))


def retrieve(args) -> int:
    _, user = cli.request_user(args)
    top_k = int(args.top_k or user["top_k"])
    users = user_inputs(user)
    client, encoded = cli.ask(args, "user_encoder", users)
    embedding = encoded["user_embedding"]
    _, served = cli.ask(args, "retriever", retriever_inputs(users, top_k, embedding), client)
    history = len(user["history_post_ids"])
    print(f"Top {top_k} for user {user['user_id']} ({history} history items excluded):\n")
    print(retrieved_table(served, args.rows))
    return cli.run_check(args, check_retrieval, client, users, top_k, embedding, served)


if __name__ == "__main__":
    sys.exit(main())
