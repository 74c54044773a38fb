"""Embed posts with the served `candidate_tower` into a retriever corpus.

Embed a file of (post_id, author_id) rows with the served `candidate_tower`, in batches, and
write the corpus the retriever serves (phoenix.checkpoint.save_corpus) as ARTIFACTS/NAME.
With --reload, every model of the running server that reads the corpus (the retriever and
the feed policy, whose age filter dates posts from it) is reloaded through the model load API
with its corpus_file parameter set to NAME (no restart; the server must run with
--model-control-mode=explicit --load-model=*).

With --store DIR the corpus is a corpus store directory DIR instead (a path, as for
`phoenix-ingest` and `phoenix-compact`, which keep it up to date after; docs/retrieval.md):
the posts sorted by creation time, in sealed segments of --segment-rows posts, each with the
index its size calls for (exact below 200,000 posts, else IVF-SQ8). It appears whole when
complete. With --reload, DIR must be inside ARTIFACTS (where the retriever resolves its
corpus_file).
--in-process embeds with ARTIFACTS' own towers instead of the server (much faster for
millions of posts; no server needed unless --reload). --from-generator N takes N posts of
the synthetic world ARTIFACTS/training.json describes (trained artifacts such as
artifacts/trained-demo), dated up to now, with their semantic IDs; posts from a file or
--generate are dated now. A store keeps the posts' semantic IDs (a corpus file does not).

Posts file formats (one row per post; post ids must be unique and > 0):
  .csv  columns post_id,author_id[,topic]; a header line with those names is optional
  .npy  an integer array [N, 2] (post_id, author_id) or [N, 3] (..., topic)
  .npz  integer arrays post_ids [N], author_ids [N] and optionally topics [N] and
        semantic_ids [N, L] (codes in [0, 256], 0: none)

Examples:
  phoenix-build-corpus posts.csv --reload
  phoenix-build-corpus posts.npz --out corpus-new.npz --check
  phoenix-build-corpus --generate 5000 --seed 1 --protocol grpc --reload
  phoenix-build-corpus --from-generator 10000000 --in-process \\
      --store artifacts/trained-demo/store --window 48h --artifacts artifacts/trained-demo
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from clients import cli
from phoenix.checkpoint import ArtifactError
from phoenix.checkpoint.identity import ArtifactMismatch
from phoenix.client.served_tower import IN_PROCESS, SERVED, candidate_tower, tower_identity
from phoenix.corpus_store.building import (
    SEGMENT_ROWS,
    InputFileError,
    PostRows,
    StoreExistsError,
    build_corpus_file,
    build_store,
    generated_posts,
    read_posts,
)
from phoenix.corpus_store.embedding import EmbedPosts
from phoenix.corpus_store.manifest import EmbeddedBy
from phoenix.ops.admin_key import ADMIN_KEY_ENV, find_admin_key
from phoenix.ops.reload import switch_corpus
from phoenix.schema.contracts import LIMITS
from phoenix.world.trained import world_posts

RELOAD_TIMEOUT_S = 600.0  # a large corpus takes a while to load and compile
REFERENCE_ROWS = LIMITS.max_rows  # rows per in-process candidate_tower call
EXPLICIT_MODE_HINT = (
    "the model load API needs a server started with --model-control-mode=explicit --load-model=*"
)


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(
        __file__,
        __doc__,
        artifacts_help="the server's artifact directory: the corpus is written there, and "
        "--check reads its weights (default: %(default)s)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("posts", nargs="?", type=Path, help="posts file (.csv, .npy or .npz)")
    random_posts = "embed N random posts instead of a file"
    source.add_argument("--generate", type=int, metavar="N", help=random_posts)
    world = "embed N posts of the synthetic world of ARTIFACTS/training.json instead"
    source.add_argument("--from-generator", type=cli.positive_int, metavar="N", help=world)
    add = parser.add_argument
    seed = "seed for --generate (default: 0) or --from-generator (default: the seed in "
    add("--seed", type=int, help=seed + "training.json, whose world the towers were trained on)")
    target = parser.add_mutually_exclusive_group()
    name = "corpus file name inside ARTIFACTS (default: corpus-<posts file stem>.npz)"
    target.add_argument("--out", metavar="NAME", help=name)
    store = "write a corpus store directory DIR (a path) instead of a .npz file"
    cli.add_store_arg(target, required=False, help=store)
    segment = "posts per sealed segment with --store (default: %(default)s)"
    add("--segment-rows", type=cli.positive_int, default=SEGMENT_ROWS, metavar="N", help=segment)
    window = "with --store: serve only posts younger than this (48h, 3600s, 2d; default: none)"
    add("--window", type=cli.parse_duration, metavar="DURATION", help=window)
    in_process = "embed with ARTIFACTS' candidate tower in this process instead of the server"
    add("--in-process", action="store_true", help=in_process)
    batch = "posts per candidate_tower request (default: %(default)s; at most the model's "
    add("--batch-size", type=int, default=1024, help=batch + "max_batch_size)")
    reload = "reload the server's models that read the corpus (retriever, feed policy) with "
    add("--reload", action="store_true", help=reload + "the new corpus once it is written")
    key_env = "environment variable with the server's admin key, sent with the load request; "
    key_env += "unset: the key `serve` generated into build/serve/admin-key (default: %(default)s)"
    add("--admin-key-env", default=ADMIN_KEY_ENV, metavar="NAME", help=key_env)
    key_file = "file with the admin key (default: $PHOENIX_ADMIN_KEY_FILE, else "
    add("--admin-key-file", metavar="PATH", help=key_file + "build/serve/admin-key)")
    cli.add_check_arg(parser)
    args = parser.parse_args(argv)
    if args.window is not None and args.store is None:
        parser.error("--window applies to a store: add --store DIR")
    if args.check and (args.in_process or args.store is not None):
        parser.error(
            "--check compares the server's embeddings with a .npz build: not with "
            "--in-process or --store"
        )
    return args


# ----------------------------------------------------------------------------------------
# Where the posts come from and where the corpus goes
# ----------------------------------------------------------------------------------------


def source_posts(args) -> PostRows:
    """The posts to embed: a file, --generate or --from-generator."""
    if args.from_generator:
        return world_posts(args.artifacts, args.from_generator, args.seed, int(time.time()))
    if args.generate:
        return generated_posts(args.generate, args.seed or 0)
    return read_posts(args.posts)


def default_out_name(args) -> str:
    if args.generate:
        return f"corpus-generated-{args.generate}-seed{args.seed or 0}.npz"
    if args.from_generator:
        return f"corpus-world-{args.from_generator}.npz"
    return f"corpus-{args.posts.stem}.npz"


def check_out_name(name: str) -> str:
    """The corpus must be a plain .npz name: the retriever resolves it inside its artifacts."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+\.npz", name) or name.startswith("."):
        raise InputFileError(f"--out must be a plain file name ending in .npz, got {name!r}")
    return name


def corpus_file_of_store(args) -> Optional[str]:
    """The retriever's corpus_file for --store DIR: DIR relative to ARTIFACTS, where the
    retriever resolves it (None when DIR is elsewhere: no --reload then)."""
    store, root = args.store.resolve(), Path(args.artifacts).resolve()
    return str(store.relative_to(root)) if store.is_relative_to(root) else None


# ----------------------------------------------------------------------------------------
# Embedding: the server's candidate_tower, or the artifacts' own in this process
# ----------------------------------------------------------------------------------------


def connect_server(args):
    """A client of the server (a long timeout: a big corpus reloads slowly); exits 3 if the
    server does not answer."""
    timeout = {"network_timeout": RELOAD_TIMEOUT_S} if args.protocol == "http" else {}
    try:
        return cli.open_client(args, **timeout)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None


def make_embedder(args, client) -> EmbedPosts:
    """The tower --in-process asks for, or the server's; a server that does not answer, now
    or while embedding, exits 3."""
    if args.in_process:
        try:
            return candidate_tower(IN_PROCESS, artifacts=args.artifacts, batch_size=args.batch_size)
        except ArtifactError as error:
            raise cli.Exit(cli.fail(str(error))) from None
    try:
        served = candidate_tower(
            SERVED, client=client, protocol=args.protocol, batch_size=args.batch_size
        )
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None

    class Embed:  # EmbedPosts: the server's tower, exiting 3 when it stops answering
        emb_size = served.emb_size

        def __call__(self, post_ids, author_ids, progress=None) -> np.ndarray:
            try:
                return served(post_ids, author_ids, progress)
            except Exception as error:
                raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None

    return Embed()


def check_embeddings(args, client, posts: PostRows, served: np.ndarray) -> int:
    models = cli.reference_models(args, client, "candidate_tower")
    expected = []
    for start in range(0, len(posts), REFERENCE_ROWS):
        rows = slice(start, start + REFERENCE_ROWS)
        arrays = {"post_id": posts.post_ids[rows, None], "author_id": posts.author_ids[rows, None]}
        expected.append(models.run("candidate_tower", arrays)["candidate_embedding"])
    problems = cli.compare_floats("candidate_embedding", served, np.concatenate(expected))
    return cli.report_check(problems, f"the served embeddings of {len(posts)} posts")


# ----------------------------------------------------------------------------------------
# Writing, reloading
# ----------------------------------------------------------------------------------------


def write_corpus(args, name: str, posts: PostRows, embed: EmbedPosts) -> np.ndarray:
    """ARTIFACTS/NAME as one .npz corpus; the embeddings (for --check)."""
    path = Path(args.artifacts) / name
    try:
        embeddings = build_corpus_file(path, posts, embed)
    except ArtifactError as error:
        raise cli.Exit(cli.fail(f"the corpus was not written: {error}")) from None
    print(f"wrote {path}: {len(posts)} posts, D = {embeddings.shape[1]}")
    if posts.semantic_ids is not None:
        print(
            "note: the posts' semantic IDs are not in a corpus file; a store keeps them (--store)"
        )
    return embeddings


def embedding_tower(args, client) -> EmbeddedBy:
    """The tower that embeds, as the store records it: ARTIFACTS' with --in-process, else the
    one of the artifacts the server serves (read here; exits 3 when they are not here)."""
    where = IN_PROCESS if args.in_process else SERVED
    try:
        return tower_identity(
            where, artifacts=args.artifacts, client=client, protocol=args.protocol
        )
    except (ArtifactError, ArtifactMismatch) as error:
        raise cli.Exit(cli.fail(f"the store was not written: {error}")) from None
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None


def write_store(args, posts: PostRows, embed: EmbedPosts, tower: EmbeddedBy) -> None:
    """The store at --store DIR, built whole, recording the tower that embedded it."""
    try:
        segments = build_store(
            args.store, posts, embed, args.segment_rows, args.window, embedded_by=tower
        )
    except StoreExistsError as error:
        raise cli.Exit(cli.fail(str(error))) from None
    except ArtifactError as error:  # StoreError is one
        raise cli.Exit(cli.fail(f"the store was not written: {error}")) from None
    window = cli.format_duration(args.window)
    sids = "" if posts.semantic_ids is None else ", semantic IDs kept"
    print(
        f"wrote {args.store}: {len(posts):,} posts in {segments} sealed segments, window "
        f"{window}, embedded by {tower.describe()}{sids}"
    )


def reload_hint(message: str, admin_key_env: str) -> str:
    """What to do about a refused load request, when the message tells."""
    if "not allowed" in message:
        return f"\n({EXPLICIT_MODE_HINT})"
    if "restricted" in message:
        return (
            f"\n(the server has an admin key: set ${admin_key_env} to it, or pass "
            "--admin-key-file; `serve` keeps a generated key in build/serve/admin-key)"
        )
    return ""


# ----------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(build, parse_args(argv))


def build(args) -> int:
    try:
        if args.store is not None:
            name = corpus_file_of_store(args)
            if args.reload and name is None:
                return cli.fail(
                    f"--store {args.store}: --reload needs the store inside --artifacts "
                    f"{args.artifacts} (the retriever resolves its corpus_file there)"
                )
        else:
            name = check_out_name(args.out or default_out_name(args))
        posts = source_posts(args)
    except InputFileError as error:
        return cli.fail(str(error))
    client = None if args.in_process else connect_server(args)
    embed = make_embedder(args, client)
    status = 0
    if args.store is not None:  # the tower is named before the long work of embedding
        write_store(args, posts, embed, embedding_tower(args, client))
    else:
        assert name is not None  # check_out_name's
        embeddings = write_corpus(args, name, posts, embed)
        if args.check:
            status = check_embeddings(args, client, posts, embeddings)
    if args.reload and status != 0:
        print("not reloading the corpus: --check failed", file=sys.stderr)
    elif args.reload:
        assert name is not None  # a store outside --artifacts was refused above
        return reload(args, client or connect_server(args), name)
    return status


def reload(args, client, name: str) -> int:
    """Every served model that reads the corpus switched onto NAME."""
    try:
        key = find_admin_key(args.admin_key_env, args.admin_key_file)
        models = switch_corpus(client, args.protocol, name, key)
    except Exception as error:
        hint = reload_hint(str(error), args.admin_key_env)
        return cli.fail(f"reloading the corpus failed: {error}{hint}")
    print(f"the server's {' and '.join(models)} now serve{'s' * (len(models) == 1)} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
