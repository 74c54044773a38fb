"""Roll a running server onto a new artifact directory (version N+1), or back.

Loads N+1's models beside N's, optionally shadows them (both versions answer the same
requests; rank agreement and score deltas go to the report), switches `recommend` and the
models users call by name to N+1, drains and unloads N. The server must run with
--model-control-mode=explicit (phoenix-serve does). The model repository folder it serves and
its admin key are found in the state phoenix-serve keeps in its build folder (--serve-dir,
build/serve), which must describe the server at --url; --repository and the admin key
($PHOENIX_ADMIN_KEY, --admin-key-file) name them for a server started otherwise.
docs/rollout.md says what happens step by step.

A NEW_DIR/gate.json saying "passed": false refuses the rollout unless --force, and so does a
NEW_DIR whose version label is the served one's (a copy of the served artifacts, or the same
"version" in config.json).

Examples:
  phoenix-rollout artifacts/v2 --shadow-seconds 30
  phoenix-rollout artifacts/v2 --url 127.0.0.1:8001 --protocol grpc
  phoenix-rollout --rollback
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tritonclient.utils import InferenceServerException

from clients import cli
from clients.workload import random_users
from phoenix.checkpoint import ArtifactError
from phoenix.client.client import recommend_inputs
from phoenix.ops import model_control, rollout
from phoenix.ops.admin_key import ADMIN_KEY_ENV, AdminKeyError, find_admin_key
from phoenix.ops.serving_state import (
    DEFAULT_SERVE_DIR,
    ServingStateError,
    read_serving_state,
    update_serving_state,
)

DEFAULT_REPORT = Path("build/rollout/last-rollout.json")
EXIT_REFUSED, EXIT_PART_WAY = 3, 4
EXIT_CODES = (
    "Exit status: 0 rolled out (or back), 2 bad arguments, 3 refused or failed with the server "
    "serving what it served (a failed gate, the served version label, a corpus the new version "
    "lacks, a load that failed, no server), 4 stopped part way through the switch (the server "
    "may serve both versions: roll out again, or --rollback)."
)
LOAD_TIMEOUT_S = 600.0  # a load compiles when the artifacts have no programs for this machine


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.docstring_parser(__file__, __doc__, EXIT_CODES)
    add = parser.add_argument
    add("new_dir", nargs="?", type=Path, metavar="NEW_DIR", help="the artifacts of version N+1")
    add("--url", help="server address host:port (default: 127.0.0.1:8000 for http, :8001 grpc)")
    add("--protocol", choices=("http", "grpc"), default="http", help="(default: %(default)s)")
    add(
        "--repository",
        type=Path,
        help="the server's model repository folder (default: its state's)",
    )
    serve_dir = "phoenix-serve's --build-dir, where it keeps its state (default: %(default)s)"
    add("--serve-dir", type=Path, default=DEFAULT_SERVE_DIR, metavar="DIR", help=serve_dir)
    add("--rollback", action="store_true", help="return to what --report says was served before")
    force = "roll out even when gate.json says it failed or NEW_DIR has the served version label"
    add("--force", action="store_true", help=force)
    shadow = "seconds N and N+1 answer the same requests before the switch (0: no shadow)"
    add("--shadow-seconds", type=float, default=0.0, metavar="S", help=shadow)
    add("--shadow-users", type=int, default=16, metavar="N", help="random users shadowed (16)")
    add("--seed", type=int, default=0, help="seed of the shadow users (default: %(default)s)")
    report = "the rollout's JSON report (read by --rollback); (default: %(default)s)"
    add("--report", type=Path, default=DEFAULT_REPORT, help=report)
    add("--admin-key-env", default=ADMIN_KEY_ENV, metavar="NAME", help="admin key variable")
    add("--admin-key-file", metavar="FILE", help="file with the admin key (default: its state's)")
    return parser.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if not args.rollback and args.new_dir is None:
        cli.fail("give NEW_DIR (the artifacts to roll out) or --rollback")
        return 2
    try:
        return run_rollout(args)
    except rollout.RolloutError as error:
        cli.fail(str(error))
        return EXIT_PART_WAY if error.changed else EXIT_REFUSED
    except (ArtifactError, ServingStateError, AdminKeyError, InferenceServerException) as error:
        cli.fail(str(error))  # a server that does not answer, or refuses the admin key
        return EXIT_REFUSED


def served_by(args) -> tuple[Path, str | None]:
    """(model repository, admin key) of the server at --url: given, else from its state."""
    state = {}
    if args.repository is None or (
        args.admin_key_file is None and not os.environ.get(args.admin_key_env)
    ):
        try:
            state = read_serving_state(args.serve_dir, cli.server_url(args))
        except ServingStateError:
            if args.repository is None:
                raise
    repository = args.repository or Path(state["repository"])
    key = find_admin_key(args.admin_key_env, args.admin_key_file or state.get("admin_key_file"))
    return repository, key


def run_rollout(args) -> int:
    client = cli.open_client(
        args, **({"network_timeout": LOAD_TIMEOUT_S} if args.protocol == "http" else {})
    )
    repository, key = served_by(args)
    server = model_control.Server(client, args.protocol, key, repository)
    if args.rollback:
        report = read_report(args.report)
        plan = rollout.rollback_plan(server, report)
        requests = []
    else:
        gate = rollout.check_gate(args.new_dir, args.force, rollout.say_to_stderr)
        plan = rollout.forward_plan(server, args.new_dir, args.force)
        users = (
            random_users(args.new_dir, args.shadow_users, args.seed) if args.shadow_seconds else []
        )
        requests = [recommend_inputs(user) for user in users]
    target = (
        args.report.with_name(args.report.stem + "-rollback.json") if args.rollback else args.report
    )
    # written first, so that a rollout that fails part way can be rolled back
    started = {"state": "started", "previous_configs": plan.previous}
    rollout.write_report({**started, **rollout.plan_summary(plan)}, target)
    result = rollout.roll(server, plan, requests, args.shadow_seconds)
    if not args.rollback:
        result["gate"] = gate
    rollout.write_report({"state": "done", **result}, target)
    record_served_version(args, result["target"])
    print(f"rolled to {result['target']}; report: {target}", file=sys.stderr)
    return 0


def record_served_version(args, served: dict[str, str]) -> None:
    """The server's state file (serving.json) names the artifacts and version now served, when
    the server at --url is the one it describes (a server started otherwise has none)."""
    if not served.get("artifact_dir"):
        return
    try:
        state = read_serving_state(args.serve_dir, cli.server_url(args))
    except ServingStateError:
        return
    changes = {"artifacts": served["artifact_dir"], "artifact_version": served.get("version")}
    update_serving_state(args.serve_dir, state["pid"], changes)


def read_report(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise rollout.RolloutError(f"{path}: no rollout report to roll back ({error})") from None


if __name__ == "__main__":
    raise SystemExit(main())
