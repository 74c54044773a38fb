"""Show or change the feed policy's parameters on a running server (a reload).

Without --set or --weight, prints the parameters the server's feed_policy model runs with. With
them, checks the new values here first (the same check the model runs at start-up, against the
artifacts' action names), then sends a model load request carrying the current config with
those parameters changed: Triton starts the new feed_policy, keeps answering with the old one
until it is ready, then switches; recommend's chain is loaded again the same way with the same
change, so recommend follows. A value the model refuses fails the load and the old parameters
keep serving. The load API needs the admin key (see
SECURITY.md) and a server with explicit model control (`make serve`, not --no-supervisor).

A change made this way lasts until the server restarts; to change a default for good, edit
POLICY_PARAMETERS in phoenix/schema/contracts.py and run `make configs` (docs/policy.md).

Examples:
  phoenix-feed-policy            # show the parameters
  phoenix-feed-policy --set author_diversity_decay=0.7 --set author_diversity_floor=0.2
  phoenix-feed-policy --weight report=-200 --weight reply=20
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Optional

from clients import cli
from phoenix.checkpoint import ArtifactError, load_config
from phoenix.client.inprocess import server_parameters
from phoenix.ops.admin_key import ADMIN_KEY_ENV, find_admin_key
from phoenix.ops.reload import reload_with_chains
from phoenix.schema.contracts import FEED_POLICY, POLICY_PARAMETERS
from phoenix.stub.services.feed_policy import parse_settings

MODEL = FEED_POLICY.name
POLICY_PARAMETER_NAMES = sorted(p.name for p in POLICY_PARAMETERS)
RELOAD_TIMEOUT_S = 120.0


def key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(
        __file__, __doc__, "artifact directory: its action names (default: the one the server "
        "says it serves; refused when the server serves others)", artifacts_from_server=True,
    )  # fmt: skip
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=key_value,
        metavar="KEY=VALUE",
        help=f"a policy parameter to change, one of {POLICY_PARAMETER_NAMES} (repeatable)",
    )
    parser.add_argument(
        "--weight",
        action="append",
        default=[],
        type=key_value,
        metavar="ACTION=WEIGHT",
        help="one action's weight in action_weights, the others kept (repeatable)",
    )
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        metavar="NAME",
        help="environment variable with the server's admin key (default: %(default)s)",
    )
    parser.add_argument("--admin-key-file", help="file with the admin key")
    return parser.parse_args(argv)


def changed_parameters(
    current: Mapping[str, str], sets: Sequence[tuple[str, str]], weights: Sequence[tuple[str, str]]
) -> dict[str, str]:
    """The parameters with ``sets`` applied and ``weights`` merged into action_weights."""
    unknown = sorted({key for key, _ in sets} - set(POLICY_PARAMETER_NAMES))
    if unknown:
        raise ValueError(f"unknown policy parameters {unknown}; known: {POLICY_PARAMETER_NAMES}")
    new = {**current, **dict(sets)}
    if weights:
        table = json.loads(new["action_weights"])
        for action, weight in weights:
            try:
                table[action] = float(weight)
            except ValueError:
                raise ValueError(f"the weight of {action!r} must be a number: {weight!r}") from None
        new["action_weights"] = json.dumps(table)
    return new


def show(parameters: Mapping[str, str]) -> None:
    for key in POLICY_PARAMETER_NAMES:
        value = parameters.get(key, "(missing)")
        if key == "action_weights":
            weights = json.loads(value)
            value = ", ".join(f"{name} {weight:g}" for name, weight in weights.items())
        print(f"  {key:<24} {value}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(show_or_reload, parse_args(argv))


def show_or_reload(args) -> int:
    timeout = {"network_timeout": RELOAD_TIMEOUT_S} if args.protocol == "http" else {}
    try:
        client = cli.open_client(args, **timeout)
        current = server_parameters(client, args.protocol, MODEL)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        return cli.no_answer(args, MODEL, error)
    if not args.set and not args.weight:
        print(f"{MODEL} parameters at {cli.server_url(args)}:")
        show(current)
        return cli.EXIT_OK
    try:
        new = changed_parameters(current, args.set, args.weight)
        action_names = load_config(cli.artifacts(args)).action_names
        parse_settings(new, action_names)  # refuse before sending
    except (ValueError, ArtifactError) as error:
        return cli.fail(f"not reloaded: {error}")
    try:
        key = find_admin_key(args.admin_key_env, args.admin_key_file)
        reloaded = reload_with_chains(client, args.protocol, MODEL, new, key)
    except Exception as error:
        return cli.fail(f"reloading {MODEL} failed: {error}")
    print(f"{' and '.join(reloaded)} reloaded; {MODEL} parameters now:")
    show(new)
    return cli.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
