"""Generate a seeded, non-degenerate demo artifact directory.

    python -m phoenix.artifacts --preset tiny --out /tmp/tiny
    python -m phoenix.artifacts --preset mini --out artifacts/mini --seed 0
    python -m phoenix.artifacts --ranker production --preset nano --out build/production-nano

Writes the layout ``phoenix.checkpoint`` reads: config, ranker and retrieval weights, hash
tables, a corpus embedded with the candidate tower and one example request. Haiku's own init
is degenerate for these models (zero Linear weights and RMSNorm scales), so every parameter is
drawn here from its expected shape. Each array comes from its own seeded stream, so the same
preset and seed always give byte-identical files.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from phoenix import checkpoint
from phoenix.artifact_parts import (
    PRESETS,
    GenerationSummary,
    _file_sizes,
    preset_config,
    random_corpus,
    random_example,
    random_params,
    random_tables,
)
from phoenix.config_parts import ENTITIES
from phoenix.hashing import stack_tables
from phoenix.util.command_line import command_name


def generate(
    preset: str,
    out_dir,
    seed: int = 0,
    corpus_size: Optional[int] = None,
    progress: bool = False,
    history_seq_len: Optional[int] = None,
) -> GenerationSummary:
    """Write a complete artifact directory for ``preset`` (see ``PRESETS``) to ``out_dir``;
    ``history_seq_len`` replaces the preset's (the weights' shapes do not depend on it)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}, expected one of {sorted(PRESETS)}")
    chosen = PRESETS[preset]
    if history_seq_len is not None:
        if history_seq_len < 1:
            raise ValueError(f"history_seq_len must be >= 1, got {history_seq_len}")
        chosen = dataclasses.replace(chosen, history_seq_len=history_seq_len)
    size = chosen.corpus_size if corpus_size is None else corpus_size
    if size < 2:
        raise ValueError(f"corpus_size must be >= 2 (history and candidates), got {size}")
    started = time.perf_counter()
    out_dir = Path(out_dir)
    config = preset_config(chosen, seed)
    ranker = random_params(checkpoint.ranker_param_shapes(config), seed, "ranker")
    retrieval = random_params(checkpoint.retrieval_param_shapes(config), seed, "retrieval")
    tables = random_tables(config, seed)
    checkpoint.save_artifacts(out_dir, config, ranker, retrieval, tables)
    stacked = stack_tables(*(tables[checkpoint.TABLE_KEYS[e]] for e in ENTITIES))
    corpus = random_corpus(config, retrieval, stacked, chosen, size, seed, progress)
    checkpoint.save_corpus(out_dir / checkpoint.CORPUS_FILE, corpus)
    checkpoint.save_example_sequence(out_dir, random_example(config, corpus, seed))
    seconds = time.perf_counter() - started
    return GenerationSummary(out_dir, config, size, seconds, _file_sizes(out_dir))


# ----------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------


def _parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=command_name("phoenix.artifacts"),
        description="Generate seeded demo Phoenix artifacts (weights, hash tables, corpus, "
        "example request) in the layout phoenix.checkpoint loads.",
    )
    add = parser.add_argument
    add(
        "--ranker",
        choices=("original", "production"),
        default="original",
        help="the ranker's model family: the original release's, or X's production ranker "
        "(docs/production.md) beside the same two-tower retrieval (default: %(default)s)",
    )
    presets = "original: tiny (unit-test sized, emb 32, 2 layers) or mini (the published mini "
    presets += "shapes: emb 128, 4 layers, history 127, candidates 64); production: tiny "
    presets += "(emb 32, 2 layers, history 30) or nano (X's nano: emb 512, 4 layers, history "
    presets += "1,022, candidates 64), each with the retrieval of the original tiny or mini"
    add("--preset", required=True, choices=sorted({*PRESETS, "nano"}), help=presets)
    add("--out", required=True, type=Path, help="output directory")
    add("--seed", type=int, default=0, help="random seed (default: 0)")
    corpus = "posts in the retrieval corpus (default: 500 for tiny, 20000 for mini)"
    add("--corpus-size", type=int, default=None, help=corpus)
    history = "history items the ranker reads (default: the preset's, 12 for tiny, 127 for mini)"
    add("--history-seq-len", type=int, default=None, metavar="S", help=history)
    add("--force", action="store_true", help="write into OUT even if it is not empty")
    add(
        "--ranker-checkpoint",
        type=Path,
        metavar="DIR",
        help="production: the ranker's parameters and config from one of X's checkpoints (a "
        "run, step or checkpoint root: python -m phoenix.checkpoint.xai DIR lists it)",
    )
    add(
        "--ranker-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="production: X's config override of the ranker (e.g. history_seq_len=1022), "
        "after the preset's or the checkpoint's; repeat for more",
    )
    args = parser.parse_args(argv)
    if args.ranker == "original" and (
        args.preset == "nano" or args.ranker_checkpoint or args.ranker_override
    ):
        parser.error(
            "--preset nano, --ranker-checkpoint and --ranker-override need --ranker production"
        )
    if args.ranker == "production" and args.preset == "mini":
        parser.error("--ranker production takes --preset tiny or nano")
    if args.ranker == "production" and args.history_seq_len is not None:
        parser.error("--ranker production: give the history as --ranker-override history_seq_len=S")
    return args


def _human_size(num_bytes: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if num_bytes < 1024:
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1024
    return f"{num_bytes:.1f} GiB"


def _print_summary(summary: GenerationSummary) -> None:
    config = summary.config
    ranker = ""
    if config.ranker_family != "original":
        from phoenix.checkpoint.production import production_config

        r = production_config(config)
        ranker = f"{config.ranker_family} ranker emb {r.emb_size}, {r.num_layers} layers; "
    print(
        f"wrote {summary.out_dir} in {summary.seconds:.1f} s: {ranker}emb {config.emb_size}, "
        f"{config.num_layers} layers, history {config.history_seq_len}, "
        f"candidates {config.candidate_seq_len}, corpus {summary.corpus_size}"
    )
    for name, size in summary.file_sizes.items():
        print(f"  {name:32s} {_human_size(size):>10s}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        print(f"error: {args.out} exists and is not a directory", file=sys.stderr)
        return 2
    if args.out.is_dir() and any(args.out.iterdir()) and not args.force:
        print(f"error: {args.out} is not empty (use --force to overwrite)", file=sys.stderr)
        return 2
    try:
        if args.ranker == "production":
            from phoenix.production_artifacts import generate_production

            summary = generate_production(
                args.preset,
                args.out,
                args.seed,
                args.corpus_size,
                progress=True,
                checkpoint_dir=args.ranker_checkpoint,
                overrides=args.ranker_override,
            )
        else:
            summary = generate(
                args.preset,
                args.out,
                args.seed,
                args.corpus_size,
                progress=True,
                history_seq_len=args.history_seq_len,
            )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
