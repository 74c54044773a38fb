"""User-state events into the Redis store that recommend reads by user id.

One JSON object a line (engagements, follows, unfollows, posts and profiles; the fields are in
docs/user-state.md, "Events and the stream"):

  {"type": "engagement", "user_id": 7, "post_id": 91, "author_id": 3, "ts": 1767225600,
   "actions": ["favorite"], "surface": 0, "dwell_seconds": 12.5}
  {"type": "follow", "user_id": 7, "author_id": 3, "ts": 1767225600}
  {"type": "unfollow", "user_id": 7, "author_id": 3, "ts": 1767225700}
  {"type": "post", "post_id": 92, "author_id": 3, "ts": 1767225800}
  {"type": "profile", "user_id": 7, "ts": 1767225600, "country": 1, "timezone": 1,
   "installed_apps": [2, 17], "age_years": 29, "age_bracket": 3}

An engagement may also carry "timezone" (0..31), "hour_of_day" (1..24) and
"post_created_at" (Unix seconds), what X's production ranker reads; a profile gives the
user's whole profile (every field optional, 0 unknown; the newest by ts is kept).

Commands:
  apply    apply the events of FILE (or - for standard input) to the store, in batches of
           --batch-size events (one pipeline each); with --follow wait for more lines at the
           end of FILE, as tail -f, until SIGINT or SIGTERM. A batch goes as soon as it is
           full or the input is idle.
  publish  append the events to the stream `user-state:events`, for `consume` to apply.
  consume  apply the stream in the consumer group `user-state` until SIGINT or SIGTERM: each
           batch is acknowledged only after it was applied; a restart re-reads what was not.
  load-world
           give every user of a trained world (ARTIFACTS/training.json) state: their
           engagements before the held-out days, their follows and profile, shifted so
           that the newest engagement is now, and the authors' recent posts
           (docs/user-state.md, "The trained world's users").

The store: --redis URL, else $PHOENIX_USER_STATE_URL, else the store of the server running
from --serve-dir (phoenix-serve's --build-dir, build/serve), which its serving.json names; the
events are then checked against the artifacts that server serves unless --artifacts says
otherwise.

A post event puts the post into its author's recent posts (the in-network source); the
retrieval corpus is fed by `phoenix-ingest`, which reads posts in its own line form: a new
post goes to both commands (docs/user-state.md, "Events and the stream").

Only what serving takes is accepted. Each line is checked as the models check what it
becomes: ids within [0, 2**63 - 1] (post and author ids from 1), action names of the 19
columns, a surface among the product surfaces of --artifacts (the served artifacts), a finite
dwell time >= 0, profile values and a timezone and hour within X's ranges, and a time in Unix
seconds at most a day ahead of now (as phoenix-ingest
bounds posts: a time in milliseconds or microseconds is refused, saying so). A time a few
seconds ahead is accepted as it is and counts from then on (reads cover the window up to now).
A line that fails is refused with a warning "FILE:LINE: why; line refused" on standard error,
and the other lines are applied: the input, mended, can be sent again whole, since applying an
event twice changes nothing. The summary says how many were refused, and the exit status is 1.

Examples:
  phoenix-events apply events.jsonl   # into the store of `make serve`
  phoenix-events apply events.jsonl --redis redis://127.0.0.1:6379
  phoenix-events apply events.jsonl --artifacts artifacts/demo --redis redis://...
  tail -n0 -F events.jsonl | phoenix-events publish - --redis redis://redis:6379
  phoenix-events consume --redis redis://redis:6379 --consumer worker-1
  phoenix-events apply events.jsonl --redis redis+cluster://redis-cluster:6379
  phoenix-events load-world --artifacts artifacts/trained-demo --redis redis://...
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from clients import cli
from phoenix.checkpoint import ArtifactError, load_config
from phoenix.ops.serving_state import (
    DEFAULT_SERVE_DIR,
    SERVING_FILE,
    ServingStateError,
    read_serving_state,
)
from phoenix.schema.contracts import RANKER
from phoenix.schema.requests import value_bound
from phoenix.stub.services.user_state import USER_STATE_URL_ENV
from phoenix.user_state import UserStateError, UserStateStore, connect
from phoenix.user_state.client import url_argument
from phoenix.user_state.events import EventLimits
from phoenix.user_state.lines import (
    BATCH_SIZE,
    BatchError,
    LineCounts,
    apply_lines,
    publish_lines,
)
from phoenix.user_state.stream import StreamConsumer, StreamConsumerError

# The artifacts `make demo` serves with a store, shipped in the repository: they exist in every
# checkout, so the events' limits resolve without an option there; elsewhere --artifacts names
# the served ones (and a missing default fails naming the option).
DEFAULT_ARTIFACTS = Path("artifacts/trained-demo")
EXIT_REFUSED = 1
EXIT_CODES_HELP = (
    "Exit status: 0 every line applied (published), 1 some lines refused (each named FILE:LINE "
    "with the reason on standard error; every other line was applied: mend them and send the "
    "whole input again, nothing is applied twice), 2 bad arguments, 3 input, artifacts, store "
    "or stream error (batches sent before it stay sent; sending the same input again changes "
    "nothing twice; no store named and no running server found). consume exits 0 when stopped "
    "by SIGINT or SIGTERM; the entries it refused are logged with their entry ids and counted in "
    "its summary."
)
ARTIFACTS_HELP = (
    "the artifacts the server serves: an engagement's surface must be one of their product "
    "surfaces (config.json), as the models check it (default: those of the server found "
    f"through --serve-dir, else {DEFAULT_ARTIFACTS})"
)
REDIS_HELP = (
    "the user-state store: redis://host:port[/db] (one server) or redis+cluster://host:port "
    "(any node of a Redis Cluster); rediss:// and rediss+cluster:// with TLS (default: "
    f"${USER_STATE_URL_ENV}, else the store of the server running from --serve-dir)"
)


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.docstring_parser(__file__, __doc__, EXIT_CODES_HELP)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary,
                                  epilog=EXIT_CODES_HELP)  # fmt: skip
        sub.add_argument("--redis", metavar="URL", type=url_argument, help=REDIS_HELP)
        sub.add_argument("--serve-dir", type=Path, default=DEFAULT_SERVE_DIR, metavar="DIR",
                         help="phoenix-serve's --build-dir, whose serving.json names its store "
                         "(default: %(default)s)")  # fmt: skip
        sub.add_argument("--cluster", action="store_true",
                         help="a redis:// URL names a node of a Redis Cluster (as "
                         "redis+cluster:// does)")  # fmt: skip
        return sub

    def checked_command(name: str, summary: str) -> argparse.ArgumentParser:
        sub = command(name, summary)
        sub.add_argument("--artifacts", type=Path, metavar="DIR", help=ARTIFACTS_HELP)
        return sub

    for name, summary in (
        ("apply", "apply JSON-line events to the store"),
        ("publish", "append JSON-line events to the events stream"),
    ):
        sub = checked_command(name, summary)
        sub.add_argument("input", metavar="FILE", help="JSON lines file, or - for standard input")
        sub.add_argument("--batch-size", type=cli.positive_int, default=BATCH_SIZE, metavar="N",
                         help="events per pipeline (default: %(default)s)")  # fmt: skip
        follow = "at the end of FILE wait for more lines, as tail -f, until SIGINT or SIGTERM "
        follow += "(standard input is read until it ends either way)"
        sub.add_argument("--follow", action="store_true", help=follow)
    sub = checked_command(
        "consume", "apply the events stream in its consumer group until interrupted"
    )
    sub.add_argument("--consumer", default=f"{socket.gethostname()}-{os.getpid()}",
                     help="this consumer's name in the group; a restart under the same name "
                     "re-reads its unacknowledged entries first (default: host-pid)")  # fmt: skip
    sub = command("load-world", "give every user of a trained world state in the store")
    sub.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS,
                     help="trained artifact directory whose training.json names the world "
                     "(default: %(default)s)")  # fmt: skip
    sub.add_argument("--users", type=cli.positive_int, metavar="N",
                     help="load only the first N users of the world, the population Locust's by-id "
                     "mode draws from (default: all)")  # fmt: skip
    return parser.parse_args(argv)


def find_store(args) -> None:
    """``args.redis``: --redis, else $PHOENIX_USER_STATE_URL, else the store that serving.json in
    --serve-dir names (its server must be running); with that last, ``args.artifacts`` defaults
    to the served ones. Exits 3 saying what to give when none is found."""
    served_artifacts = None
    if not args.redis:
        if os.environ.get(USER_STATE_URL_ENV):
            try:
                args.redis = url_argument(os.environ[USER_STATE_URL_ENV])
            except argparse.ArgumentTypeError as error:
                raise cli.Exit(cli.fail(f"${USER_STATE_URL_ENV}: {error}")) from None
        else:
            args.redis, served_artifacts = served_store(args.serve_dir)
    if getattr(args, "artifacts", DEFAULT_ARTIFACTS) is None:
        args.artifacts = served_artifacts or DEFAULT_ARTIFACTS


def served_store(serve_dir: Path) -> tuple[str, Path | None]:
    """(URL, served artifacts) of the store of the server running from ``serve_dir``."""
    path = serve_dir / SERVING_FILE
    give = f"give --redis URL or set ${USER_STATE_URL_ENV}"
    try:
        state = read_serving_state(serve_dir)
    except ServingStateError as error:
        raise cli.Exit(cli.fail(f"no store named, and {error}; or {give}")) from None
    store = state.get("user_state") or {}
    if not store.get("url"):
        raise cli.Exit(cli.fail(f"{path} names no user-state store: {give}"))
    if store.get("password_left_out"):
        raise cli.Exit(cli.fail(
            f"the store of the server in {path}, {store['url']}, takes a password that the "
            f"file does not record: {give}"
        ))  # fmt: skip
    print(f"the store of the server in {path}: {store['url']}", file=sys.stderr)
    return store["url"], Path(state["artifacts"]) if state.get("artifacts") else None


def open_store(args) -> UserStateStore:
    try:
        store = UserStateStore(connect(args.redis, cluster=args.cluster))
        store.ping()
    except UserStateError as error:
        raise cli.Exit(cli.fail(str(error))) from None
    return store


def served_limits(artifacts: Path) -> EventLimits:
    """What the models serving ``artifacts`` take of an event: their largest product surface
    (the contract's "surfaces" bound, resolved as serving resolves it) and the largest finite
    dwell time of the dwell input's dtype (the contract's bound is infinity, and floats must be
    finite). Unreadable artifacts exit 3 naming them."""
    try:
        config = load_config(artifacts)
    except ArtifactError as error:
        raise cli.Exit(cli.fail(f"{error}; --artifacts names the served artifacts")) from None
    surface = RANKER.input("history_product_surface")
    dwell = RANKER.input("history_dwell_seconds")
    return EventLimits(
        max_surface=int(value_bound(surface.values.high, config)),
        max_dwell_seconds=min(
            float(value_bound(dwell.values.high, config)), float(np.finfo(dwell.dtype).max)
        ),
        served=str(artifacts),
    )


def send(args, stop: Optional[threading.Event] = None) -> int:
    """apply / publish: the lines of FILE to the store or the stream; exit 1 when a line was
    refused."""
    stream = cli.open_input(args.input)  # first: a mistyped name fails before connecting
    source = "<stdin>" if args.input == "-" else args.input
    stop = stop or threading.Event()
    try:
        find_store(args)
        limits = served_limits(args.artifacts)
        store = open_store(args)
        where = f"the store {store.name}" if args.command == "apply" else "the events stream"
        with cli.stop_on_signals(stop), tqdm(unit=" lines", desc=args.command, disable=None) as bar:
            # the store's commands, or the stream's client: (UserStateStore | Client) -> counts
            run: Callable[..., LineCounts] = (
                apply_lines if args.command == "apply" else publish_lines
            )
            target = store if args.command == "apply" else store.client
            follow = args.follow and stream is not sys.stdin.buffer
            counts = run(target, stream, source, limits=limits, follow=follow, stop=stop,
                         batch_size=args.batch_size, on_line=bar.update)  # fmt: skip
    except BatchError as error:
        return cli.fail(str(error))
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
    print(counts.summary(where))
    return EXIT_REFUSED if counts.refused else cli.EXIT_OK


def consume(args, stop: Optional[threading.Event] = None) -> int:
    """consume: the stream applied until interrupted; exit 3 naming a failed batch."""
    find_store(args)
    limits = served_limits(args.artifacts)
    store = open_store(args)
    consumer = StreamConsumer(store.client, store, consumer=args.consumer, limits=limits)
    stop = stop or threading.Event()
    print(f"consuming {consumer.stream!r} as {args.consumer!r} in group {consumer.group!r} "
          f"into {store.name} (SIGINT or SIGTERM stops)", flush=True)  # fmt: skip
    try:
        with cli.stop_on_signals(stop):
            counts = consumer.run(stop)
    except StreamConsumerError as error:
        counts = consumer.counts
        print(f"{counts.applied} events applied in {counts.batches} batches before it, "
              f"{counts.skipped} entries refused", file=sys.stderr)  # fmt: skip
        return cli.fail(str(error))
    print(f"{counts.applied} events applied in {counts.batches} batches, "
          f"{counts.skipped} entries refused")  # fmt: skip
    return cli.EXIT_OK


def load_world(args) -> int:
    """load-world: every user of the trained world (or the N most active) into the store."""
    from phoenix.world.users import WorldUsers, load_users

    find_store(args)
    store = open_store(args)
    try:
        world = WorldUsers.from_artifacts(args.artifacts)
        users = world.population(args.users)
        loaded = load_users(store, world, users, progress=True)
    except (ArtifactError, UserStateError) as error:
        return cli.fail(str(error))
    print(loaded.summary(store.name))
    return cli.EXIT_OK


COMMANDS = {"apply": send, "publish": send, "consume": consume, "load-world": load_world}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(format="warning: %(message)s", level=logging.WARNING)
    return cli.run(COMMANDS[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
