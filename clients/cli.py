"""What the command-line clients share: arguments, the request's user, --check verdicts.

Every client takes ``--url``/``--protocol``, reads one user in the ``example_sequence.json``
format (``--input FILE``, default: the artifact directory's example) or generates one
(``--generate --seed N``), and with ``--check`` compares the server's answer with the same
service run in this process (``phoenix.client.inprocess``; float32, ``TOLERANCE``; ids must
be equal).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Optional

import numpy as np

from clients.workload import CorpusIds, random_sequence, read_sequence, with_action_width
from phoenix.checkpoint import ArtifactError, load_config
from phoenix.checkpoint.identity import ArtifactMismatch
from phoenix.client.client import connect, feed_table, infer
from phoenix.client.inprocess import InProcessModels
from phoenix.client.served_artifacts import ServedArtifacts, choose_artifacts, served_artifacts
from phoenix.config import ArtifactConfig
from phoenix.util.command_line import command_name, command_parser

DEFAULT_ARTIFACTS = Path("artifacts/demo")
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
TOLERANCE = 1e-4
MAX_DIFF_ROWS = 8

EXIT_OK, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 3
EXIT_CODES_HELP = (
    "Exit status: 0 ok, 1 --check found a mismatch, 2 bad arguments, 3 server or input error."
)

# ----------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------


ARTIFACTS_HELP = (
    "artifact directory the server serves: the default input, the corpus ids for --generate "
    "and the weights for --check (default: %(default)s)"
)
SERVED_ARTIFACTS_HELP = (
    "artifact directory: the default input, the corpus ids for --generate and the weights for "
    "--check (default: the one the server says it serves; refused when the server serves "
    f"others; a server that does not say: {DEFAULT_ARTIFACTS})"
)


def wrap_paragraphs(text: str, width: int = 79) -> str:
    """Wrap each blank-line separated paragraph; lines starting with spaces stay as they are."""
    paragraphs = []
    for paragraph in text.split("\n\n"):
        lines = paragraph.splitlines()
        if any(line.startswith(" ") for line in lines):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(textwrap.fill(" ".join(lines), width, break_on_hyphens=False))
    return "\n\n".join(paragraphs)


def docstring_parser(
    client_file: str, doc: str, exit_codes: str = EXIT_CODES_HELP
) -> argparse.ArgumentParser:
    """A parser for the client module at ``client_file`` (its ``__file__``: a script run by
    path has no module name), its help from the module docstring ``doc`` (an ``Examples:``
    section, if any, printed last, then ``exit_codes``)."""
    about, _, examples = doc.partition("\nExamples:\n")
    epilog = f"Examples:\n{examples.rstrip()}\n\n" if examples else ""
    prog = command_name(f"clients.{Path(client_file).stem}")
    return command_parser(prog, wrap_paragraphs(about.strip()), epilog + exit_codes)


def build_parser(
    client_file: str,
    doc: str,
    artifacts_help: Optional[str] = None,
    exit_codes: str = EXIT_CODES_HELP,
    artifacts_from_server: bool = False,
) -> argparse.ArgumentParser:
    """``docstring_parser`` with the server arguments every client takes. With
    ``artifacts_from_server`` --artifacts defaults to the server's (``artifacts``), else to
    ``DEFAULT_ARTIFACTS``."""
    parser = docstring_parser(client_file, doc, exit_codes)
    default = None if artifacts_from_server else DEFAULT_ARTIFACTS
    if artifacts_help is None:
        artifacts_help = SERVED_ARTIFACTS_HELP if artifacts_from_server else ARTIFACTS_HELP
    parser.add_argument(
        "--url",
        help="server address host:port (default: 127.0.0.1:8000 for http, :8001 for grpc)",
    )
    parser.add_argument(
        "--protocol",
        choices=("http", "grpc"),
        default="http",
        help="KServe v2 protocol to talk (default: %(default)s)",
    )
    parser.add_argument("--artifacts", type=Path, default=default, help=artifacts_help)
    return parser


def add_user_args(parser: argparse.ArgumentParser, candidates: bool = False) -> None:
    """--input / --generate and friends: where the request's user comes from."""
    source = parser.add_mutually_exclusive_group()
    given = "one user as JSON in the example_sequence.json format "
    given += "(default: ARTIFACTS/example_sequence.json)"
    source.add_argument("--input", type=Path, metavar="FILE", help=given)
    random_user = "generate a random user (ids drawn from the artifact corpus) instead"
    source.add_argument("--generate", action="store_true", help=random_user)
    add = parser.add_argument
    add("--seed", type=int, default=0, help="seed for --generate (default: %(default)s)")
    length = "history length for --generate (default: random in 0..history_seq_len)"
    add("--history", type=int, metavar="N", help=length)
    if candidates:
        count = "candidate count for --generate (default: random in 1..512)"
        add("--candidates", type=int, metavar="N", help=count)


def add_top_k_and_rows(parser: argparse.ArgumentParser, what: str) -> None:
    """--top-k (posts to `what`) and --rows, as recommend and retrieve take them."""
    top_k = f"posts to {what} (default: the input's top_k; random 10..200 with --generate)"
    parser.add_argument("--top-k", type=int, metavar="K", help=top_k)
    parser.add_argument("--rows", type=int, default=20, help="rows to print (default: %(default)s)")


def add_store_arg(
    parser, required: bool = True, help: str = "the corpus store directory (a path)"
) -> None:
    """--store DIR: a corpus store directory, one kind of value in every command."""
    parser.add_argument("--store", type=Path, required=required, metavar="DIR", help=help)


def add_check_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"also compute the answer in this process with the phoenix services and exit 1 "
        f"on a mismatch (floats within {TOLERANCE:g}, ids equal); needs the server's --artifacts",
    )


DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> Optional[int]:
    """Seconds of ``48h``, ``30m``, ``3600s``, ``2d`` or a bare ``3600``; ``none`` is None (no
    window). An argparse type: a bad value exits 2 with this message."""
    if text.strip().lower() == "none":
        return None
    found = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text.lower())
    seconds = int(found[1]) * DURATION_UNITS[found[2] or "s"] if found else 0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration: expected a positive count of seconds with a unit "
            "s, m, h or d (48h, 30m, 3600s, 2d) or 'none'"
        )
    return seconds


def format_duration(seconds: Optional[int]) -> str:
    """``parse_duration``'s inverse, in the largest unit that divides ``seconds``."""
    if seconds is None:
        return "none"
    for unit, size in sorted(DURATION_UNITS.items(), key=lambda item: -item[1]):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)  # also takes 10_000_000
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number > 0")
    return value


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[threading.Event]:
    """The first SIGINT or SIGTERM sets ``stop`` (the command finishes what it holds, then
    exits) instead of killing; a second one acts as it would have (stops at once). Only the
    main thread can take signals: elsewhere (tests) ``stop`` is set by the caller."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    numbers = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.getsignal(number) for number in numbers}

    def first_signal(number, frame):
        stop.set()
        for other, handler in previous.items():
            signal.signal(other, handler)

    for number in numbers:
        signal.signal(number, first_signal)
    try:
        yield stop
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def server_url(args: argparse.Namespace) -> str:
    return args.url or f"127.0.0.1:{DEFAULT_PORTS[args.protocol]}"


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


class Exit(Exception):
    """Ends a client early with an exit status (the reason is already printed)."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def open_input(name: str) -> BinaryIO:
    """The file ``name`` to read as bytes (``-``: stdin); one that cannot be read exits 3."""
    if name == "-":
        return sys.stdin.buffer
    try:
        return open(name, "rb")
    except OSError as error:
        raise Exit(fail(f"{name}: cannot be read ({error.strerror})")) from None


def run(body: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """``body(args)``'s exit status, or the status it exited early with."""
    try:
        return body(args)
    except Exit as early:
        return early.status


def ask(args: argparse.Namespace, model: str, arrays: Mapping[str, np.ndarray], client=None):
    """(client, outputs) of one inference (a new client unless given); no answer exits 3."""
    try:
        client = client or open_client(args)
        return client, infer(client, args.protocol, model, arrays)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise Exit(no_answer(args, model, error)) from None


def show_feed(
    args: argparse.Namespace,
    model: str,
    arrays: Mapping[str, np.ndarray],
    title: str,
    action_names: Sequence[str],
    check: Callable[..., int],
    shown: Optional[Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]] = None,
) -> int:
    """Ask ``model``, print ``title`` over its ranked feed (``shown(answer)`` where given:
    what of the answer the table shows), then ``check`` the whole answer with --check."""
    client, served = ask(args, model, arrays)
    print(title + "\n")
    print(feed_table(shown(served) if shown else served, action_names, rows=args.rows))
    return run_check(args, check, client, arrays, served)


def no_answer(args: argparse.Namespace, what: str, error: Exception) -> int:
    return fail(f"{what} at {server_url(args)} ({args.protocol}): {error}")


# ----------------------------------------------------------------------------------------
# The request's user: from a file or generated
# ----------------------------------------------------------------------------------------


def artifacts(args: argparse.Namespace) -> Path:
    """The artifact directory of this run, set into ``args.artifacts`` on the first call: the
    server's without --artifacts; --artifacts unless the server serves others (then exits 3
    naming both). A server that does not answer leaves --artifacts unchecked (the request
    will say it has no answer)."""
    if not getattr(args, "artifacts_checked", False):
        try:
            served = served_artifacts(open_client(args), args.protocol)
        except Exception as error:  # tritonclient raises several types; all mean "no answer"
            if args.artifacts is None:
                raise Exit(no_answer(args, "the served artifacts", error)) from None
            served = ServedArtifacts("", "")
        try:
            args.artifacts = choose_artifacts(args.artifacts, served, DEFAULT_ARTIFACTS)
        except (ArtifactMismatch, ArtifactError) as error:
            raise Exit(fail(f"{error}; leave out --artifacts to use the served ones")) from None
        args.artifacts_checked = True
    return args.artifacts


def request_user(args: argparse.Namespace) -> tuple[ArtifactConfig, dict[str, Any]]:
    """The artifact config and the request's user; an unreadable one exits 3."""
    try:
        config = load_config(artifacts(args))
        return config, load_user(args, config)
    except ArtifactError as error:
        raise Exit(fail(str(error))) from None


def load_user(args: argparse.Namespace, config: ArtifactConfig) -> dict[str, Any]:
    """The request's user as the arguments ask: --input FILE, --generate, or the example.

    history_actions comes back as an [L, A] array (see ``with_action_width``).
    """
    if getattr(args, "generate", False):
        rng = np.random.default_rng(args.seed)
        user = random_sequence(
            rng,
            config,
            CorpusIds.load(args.artifacts, config),
            history_len=args.history,
            num_candidates=getattr(args, "candidates", None),
            top_k=getattr(args, "top_k", None),
        )
    else:
        user = read_sequence(args.input or Path(args.artifacts) / "example_sequence.json", config)
    return with_action_width(user, config.num_actions)


def open_client(args: argparse.Namespace, **kwargs):
    """A tritonclient InferenceServerClient for --url/--protocol (kwargs go to its constructor)."""
    return connect(server_url(args), args.protocol, **kwargs)


def reference_models(args: argparse.Namespace, client, *models: str) -> InProcessModels:
    """The models' services in this process, with the parameters the server reports."""
    return InProcessModels.like_server(client, args.protocol, artifacts(args), models)


# ----------------------------------------------------------------------------------------
# Comparing answers
# ----------------------------------------------------------------------------------------


def _shape_problem(name: str, served: np.ndarray, expected: np.ndarray) -> Optional[str]:
    if served.shape != expected.shape:
        return f"{name}: served shape {served.shape}, in-process shape {expected.shape}"
    return None


def _diff_rows(served: np.ndarray, expected: np.ndarray, positions: np.ndarray) -> list[str]:
    """Side-by-side lines for the first few differing positions."""
    lines = [f"      {'index':<12} {'served':>22} {'in-process':>22}"]
    for flat in positions[:MAX_DIFF_ROWS]:
        index = np.unravel_index(flat, served.shape)
        where = ",".join(str(int(i)) for i in index)
        lines.append(
            f"      [{where}]".ljust(19) + f" {served[index]!s:>22} {expected[index]!s:>22}"
        )
    if len(positions) > MAX_DIFF_ROWS:
        lines.append(f"      ... {len(positions) - MAX_DIFF_ROWS} more")
    return lines


def compare_ids(name: str, served: np.ndarray, expected: np.ndarray) -> list[str]:
    """Problems (readable lines) when two id arrays are not equal."""
    served, expected = np.asarray(served), np.asarray(expected)
    shape = _shape_problem(name, served, expected)
    if shape:
        return [shape]
    differ = np.flatnonzero(served.ravel() != expected.ravel())
    if not len(differ):
        return []
    header = f"{name}: {len(differ)} of {served.size} ids differ"
    return [header, *_diff_rows(served, expected, differ)]


def compare_floats(
    name: str, served: np.ndarray, expected: np.ndarray, atol: float = TOLERANCE
) -> list[str]:
    """Problems when two float arrays differ by more than ``atol`` anywhere."""
    served = np.asarray(served, np.float32)
    expected = np.asarray(expected, np.float32)
    shape = _shape_problem(name, served, expected)
    if shape:
        return [shape]
    error = np.abs(served.astype(np.float64) - expected.astype(np.float64)).ravel()
    error[np.isnan(error)] = np.inf  # NaN on either side is a mismatch
    beyond = np.flatnonzero(error > atol)
    if not len(beyond):
        return []
    worst = beyond[np.argsort(-error[beyond], kind="stable")]
    header = (
        f"{name}: {len(beyond)} of {served.size} values differ by more than {atol:g} "
        f"(largest {error[worst[0]]:.3g})"
    )
    return [header, *_diff_rows(served, expected, worst)]


def compare_outputs(
    served: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    id_names: Sequence[str] = (),
    atol: float = TOLERANCE,
) -> list[str]:
    """Problems over every output of ``expected`` (ids exact, the rest within ``atol``)."""
    problems = []
    for name, reference in expected.items():
        if name not in served:
            problems.append(f"{name}: missing from the server's answer")
        elif name in id_names:
            problems += compare_ids(name, served[name], reference)
        else:
            problems += compare_floats(name, served[name], reference, atol)
    return problems


def run_check(args: argparse.Namespace, check: Callable[..., int], *check_args) -> int:
    """With --check, ``check(args, *check_args)``'s exit status (an error while computing the
    reference exits 3); without, 0."""
    if not args.check:
        return EXIT_OK
    try:
        return check(args, *check_args)
    except Exception as error:
        print(f"error: --check could not compute the reference: {error}", file=sys.stderr)
        return EXIT_ERROR


def report_check(problems: Sequence[str], what: str) -> int:
    """Print the verdict of --check; returns the exit status."""
    if not problems:
        print(f"\ncheck passed: {what} equals the in-process answer (tolerance {TOLERANCE:g})")
        return EXIT_OK
    print(f"\ncheck FAILED: {what} differs from the in-process answer:", file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    return EXIT_MISMATCH
