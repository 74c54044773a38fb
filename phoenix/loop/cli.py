"""``python -m phoenix.loop`` (``make loop``): the options and the exit status.

Exit 0: the loop ran as designed and its report is written, whatever v2's verdicts (a gate
refusal and an online loss are outcomes, stated in the report); 1: a step broke (the message
names it and its log); 2: bad options.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from phoenix.loop.options import LoopError, LoopOptions

EXIT_DONE, EXIT_STEP_BROKE, EXIT_BAD_OPTIONS = 0, 1, 2
EXIT_STATUS_HELP = (
    "Exit status: 0 when the loop ran as designed and wrote its report, whatever v2's "
    "verdicts (a v2 refused by its gate is not rolled out, and the report says so); 1 when a "
    "step broke (the message names it); 2 on bad options."
)


def add_arguments(parser) -> None:
    """The loop's options on ``parser`` (defaults from LoopOptions)."""
    d = LoopOptions()
    add = parser.add_argument

    def add_defaulted(flag: str, kind: type, text: str) -> None:
        """``flag`` defaulting to LoopOptions' field of the same name, which its help shows."""
        default = getattr(d, flag.removeprefix("--").replace("-", "_"))
        add(flag, type=kind, default=default, help=f"{text} (default: %(default)s)")

    add_defaulted("--minutes", float, "reacting users on v1, then on v2")
    add_defaulted("--users", int, "reacting Locust users, each a world user")
    add_defaulted("--out", Path, "report folder: loop.json, loop.png, loop.md, online-metrics.*")
    add_defaulted("--work", Path, "artifacts v1 and v2, logs, server and Locust logs")
    add(
        "--preset",
        choices=("tiny", "demo"),
        default=d.preset,
        help="training preset of v1 (default: %(default)s)",
    )
    add_defaulted("--seed", int, "training seed")
    add_defaulted(
        "--v1-retrieval-steps", int, "v1's retrieval steps: few, so v1 has room to improve"
    )
    add_defaulted("--v1-ranker-steps", int, "v1's ranker steps")
    add(
        "--v2-retrieval-steps",
        type=int,
        default=None,
        help="v2's retrieval steps on the served logs (default: a quarter of the preset's)",
    )
    add(
        "--v2-ranker-steps",
        type=int,
        default=None,
        help="v2's ranker steps (default: a quarter of the preset's)",
    )
    add_defaulted("--world-seed", int, "seed of the simulated users and their reactions")
    add_defaulted("--history-keep", int, "engagements per simulated user loaded into the store")
    add_defaulted("--top-n", int, "posts a user views")
    add_defaulted("--top-k", int, "posts a feed asks for")
    add_defaulted(
        "--shadow-seconds", float, "v2 shadow-scores the users' requests this long; 0: no shadow"
    )
    add_defaulted("--settle-seconds", float, "reacting users before and after the rollout")
    add("--force", action="store_true", help="roll v2 out even when its offline gate failed")


def options_from_args(args) -> LoopOptions:
    fields = {f.name for f in dataclasses.fields(LoopOptions)}
    return LoopOptions(**{k: v for k, v in vars(args).items() if k in fields})


def broken_step_errors() -> tuple[type[Exception], ...]:
    """The errors by which a step says it broke (each names what and where)."""
    from phoenix.checkpoint import ArtifactError
    from phoenix.ops.compile import CompileError
    from phoenix.training.retrain import RetrainError
    from phoenix.training.served_export import ExportError
    from phoenix.world.logs import LogError

    return LoopError, RetrainError, ExportError, ArtifactError, CompileError, LogError


def main_from_args(args, run=None) -> int:
    """Run the loop (``run``: ``run_loop``, replaceable in tests); the exit status of the
    module's doc."""
    try:
        options = options_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    if run is None:
        from phoenix.loop.run import run_loop as run
    try:
        report = run(options)
    except broken_step_errors() as error:
        print(f"error: the loop broke: {error}", file=sys.stderr)
        return EXIT_STEP_BROKE
    print(report["outcome"]["headline"], flush=True)
    return EXIT_DONE


DESCRIPTION = (
    "Train a version 1 with room to improve (few steps), serve it with a redis-server, run "
    "reacting Locust users (world users) on it for --minutes, export the served logs, train "
    "version 2 warm from v1 with the offline gate, roll v2 out while reacting users keep "
    "running (shadow, switch, unload; their failed requests counted) unless its gate failed, "
    "run the users on v2 (or on v1 again, when v2 was not rolled out) for --minutes, and "
    "report the two phases with 95% per-user bootstrap intervals: OUT/loop.json, loop.png, "
    "loop.md (printed) and the online metrics over time. Progress lines carry the time. "
    "Everything it starts dies with it (docs/loop.md)."
)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m phoenix.loop", description=DESCRIPTION, epilog=EXIT_STATUS_HELP
    )
    add_arguments(parser)
    return main_from_args(parser.parse_args(argv))
