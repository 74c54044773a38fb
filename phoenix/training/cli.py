"""``python -m phoenix.training``: synthetic logs, training, offline evaluation.

python -m phoenix.training generate --preset tiny --out build/logs/tiny
python -m phoenix.training pipeline --preset demo --out artifacts/trained
python -m phoenix.training report artifacts/trained/training.json
python -m phoenix.training served-logs --redis redis://127.0.0.1:6379/0 --out build/served
python -m phoenix.training pipeline --logs build/served --init artifacts/trained-demo --out NEW
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from phoenix.training.presets import PRESETS
from phoenix.util.command_line import command_parser


def _preset_help() -> str:
    return "; ".join(f"{name}: {p.description}" for name, p in PRESETS.items())


class TqdmProgress:
    """A tqdm bar for one training phase, showing loss and examples/s."""

    def __init__(self, description: str, total: int):
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=description, unit="step", file=sys.stderr)
        self.done = 0

    def __call__(self, step: int, metrics: dict, examples_per_s: float) -> None:
        shown = {k: f"{float(v):.3f}" for k, v in metrics.items() if k in ("retrieval", "ranker")}
        self.bar.set_postfix(shown | {"ex/s": f"{examples_per_s:,.0f}"}, refresh=False)
        self.bar.update(step + 1 - self.done)
        self.done = step + 1

    def close(self) -> None:
        self.bar.update(self.bar.total - self.done)
        self.bar.close()


def build_parser() -> argparse.ArgumentParser:
    parser = command_parser(
        "python -m phoenix.training",
        "Train both Phoenix towers on synthetic engagement logs, evaluate them "
        "offline and write the published artifact layout (servable with `make serve "
        "ARTIFACTS=...`). Presets: " + _preset_help(),
        "Examples:\n"
        "  python -m phoenix.training pipeline --preset demo --out artifacts/trained-demo\n"
        "  python -m phoenix.training generate --preset tiny --out build/logs/tiny\n"
        "  python -m phoenix.training report artifacts/trained-demo/training.json\n"
        "The log files' schema is in phoenix/world/logs.py and docs/training.md.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="write synthetic engagement logs (npz + meta.json)")
    gen.add_argument("--preset", choices=sorted(PRESETS), default="demo", help="world size")
    gen.add_argument("--out", type=Path, required=True, help="log directory to write")
    gen.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")

    run = sub.add_parser(
        "pipeline",
        help="logs -> train both towers -> artifact directory -> evaluation",
        description="Generate (or reuse) the preset's logs, train the retrieval tower, then "
        "the ranker on the frozen shared tables, write the artifact directory and evaluate "
        "on the held-out day.",
    )
    run.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        default=None,
        help="default: demo, or with --init the served artifacts' preset. " + _preset_help(),
    )
    run.add_argument("--out", type=Path, required=True, help="artifact directory to write")
    run.add_argument("--seed", type=int, default=None, help="random seed (default: 0, or --init's)")
    run.add_argument(
        "--logs",
        type=Path,
        default=None,
        help="log directory, reused when it holds this preset's and seed's logs "
        "(default: build/logs/PRESET-seedSEED); with --init, served logs (served-logs)",
    )
    warm = run.add_argument_group(
        "next version from served logs (--init)",
        "Warm-start from served artifacts, train on --logs (written by served-logs), write "
        "version N+1 to --out and OUT/gate.json: both versions on the held-out served rows.",
    )
    warm.add_argument(
        "--init", type=Path, default=None, help="the served artifact directory (version N)"
    )
    warm.add_argument(
        "--version", default=None, help="the new version label (default: N + 1; unversioned: 2)"
    )
    warm.add_argument(
        "--retrieval-steps",
        type=int,
        default=None,
        help="retrieval steps (default: a quarter of the preset's)",
    )
    warm.add_argument(
        "--ranker-steps",
        type=int,
        default=None,
        help="ranker steps (default: a quarter of the preset's)",
    )
    warm.add_argument(
        "--learning-rate",
        type=float,
        default=None,
        help="peak learning rate (default: 0.3 x the preset's)",
    )
    warm.add_argument(
        "--gate-metric",
        default=None,
        help="gate metric, e.g. ndcg@20, recall@100, auc.favorite (default: ndcg@20)",
    )
    warm.add_argument(
        "--gate-tolerance",
        type=float,
        default=None,
        help="how much worse than the served version still passes (default: 0.01)",
    )

    served = sub.add_parser(
        "served-logs",
        help="served traffic in Redis -> a training log directory (for pipeline --init)",
        description="Read the request log and the served users' engagements from the "
        "user-state store a server wrote (phoenix-serve --redis), join them into impressions "
        "and write a log directory in the schema load_logs reads, for the world of the served "
        "artifacts; the last --held-out-fraction of the time range is held out.",
    )
    served.add_argument("--redis", required=True, help="user-state store URL (redis://...)")
    served.add_argument("--out", type=Path, required=True, help="log directory to write")
    served.add_argument(
        "--artifacts",
        type=Path,
        default=Path("artifacts/trained-demo"),
        help="the served artifacts: their training.json names the world (default: %(default)s)",
    )
    served.add_argument(
        "--window-s",
        type=float,
        default=3600.0,
        help="an engagement counts for an impression this long after it (default: %(default)s)",
    )
    served.add_argument(
        "--since",
        type=float,
        default=None,
        help="first Unix second to export (default: all the log keeps)",
    )
    served.add_argument(
        "--until", type=float, default=None, help="last Unix second to export (default: now)"
    )
    served.add_argument(
        "--top-n",
        type=int,
        default=None,
        help="impressions: the top N posts of each feed, those a client showed (default: all)",
    )
    served.add_argument(
        "--held-out-fraction",
        type=float,
        default=0.25,
        help="share of the time range held out (default: %(default)s)",
    )
    run.add_argument("--results", type=Path, default=None, help="also write the JSON here")
    run.add_argument("--plot", type=Path, default=None, help="write learning curves + recall@k PNG")
    run.add_argument("--no-eval", action="store_true", help="skip the offline evaluation")
    run.add_argument("--quiet", action="store_true", help="no progress bars")

    rep = sub.add_parser("report", help="print the evaluation table of a training.json")
    rep.add_argument("summary", type=Path, help="training.json (or a --results file)")
    rep.add_argument("--plot", type=Path, default=None, help="also write the PNG here")
    return parser


def _print_report(summary: dict) -> None:
    """The evaluation table and each target's verdict (a missed target is printed, not fatal:
    a demo whose training fell short still serves)."""
    from phoenix.training.report import markdown_table, targets

    evaluation = summary.get("evaluation")
    if not evaluation:
        print("(no evaluation in this summary)")
        return
    print(markdown_table(evaluation))
    for text, holds in targets(evaluation):
        print(f"  [{'ok' if holds else 'MISSED'}] {text}")


# Options a library function takes as keywords of the same name.
_EXPORT_OPTIONS = ("window_s", "since", "until", "held_out_fraction", "top_n")
_RETRAIN_OPTIONS = ("seed", "retrieval_steps", "ranker_steps", "learning_rate", "version")


def _same_named(args: argparse.Namespace, names: Sequence[str]) -> dict:
    """``{name: args.<name>}`` for each of ``names``."""
    return {name: getattr(args, name) for name in names}


def _served_logs(args) -> int:
    from phoenix.checkpoint import ArtifactError
    from phoenix.training.served_export import ExportError, export_served_logs
    from phoenix.user_state import UserStateError

    try:
        summary = export_served_logs(
            args.redis,
            args.artifacts,
            args.out,
            **_same_named(args, _EXPORT_OPTIONS),
        )
    except (ExportError, ArtifactError, UserStateError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(summary.text(args.out))
    return 0


def _next_version(args) -> int:
    from phoenix.checkpoint import ArtifactError
    from phoenix.training.gate import DEFAULT_TOLERANCE, PRIMARY_METRIC, GateRule, gate_table
    from phoenix.training.retrain import RetrainError, retrain
    from phoenix.world.logs import LogError

    if args.logs is None:
        print("error: --init needs --logs (a directory written by served-logs)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    try:
        rule = GateRule(
            args.gate_metric or PRIMARY_METRIC,
            DEFAULT_TOLERANCE if args.gate_tolerance is None else args.gate_tolerance,
        )
        gate = retrain(
            args.logs,
            args.init,
            args.out,
            preset_name=args.preset,
            rule=rule,
            make_progress=None if args.quiet else TqdmProgress,
            **_same_named(args, _RETRAIN_OPTIONS),
        )
    except (RetrainError, LogError, ArtifactError, KeyError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(gate_table(gate))
    print(f"wrote {args.out} (gate.json) in {time.perf_counter() - started:.0f} s")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        from phoenix.world.logs import save_logs
        from phoenix.world.synthetic import generate_logs

        started = time.perf_counter()
        world, impressions = generate_logs(PRESETS[args.preset].world, args.seed)
        save_logs(args.out, world, impressions, args.seed)
        print(
            f"wrote {len(impressions):,} impressions of {len(world.user_ids):,} users to "
            f"{args.out} in {time.perf_counter() - started:.1f} s"
        )
        return 0
    if args.command == "report":
        summary = json.loads(args.summary.read_text())
        if args.plot:
            from phoenix.training.report import write_plot

            write_plot(summary, args.plot)
        _print_report(summary)
        return 0

    if args.command == "served-logs":
        return _served_logs(args)
    if args.init is not None:
        return _next_version(args)

    from phoenix.training.pipeline import run_pipeline
    from phoenix.world.logs import LogError

    started = time.perf_counter()
    try:
        summary = run_pipeline(
            args.preset or "demo",
            args.out,
            seed=args.seed or 0,
            logs_dir=args.logs,
            results_path=args.results,
            evaluate=not args.no_eval,
            make_progress=None if args.quiet else TqdmProgress,
        )
    except LogError as error:  # logs of another preset or seed, a broken log file
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.plot:
        from phoenix.training.report import write_plot

        write_plot(summary, args.plot)
    _print_report(summary)
    print(f"wrote {args.out} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
