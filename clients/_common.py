"""What the command-line clients share: arguments, input users, server config, --check.

Every client takes ``--url``/``--protocol``, reads one user in the ``example_sequence.json``
format (``--input FILE``, default: the artifact directory's example) or generates one
(``--generate --seed N``), and with ``--check`` compares the server's answer with the same
service run in this process (float32, ``TOLERANCE``; ids must be equal).

The load test and the serving benchmark use ``random_sequence`` and ``CorpusIds`` too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.checkpoint import ArtifactError, ExampleSequence, load_corpus
from phoenix.config import ArtifactConfig
from phoenix.serving.client import client_module
from phoenix.serving.triton_adapter import model_parameters

REPO_ROOT = Path(__file__).resolve().parents[1]
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


def build_parser(
    prog: str, description: str, examples: Sequence[str], artifacts_help: str = ARTIFACTS_HELP
) -> argparse.ArgumentParser:
    """A parser with the server arguments every client takes."""
    epilog = "Examples:\n" + "\n".join(f"  {line}" for line in examples)
    parser = argparse.ArgumentParser(
        prog=prog,
        description=wrap_paragraphs(description),
        epilog=f"{epilog}\n\n{EXIT_CODES_HELP}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    parser.add_argument("--artifacts", type=Path, default=DEFAULT_ARTIFACTS, help=artifacts_help)
    return parser


def add_user_args(parser: argparse.ArgumentParser, candidates: bool = False) -> None:
    """--input / --generate and friends: where the request's user comes from."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--input",
        type=Path,
        metavar="FILE",
        help="one user as JSON in the example_sequence.json format "
        "(default: ARTIFACTS/example_sequence.json)",
    )
    source.add_argument(
        "--generate",
        action="store_true",
        help="generate a random user (ids drawn from the artifact corpus) instead",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for --generate (default: %(default)s)"
    )
    parser.add_argument(
        "--history",
        type=int,
        metavar="N",
        help="history length for --generate (default: random in 0..history_seq_len)",
    )
    if candidates:
        parser.add_argument(
            "--candidates",
            type=int,
            metavar="N",
            help="candidate count for --generate (default: random in 1..512)",
        )


def add_check_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"also compute the answer in this process with the phoenix services and exit 1 "
        f"on a mismatch (floats within {TOLERANCE:g}, ids equal); needs the server's --artifacts",
    )


def server_url(args: argparse.Namespace) -> str:
    return args.url or f"127.0.0.1:{DEFAULT_PORTS[args.protocol]}"


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_ERROR


# ----------------------------------------------------------------------------------------
# Users: from a file or generated
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CorpusIds:
    """Post ids and their authors, to draw realistic histories and candidates from."""

    post_ids: np.ndarray
    author_ids: np.ndarray

    @classmethod
    def load(cls, artifacts: Path, config: ArtifactConfig, corpus_file: str = "corpus.npz"):
        corpus = load_corpus(Path(artifacts) / corpus_file, config)
        return cls(corpus.post_ids, corpus.author_ids)

    def draw(self, rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
        """``count`` posts, distinct while the corpus has enough of them."""
        replace = count > len(self.post_ids)
        picks = rng.choice(len(self.post_ids), size=count, replace=replace)
        return self.post_ids[picks], self.author_ids[picks]


def random_sequence(
    rng: np.random.Generator,
    config: ArtifactConfig,
    corpus: CorpusIds,
    history_len: Optional[int] = None,
    num_candidates: Optional[int] = None,
    top_k: Optional[int] = None,
) -> dict[str, Any]:
    """One random user in the example_sequence.json format (plain lists of numbers)."""
    if history_len is None:
        history_len = int(rng.integers(0, config.history_seq_len + 1))
    if num_candidates is None:
        num_candidates = int(rng.integers(1, 513))
    posts, authors = corpus.draw(rng, history_len + num_candidates)
    actions = (rng.random((history_len, config.num_actions)) < 0.1).astype(np.int64)
    actions[np.arange(history_len), rng.integers(0, config.num_actions, history_len)] = 1
    surfaces = config.product_surface_vocab_size
    return {
        "user_id": int(rng.integers(1, 2**62)),
        "history_post_ids": posts[:history_len].tolist(),
        "history_author_ids": authors[:history_len].tolist(),
        "history_actions": actions.tolist(),
        "history_product_surface": rng.integers(0, surfaces, history_len).tolist(),
        "history_dwell_seconds": np.round(rng.exponential(8.0, history_len), 2).tolist(),
        "candidate_post_ids": posts[history_len:].tolist(),
        "candidate_author_ids": authors[history_len:].tolist(),
        "candidate_product_surface": rng.integers(0, surfaces, num_candidates).tolist(),
        "top_k": int(top_k if top_k is not None else rng.integers(10, 201)),
    }


def read_sequence(path: Path, config: ArtifactConfig) -> dict[str, Any]:
    """A user from a JSON file in the example_sequence.json format, validated."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ArtifactError(f"{path}: not readable JSON ({error})") from None
    return ExampleSequence.from_dict(data, str(path), config).to_dict()


def with_action_width(user: Mapping[str, Any], num_actions: int) -> dict[str, Any]:
    """A copy whose history_actions is an [L, A] array, so an empty history keeps its width."""
    actions = np.asarray(user["history_actions"], np.float32)
    return {**user, "history_actions": actions.reshape(len(user["history_post_ids"]), num_actions)}


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


# ----------------------------------------------------------------------------------------
# The server's model configuration
# ----------------------------------------------------------------------------------------


def server_model_config(client, protocol: str, model: str) -> dict[str, Any]:
    """The model's configuration as the server reports it (JSON form, either protocol)."""
    if protocol == "grpc":
        return client.get_model_config(model, as_json=True)["config"]
    return client.get_model_config(model)


def server_parameters(client, protocol: str, model: str) -> dict[str, str]:
    """The model's ``parameters`` as {key: string value}."""
    return model_parameters(server_model_config(client, protocol, model))


def open_client(args: argparse.Namespace, **kwargs):
    """A tritonclient InferenceServerClient for --url/--protocol (kwargs go to its constructor)."""
    url = server_url(args).split("://", 1)[-1]
    return client_module(args.protocol).InferenceServerClient(url=url, **kwargs)


# ----------------------------------------------------------------------------------------
# In-process reference
# ----------------------------------------------------------------------------------------


class InProcessModels:
    """The served models' services, run in this process: the reference answers of --check.

    Each service is built exactly as the Triton adapter builds it, from the parameters the
    server reports, so a difference means serving changed the answer.
    """

    def __init__(self, artifacts: Path):
        # The server's CPU instances run JAX on the CPU in float32; so must the reference.
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        self.artifacts = Path(artifacts).resolve()
        self._services: dict[tuple, Any] = {}

    def service(self, model: str, params: Mapping[str, str]):
        from phoenix.serving.triton_adapter import build_service, enable_compilation_cache

        key = (model, tuple(sorted(params.items())))
        if key not in self._services:
            enable_compilation_cache()
            self._services[key] = build_service(model, params, self.artifacts, 1)
        return self._services[key]

    def run(
        self, model: str, params: Mapping[str, str], arrays: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """One request through the model's service; raises its InputError if it refuses."""
        (result,) = self.service(model, params).handle([dict(arrays)])
        if isinstance(result, Exception):
            raise result
        return result


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


def report_check(problems: Sequence[str], what: str) -> int:
    """Print the verdict of --check; returns the exit status."""
    if not problems:
        print(f"\ncheck passed: {what} equals the in-process answer (tolerance {TOLERANCE:g})")
        return EXIT_OK
    print(f"\ncheck FAILED: {what} differs from the in-process answer:", file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    return EXIT_MISMATCH
