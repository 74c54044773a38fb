"""Embed one user with the served `user_encoder`.

Send one user's history to the served `user_encoder` (the retrieval user tower) and print
the unit user embedding it returns.

Examples:
  phoenix-encode-user --check
  phoenix-encode-user --generate --history 0 --protocol grpc
  phoenix-encode-user --input user.json --save user.npy
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from clients import cli
from phoenix.client.client import user_inputs


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(__file__, __doc__, artifacts_from_server=True)
    cli.add_user_args(parser)
    parser.add_argument(
        "--save", type=Path, metavar="FILE.npy", help="also write the embedding [D] to FILE.npy"
    )
    cli.add_check_arg(parser)
    return parser.parse_args(argv)


def describe(vector: np.ndarray, shown: int = 8) -> str:
    head = ", ".join(f"{v:+.4f}" for v in vector[:shown])
    more = ", ..." if len(vector) > shown else ""
    return f"[{head}{more}]  (D = {len(vector)}, L2 norm {np.linalg.norm(vector):.6f})"


def check_embedding(args, client, arrays: dict, served: dict) -> int:
    expected = cli.reference_models(args, client, "user_encoder").run("user_encoder", arrays)
    return cli.report_check(cli.compare_outputs(served, expected), "the served user embedding")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(encode, parse_args(argv))


def encode(args) -> int:
    _, user = cli.request_user(args)
    arrays = user_inputs(user)
    client, served = cli.ask(args, "user_encoder", arrays)
    vector = served["user_embedding"][0]
    history = len(user["history_post_ids"])
    print(f"user {user['user_id']} ({history} history items):\n{describe(vector)}")
    if args.save:
        np.save(args.save, vector)
        print(f"wrote {args.save}")
    return cli.run_check(args, check_embedding, client, arrays, served)


if __name__ == "__main__":
    sys.exit(main())
