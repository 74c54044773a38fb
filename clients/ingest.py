"""Feed posts and deletions, as JSON lines, into a corpus store.

Reads JSON lines from FILE, or from standard input with `-`. Posts are embedded with the
candidate tower (in this process from --artifacts, or by the running server's
`candidate_tower` with --embed served) and written to the store (--store) as one fresh segment
per flush; deletions become tombstones at the same flushes. A retriever whose corpus_file
names the store serves each flush within a second (docs/retrieval.md, "Feeding the store").
A store records the candidate tower that embedded it: one embedded by another tower than
--embed's is refused, naming both (a store made with --create records --embed's).

One JSON object a line; blank lines are skipped and other keys ignored; ids are JSON
integers or strings of digits; created_at is unix seconds (default: now); semantic_ids, a
post's optional semantic IDs, lists as many integers in [0, codebook] as the store's
manifest says (6 in [0, 256] by default; 0: no code at that level):

  {"post_id": 17, "author_id": 4, "created_at": 1767225600}    a post
  {"post_id": 18, "author_id": 4, "semantic_ids": [12, 7, 201, 3, 88, 140]}
                                                               a post with its semantic IDs
  {"delete": 17}                                               a deletion
  {"post_id": 17, "deleted": true}                             a deletion too

A flush happens when --flush-posts posts are held, or --flush-seconds after the oldest thing
held arrived, whichever comes first, and at the end: at the end of the input, or with --follow
on SIGINT/SIGTERM (a second signal stops at once, losing what is held). A bad line is reported
with its line number and skipped; the summary counts it.

Examples:
  phoenix-ingest posts.jsonl --store artifacts/trained-demo/store --create \\
      --artifacts artifacts/trained-demo
  phoenix-ingest events.jsonl --follow --store artifacts/trained-demo/store \\
      --artifacts artifacts/trained-demo --flush-seconds 1
  kafka-console-consumer --topic post-events | phoenix-ingest - \\
      --store artifacts/trained-demo/store --embed served --protocol grpc
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import BinaryIO, Optional

from tqdm import tqdm

from clients import cli
from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.identity import ArtifactMismatch
from phoenix.client.served_tower import IN_PROCESS, WHERE, candidate_tower, tower_identity
from phoenix.corpus_store.embedding import EmbedPosts
from phoenix.corpus_store.ingestion import (
    Ingest,
    IngestError,
    Pending,
    check_embedded_by,
    check_width,
    open_store,
    summary,
    write_batch,
)
from phoenix.corpus_store.manifest import EmbeddedBy

EXIT_CODES_HELP = (
    "Exit status: 0 ok (bad lines are skipped and counted), 2 bad arguments, 3 input, store "
    "or server error (what was written before it stays written)."
)


def parse_args(argv):
    parser = cli.build_parser(
        __file__,
        __doc__,
        artifacts_help="artifact directory whose candidate tower embeds the posts with "
        "--embed in-process, and whose emb_size --create gives the store (default: "
        "%(default)s)",
        exit_codes=EXIT_CODES_HELP,
    )
    parser.add_argument("input", metavar="FILE", help="JSON lines file, or - for standard input")
    cli.add_store_arg(parser)
    parser.add_argument(
        "--create", action="store_true", help="create the store if DIR holds none yet"
    )
    parser.add_argument(
        "--embed",
        choices=WHERE,
        default="in-process",
        help="where the candidate tower runs: in this process (ARTIFACTS' weights) or on the "
        "server at --url (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-size",
        type=cli.positive_int,
        default=1024,
        metavar="N",
        help="posts per candidate_tower request with --embed served, rows per compiled call "
        "in process (default: %(default)s)",
    )
    parser.add_argument(
        "--flush-posts",
        type=cli.positive_int,
        default=1000,
        metavar="N",
        help="write a segment once N posts are held (default: %(default)s)",
    )
    parser.add_argument(
        "--flush-seconds",
        type=cli.positive_float,
        default=2.0,
        metavar="T",
        help="flush T seconds after the oldest post or deletion held arrived (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--follow",
        action="store_true",
        help="at the end of FILE wait for more lines, as tail -f, until SIGINT or SIGTERM "
        "(standard input is read until it ends either way)",
    )
    return parser.parse_args(argv)


def make_embedder(args) -> EmbedPosts:
    """The candidate tower --embed names, ready (the server answered, or the weights loaded)."""
    try:
        client = None if args.embed == IN_PROCESS else cli.open_client(args)
        return candidate_tower(
            args.embed,
            artifacts=args.artifacts,
            client=client,
            protocol=args.protocol,
            batch_size=args.batch_size,
        )
    except ArtifactError as error:
        raise cli.Exit(cli.fail(str(error))) from None
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        if args.embed == IN_PROCESS:
            raise
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None


def ingest(args, stop: Optional[threading.Event] = None) -> int:
    """The command; ``stop`` ends a --follow run (signals set it when in the main thread)."""
    stream = cli.open_input(args.input)  # first: a mistyped name fails before the model loads
    try:
        return ingest_from(args, stream, stop or threading.Event())
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def embedding_tower(args) -> EmbeddedBy:
    """The tower --embed names, as a store records it (for the server's: the artifacts it
    serves, read on this machine)."""
    try:
        client = None if args.embed == IN_PROCESS else cli.open_client(args)
        return tower_identity(
            args.embed, artifacts=args.artifacts, client=client, protocol=args.protocol
        )
    except (ArtifactError, ArtifactMismatch) as error:
        raise cli.Exit(cli.fail(str(error))) from None
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None


def ingest_from(args, stream: BinaryIO, stop: threading.Event) -> int:
    embed = make_embedder(args)  # before --create: a store is made only if it can be fed
    tower = embedding_tower(args)
    try:
        store = open_store(args.store, args.create, args.artifacts, tower)
        check_width(store, embed, str(args.artifacts))
        unchecked = check_embedded_by(store, tower)  # another tower's store: refused
    except (ArtifactError, OSError) as error:  # StoreError is an ArtifactError
        return cli.fail(str(error))
    if unchecked:
        print(f"warning: {unchecked}", file=sys.stderr)
    run = Ingest(
        Pending(args.flush_posts, args.flush_seconds),
        write=functools.partial(write_batch, store, embed, embedded_by=tower),
        source="<stdin>" if args.input == "-" else args.input,
        sids=store.manifest().semantic_ids,
    )
    follow = args.follow and stream is not sys.stdin.buffer
    try:
        with cli.stop_on_signals(stop), tqdm(unit=" lines", desc="ingest", disable=None) as bar:
            run.bar = bar
            run.consume(stream, follow, stop)
    except IngestError as error:
        print(summary(run.tally, args.store), file=sys.stderr)
        return cli.fail(str(error))
    print(summary(run.tally, args.store))
    return cli.EXIT_OK


def main(argv=None) -> int:
    return cli.run(ingest, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
