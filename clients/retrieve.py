"""Retrieve corpus posts for one user: `python -m clients.retrieve --help`.

Two served models: `user_encoder` embeds the user, `retriever` returns the exact top_k corpus
posts by dot product, leaving out the posts of the user's history.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

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
from phoenix.serving.client import infer, user_inputs

RETRIEVED_IDS = ("post_ids", "author_ids")


def parse_args(argv: Optional[Sequence[str]]):
    parser = build_parser(
        "python -m clients.retrieve",
        "Embed one user with the served `user_encoder`, then ask the served `retriever` for the "
        "top_k corpus posts (history excluded) and print rank, post id, author id and score. "
        "--check uses the corpus file the server's retriever reports (parameter corpus_file).",
        [
            "python -m clients.retrieve --top-k 20",
            "python -m clients.retrieve --generate --seed 7 --protocol grpc --check",
        ],
    )
    add_user_args(parser)
    parser.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="posts to retrieve (default: the input's top_k; random 10..200 with --generate)",
    )
    parser.add_argument("--rows", type=int, default=20, help="rows to print (default: %(default)s)")
    add_check_arg(parser)
    return parser.parse_args(argv)


def retriever_inputs(embedding: np.ndarray, top_k: int, history_post_ids: np.ndarray) -> dict:
    return {
        "user_embedding": np.asarray(embedding, np.float32),
        "top_k": np.array([[top_k]], np.int32),
        "history_post_ids": np.asarray(history_post_ids, np.int64),
    }


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
    models = InProcessModels(args.artifacts)
    encoder = server_parameters(client, args.protocol, "user_encoder")
    expected_user = models.run("user_encoder", encoder, users)
    problems = compare_outputs({"user_embedding": embedding}, expected_user)
    retriever = server_parameters(client, args.protocol, "retriever")
    arrays = retriever_inputs(embedding, top_k, users["history_post_ids"])
    expected = models.run("retriever", retriever, arrays)
    problems += compare_outputs(served, expected, id_names=RETRIEVED_IDS)
    corpus = retriever.get("corpus_file", "corpus.npz")
    return report_check(problems, f"the served retrieval (corpus {corpus})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    try:
        user = load_user(args, load_config(args.artifacts))
    except ArtifactError as error:
        return fail(str(error))
    top_k = int(args.top_k or user["top_k"])
    users = user_inputs(user)
    try:
        client = open_client(args)
        embedding = infer(client, args.protocol, "user_encoder", users)["user_embedding"]
        arrays = retriever_inputs(embedding, top_k, users["history_post_ids"])
        served = infer(client, args.protocol, "retriever", arrays)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        return fail(f"user_encoder/retriever at {server_url(args)} ({args.protocol}): {error}")
    history = len(user["history_post_ids"])
    print(f"Top {top_k} for user {user['user_id']} ({history} history items excluded):\n")
    print(retrieved_table(served, args.rows))
    if not args.check:
        return 0
    try:
        return check_retrieval(args, client, users, top_k, embedding, served)
    except Exception as error:
        print(f"error: --check could not compute the reference: {error}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
