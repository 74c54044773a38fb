"""Compact a corpus store: seal fresh segments, drop expired and deleted posts.

One run merges every fresh segment (`phoenix-ingest` writes one per flush) into one sealed
segment, indexed when it is big enough (IVF-SQ8 from 200,000 posts), leaving out deleted posts
and posts older than the window; drops sealed segments wholly older than the window; forgets
tombstones of posts no segment holds; and deletes the files earlier changes retired over a
minute ago (a server may still have been opening them). Serving goes on throughout: readers
switch to the compacted generation when it is published.

--window sets the store's window first (posts older than it are no longer served). With
--every, runs again every SECONDS until SIGINT or SIGTERM (a run under way finishes first).
No model is needed: this works on the store's files alone.

Examples:
  phoenix-compact --store artifacts/trained-demo/store
  phoenix-compact --store artifacts/trained-demo/store --window 48h
  phoenix-compact --store artifacts/trained-demo/store --window none --every 300
"""

from __future__ import annotations

import sys
import threading
from typing import Optional

from clients import cli
from phoenix.corpus_store import CompactReport, CorpusStore, Manifest, StoreError

EXIT_CODES_HELP = "Exit status: 0 ok, 2 bad arguments, 3 the store is missing or unusable."
# --window's default: leave the window as it is (not a str, which argparse would parse)
KEEP = object()


def parse_args(argv):
    parser = cli.docstring_parser(__file__, __doc__, EXIT_CODES_HELP)
    cli.add_store_arg(parser)
    parser.add_argument(
        "--window",
        type=cli.parse_duration,
        default=KEEP,
        metavar="DURATION",
        help="set the store's window before compacting: 48h, 30m, 3600s, 2d, or none (serve "
        "posts of any age) (default: keep the store's)",
    )
    parser.add_argument(
        "--every",
        type=cli.positive_float,
        metavar="SECONDS",
        help="run again SECONDS after each run ends, until SIGINT or SIGTERM",
    )
    return parser.parse_args(argv)


def report_line(report: CompactReport, manifest: Manifest) -> str:
    """One run, then the store as it now is."""
    return (
        f"compacted in {report.seconds:.2f} s: segments merged {report.sealed} (posts "
        f"{report.sealed_rows:,}), expired segments dropped {report.dropped_expired}, posts "
        f"left out {report.purged_rows:,} (deleted, expired or repeated), retired files "
        f"removed {report.removed_files}; store: generation {manifest.generation}, segments "
        f"{len(manifest.segments)}, posts {manifest.rows:,}, window "
        f"{cli.format_duration(manifest.window_seconds)}"
    )


def set_window(store: CorpusStore, seconds: Optional[int]) -> None:
    """The manifest's window, changed only if it differs (no new generation for nothing)."""
    if store.manifest().window_seconds != seconds:
        store.set_window(seconds)
        print(f"window set to {cli.format_duration(seconds)}", flush=True)


def compact_once(store: CorpusStore) -> int:
    """One run, reported; a failure is reported and leaves the store as it was."""
    try:
        report = store.compact(progress=True)
        print(report_line(report, store.manifest()), flush=True)
        return cli.EXIT_OK
    except (StoreError, OSError) as error:
        return cli.fail(f"compaction failed, the store is unchanged: {error}")


def compact(args, stop: Optional[threading.Event] = None) -> int:
    """The command; ``stop`` ends an --every loop (signals set it in the main thread)."""
    store = CorpusStore(args.store)
    try:
        store.manifest()  # a missing or broken store fails here, with its file named
        if args.window is not KEEP:
            set_window(store, args.window)
    except (StoreError, OSError) as error:
        return cli.fail(str(error))
    if args.every is None:
        return compact_once(store)
    stop = stop or threading.Event()
    with cli.stop_on_signals(stop):
        status = compact_once(store)
        while not stop.wait(args.every):
            status = compact_once(store)  # a failed run is retried at the next; last one counts
    return status


def main(argv=None) -> int:
    return cli.run(compact, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
