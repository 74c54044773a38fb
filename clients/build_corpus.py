"""Embed posts with the served `candidate_tower` into a retriever corpus.

Embed a file of (post_id, author_id) rows with the served `candidate_tower`, in batches, and
write the corpus the retriever serves (phoenix.checkpoint.save_corpus) as ARTIFACTS/NAME.
With --reload, every model of the running server that reads the corpus (the retriever and
the feed policy, whose age filter dates posts from it) is reloaded through the model load API
with its corpus_file parameter set to NAME (no restart; the server must run with
--model-control-mode=explicit --load-model=*).

With --store NAME the corpus is a corpus store directory ARTIFACTS/NAME instead
(docs/retrieval.md): the posts sorted by creation time, in sealed segments of --segment-rows
posts, each with the index its size calls for (exact below 200,000 posts, else IVF-SQ8). It
appears whole when complete; `phoenix-ingest` and `phoenix-compact` keep it up to date after.
--in-process embeds with ARTIFACTS' own towers instead of the server (much faster for
millions of posts; no server needed unless --reload). --from-generator N takes N posts of
the synthetic world ARTIFACTS/training.json describes (trained artifacts such as
artifacts/trained-demo), dated up to now; posts from a file or --generate are dated now.

Posts file formats (one row per post; post ids must be unique and > 0):
  .csv  columns post_id,author_id[,topic]; a header line with those names is optional
  .npy  an integer array [N, 2] (post_id, author_id) or [N, 3] (..., topic)
  .npz  integer arrays post_ids [N], author_ids [N] and optionally topics [N]

Examples:
  python -m clients.build_corpus posts.csv --reload
  python -m clients.build_corpus posts.npz --out corpus-new.npz --check
  python -m clients.build_corpus --generate 5000 --seed 1 --protocol grpc --reload
  python -m clients.build_corpus --from-generator 10000000 --in-process --store store \\
      --window 48h --artifacts artifacts/trained-demo
"""

from __future__ import annotations

import contextlib
import csv
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
from tqdm import tqdm

from clients import cli
from phoenix.checkpoint import ArtifactError, Corpus, save_corpus
from phoenix.corpus_store import SEALED, CorpusStore, choose_index
from phoenix.corpus_store import Posts as StorePosts
from phoenix.serving.admin_key import ADMIN_KEY_ENV, find_admin_key
from phoenix.serving.client import infer
from phoenix.serving.contracts import LIMITS
from phoenix.serving.inprocess import server_model_config
from phoenix.serving.reload import switch_corpus

CSV_COLUMNS = ("post_id", "author_id", "topic")
NPZ_KEYS = ("post_ids", "author_ids", "topics")
RELOAD_TIMEOUT_S = 600.0  # a large corpus takes a while to load and compile
REFERENCE_ROWS = LIMITS.max_rows  # rows per in-process candidate_tower call
SEGMENT_ROWS = 10_000_000
IN_PROCESS_CALL_BATCHES = 64  # batches per embed_candidates call: the bar moves in between
EXPLICIT_MODE_HINT = (
    "the model load API needs a server started with --model-control-mode=explicit --load-model=*"
)


@dataclass(frozen=True)
class Posts:
    post_ids: np.ndarray  # int64 [N]
    author_ids: np.ndarray  # int64 [N]
    topics: Optional[np.ndarray] = None  # int64 [N]
    created_at: Optional[np.ndarray] = None  # int64 [N], unix seconds (None: now)

    def __len__(self) -> int:
        return int(self.post_ids.shape[0])

    def take(self, rows) -> Posts:
        columns = (self.post_ids, self.author_ids, self.topics, self.created_at)
        return Posts(*(None if c is None else c[rows] for c in columns))


class InputFileError(ValueError):
    """The posts file cannot be read or breaks a rule of the format."""


def parse_args(argv: Optional[Sequence[str]]):
    parser = cli.build_parser(
        __file__,
        __doc__,
        artifacts_help="the server's artifact directory: the corpus is written there, and "
        "--check reads its weights (default: %(default)s)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("posts", nargs="?", type=Path, help="posts file (.csv, .npy or .npz)")
    source.add_argument(
        "--generate", type=int, metavar="N", help="embed N random posts instead of a file"
    )
    source.add_argument(
        "--from-generator",
        type=cli.positive_int,
        metavar="N",
        help="embed N posts of the synthetic world of ARTIFACTS/training.json instead",
    )
    parser.add_argument(
        "--seed",
        type=int,
        help="seed for --generate (default: 0) or --from-generator (default: the seed in "
        "training.json, whose world the towers were trained on)",
    )
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--out",
        metavar="NAME",
        help="corpus file name inside ARTIFACTS (default: corpus-<posts file stem>.npz)",
    )
    target.add_argument(
        "--store",
        metavar="NAME",
        help="write a corpus store directory ARTIFACTS/NAME instead of a .npz file",
    )
    parser.add_argument(
        "--segment-rows",
        type=cli.positive_int,
        default=SEGMENT_ROWS,
        metavar="N",
        help="posts per sealed segment with --store (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=cli.parse_duration,
        metavar="DURATION",
        help="with --store: serve only posts younger than this (48h, 3600s, 2d; default: none)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="embed with ARTIFACTS' candidate tower in this process instead of the server",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1024,
        help="posts per candidate_tower request (default: %(default)s; at most the model's "
        "max_batch_size)",
    )
    parser.add_argument(
        "--reload",
        action="store_true",
        help="reload the server's models that read the corpus (retriever, feed policy) with "
        "the new corpus once it is written",
    )
    parser.add_argument(
        "--admin-key-env",
        default=ADMIN_KEY_ENV,
        metavar="NAME",
        help="environment variable with the server's admin key, sent with the load request; "
        "unset: the key `serve` generated into build/serve/admin-key (default: %(default)s)",
    )
    parser.add_argument(
        "--admin-key-file",
        metavar="PATH",
        help="file with the admin key (default: $PHOENIX_ADMIN_KEY_FILE, else "
        "build/serve/admin-key)",
    )
    cli.add_check_arg(parser)
    args = parser.parse_args(argv)
    if args.window is not None and not args.store:
        parser.error("--window applies to a store: add --store NAME")
    if args.check and (args.in_process or args.store):
        parser.error(
            "--check compares the server's embeddings with a .npz build: not with "
            "--in-process or --store"
        )
    return args


# ----------------------------------------------------------------------------------------
# Reading posts
# ----------------------------------------------------------------------------------------


def read_csv(path: Path) -> Posts:
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [row for row in csv.reader(handle) if row and any(cell.strip() for cell in row)]
    if rows and rows[0][0].strip().lower() in CSV_COLUMNS:
        header = [cell.strip().lower() for cell in rows.pop(0)]
        missing = [name for name in CSV_COLUMNS[:2] if name not in header]
        if missing:
            raise InputFileError(f"{path}: header lacks column(s) {missing}")
        order = [header.index(name) for name in CSV_COLUMNS if name in header]
        rows = [[row[i] for i in order] for row in rows]
    try:
        table = np.array([[int(cell) for cell in row] for row in rows], np.int64)
    except (ValueError, OverflowError) as error:
        raise InputFileError(f"{path}: every cell must be an int64 ({error})") from None
    return posts_from_table(table, path)


def posts_from_table(table: np.ndarray, path: Path) -> Posts:
    """Rows of (post_id, author_id[, topic])."""
    if table.ndim != 2 or table.shape[1] not in (2, 3) or table.shape[0] == 0:
        raise InputFileError(f"{path}: expected N >= 1 rows of 2 or 3 columns, got {table.shape}")
    if not np.issubdtype(table.dtype, np.integer):
        raise InputFileError(f"{path}: expected integers, got {table.dtype}")
    table = table.astype(np.int64)
    topics = table[:, 2] if table.shape[1] == 3 else None
    return Posts(table[:, 0], table[:, 1], topics)


def read_npz(path: Path) -> Posts:
    with np.load(path, allow_pickle=False) as archive:
        missing = [key for key in NPZ_KEYS[:2] if key not in archive.files]
        if missing:
            raise InputFileError(f"{path}: missing array(s) {missing}; found {archive.files}")
        arrays = [archive[key] if key in archive.files else None for key in NPZ_KEYS]
    for key, array in zip(NPZ_KEYS, arrays, strict=True):
        if array is not None and (array.ndim != 1 or not np.issubdtype(array.dtype, np.integer)):
            raise InputFileError(f"{path}: '{key}' must be a 1-D integer array")
    if len({len(a) for a in arrays if a is not None}) != 1:
        raise InputFileError(f"{path}: post_ids, author_ids (and topics) differ in length")
    return Posts(*(None if a is None else a.astype(np.int64) for a in arrays))


def read_posts(path: Path) -> Posts:
    """Posts from a .csv, .npy or .npz file, checked for unique positive ids."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".csv":
            posts = read_csv(path)
        elif suffix == ".npy":
            posts = posts_from_table(np.load(path, allow_pickle=False), path)
        elif suffix == ".npz":
            posts = read_npz(path)
        else:
            raise InputFileError(f"{path}: unknown format '{suffix}' (use .csv, .npy or .npz)")
    except OSError as error:
        raise InputFileError(f"{path}: cannot read ({error})") from None
    check_posts(posts, str(path))
    return posts


def check_posts(posts: Posts, source: str) -> None:
    if np.any(posts.post_ids <= 0):
        raise InputFileError(f"{source}: post ids must be > 0, found {posts.post_ids.min()}")
    if np.any(posts.author_ids < 0):
        raise InputFileError(f"{source}: author ids must be >= 0")
    unique, counts = np.unique(posts.post_ids, return_counts=True)
    if len(unique) != len(posts):
        raise InputFileError(f"{source}: duplicate post ids, e.g. {unique[counts > 1][:5]}")


def generated_posts(count: int, seed: int) -> Posts:
    """``count`` random posts by a pool of count/10 authors (ids unique and positive)."""
    rng = np.random.default_rng(seed)
    post_ids = np.unique(rng.integers(1, 2**62, count + count // 10 + 16))[:count]
    rng.shuffle(post_ids)
    authors = rng.integers(1, 2**62, max(1, count // 10))
    return Posts(post_ids, authors[rng.integers(0, len(authors), len(post_ids))])


def world_posts(artifacts: Path, count: int, seed: Optional[int], now: int) -> Posts:
    """``count`` posts of the synthetic world in ARTIFACTS/training.json (the world the towers
    learned: its authors, topics and post ids), shifted in time so that the newest is ``now``
    (the world's own dates are in the past, where a window would expire them all)."""
    from phoenix.training.pipeline import TRAINING_FILE, trained_world

    path = Path(artifacts) / TRAINING_FILE
    if not path.is_file():
        raise InputFileError(
            f"{path}: not found (--from-generator needs trained artifacts, e.g. "
            "artifacts/trained-demo)"
        )
    try:
        world = trained_world(artifacts, count, seed)
    except ArtifactError as error:
        raise InputFileError(str(error)) from None
    created = world.post_created_ts + (now - int(world.post_created_ts.max()))
    authors = world.author_ids[world.post_author]
    return Posts(world.post_ids, authors, world.post_topic.astype(np.int64), created)


def source_posts(args) -> Posts:
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


def check_store_name(name: str) -> str:
    """A store is a plain directory name inside ARTIFACTS (where the retriever looks)."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or name.startswith("."):
        raise InputFileError(f"--store must be a plain directory name, got {name!r}")
    return name


# ----------------------------------------------------------------------------------------
# Embedding, checking, writing, reloading
# ----------------------------------------------------------------------------------------


def posts_bar(total: int, desc: str = "candidate_tower") -> tqdm:
    return tqdm(total=total, unit="post", desc=desc, file=sys.stderr)


def embed_posts(
    client, protocol: str, posts: Posts, batch_size: int, bar: Optional[tqdm] = None
) -> np.ndarray:
    """Unit candidate vectors [N, D] from the served candidate_tower, batch by batch (``bar``
    is updated, default: a bar of its own)."""
    parts = []
    with contextlib.nullcontext(bar) if bar is not None else posts_bar(len(posts)) as bar:
        for start in range(0, len(posts), batch_size):
            stop = min(len(posts), start + batch_size)
            arrays = {
                "post_id": posts.post_ids[start:stop, None],
                "author_id": posts.author_ids[start:stop, None],
            }
            out = infer(client, protocol, "candidate_tower", arrays, ["candidate_embedding"])
            parts.append(out["candidate_embedding"])
            bar.update(stop - start)
    return np.concatenate(parts).astype(np.float32)


def served_batch_limit(client, protocol: str, wanted: int) -> int:
    """--batch-size, capped at candidate_tower's max_batch_size."""
    limit = int(server_model_config(client, protocol, "candidate_tower").get("max_batch_size", 0))
    return max(1, min(wanted, limit) if limit > 0 else wanted)


def check_embeddings(args, client, posts: Posts, served: np.ndarray) -> int:
    models = cli.reference_models(args, client, "candidate_tower")
    expected = []
    for start in range(0, len(posts), REFERENCE_ROWS):
        rows = slice(start, start + REFERENCE_ROWS)
        arrays = {"post_id": posts.post_ids[rows, None], "author_id": posts.author_ids[rows, None]}
        expected.append(models.run("candidate_tower", arrays)["candidate_embedding"])
    problems = cli.compare_floats("candidate_embedding", served, np.concatenate(expected))
    return cli.report_check(problems, f"the served embeddings of {len(posts)} posts")


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
# Embedding: the server's candidate_tower, or the artifacts' own in this process
# ----------------------------------------------------------------------------------------

EmbedPosts = Callable[[Posts, tqdm], np.ndarray]  # posts, bar to update -> unit vectors [N, D]


def connect_server(args):
    """A client of the server (a long timeout: a big corpus reloads slowly); exits 3 if the
    server does not answer."""
    timeout = {"network_timeout": RELOAD_TIMEOUT_S} if args.protocol == "http" else {}
    try:
        return cli.open_client(args, **timeout)
    except Exception as error:  # tritonclient raises several types; all mean "no answer"
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None


def served_embedder(args, client) -> EmbedPosts:
    try:
        batch = served_batch_limit(client, args.protocol, args.batch_size)
    except Exception as error:
        raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None

    def embed(posts: Posts, bar: tqdm) -> np.ndarray:
        try:
            return embed_posts(client, args.protocol, posts, batch, bar)
        except Exception as error:
            raise cli.Exit(cli.no_answer(args, "candidate_tower", error)) from None

    return embed


def in_process_embedder(args) -> EmbedPosts:
    """ARTIFACTS' candidate tower in this process (phoenix.artifacts.CandidateTower)."""
    from phoenix.artifacts import CandidateTower

    try:
        tower = CandidateTower(args.artifacts)
    except ArtifactError as error:
        raise cli.Exit(cli.fail(str(error))) from None
    step = args.batch_size * IN_PROCESS_CALL_BATCHES  # posts per call, the bar moves between

    def embed(posts: Posts, bar: tqdm) -> np.ndarray:
        parts = []
        for start in range(0, len(posts), step):
            rows = slice(start, start + step)
            parts.append(tower(posts.post_ids[rows], posts.author_ids[rows], args.batch_size))
            bar.update(len(parts[-1]))
        return np.concatenate(parts)

    return embed


# ----------------------------------------------------------------------------------------
# Writing: a .npz corpus, or a corpus store of sealed segments
# ----------------------------------------------------------------------------------------


def write_corpus(args, name: str, posts: Posts, embed: EmbedPosts) -> np.ndarray:
    """ARTIFACTS/NAME as one .npz corpus; the embeddings (for --check)."""
    with posts_bar(len(posts)) as bar:
        embeddings = embed(posts, bar)
    path = Path(args.artifacts) / name
    try:
        save_corpus(path, Corpus(posts.post_ids, embeddings, posts.author_ids, posts.topics))
    except ArtifactError as error:
        raise cli.Exit(cli.fail(f"the corpus was not written: {error}")) from None
    print(f"wrote {path}: {len(posts)} posts, D = {embeddings.shape[1]}")
    return embeddings


def describe_index(spec) -> str:
    if spec.kind == "exact":
        return "exact (every post scored)"
    return f"{spec.kind}, nlist {spec.nlist}, nprobe {spec.nprobe}"


def write_store(args, name: str, posts: Posts, embed: EmbedPosts) -> Path:
    """ARTIFACTS/NAME as a corpus store: posts oldest first in sealed segments of
    --segment-rows. Built in a hidden directory and renamed when complete, so a retriever
    never opens half a store and a failed build leaves nothing behind."""
    final = Path(args.artifacts) / name
    if final.exists():
        raise cli.Exit(cli.fail(f"{final}: exists already (pick another --store or remove it)"))
    building = final.with_name(f".{name}.building-{os.getpid()}")
    created = posts.created_at
    if created is None:
        created = np.full(len(posts), int(time.time()), np.int64)
    order = np.argsort(created, kind="stable")
    parts = [order[i : i + args.segment_rows] for i in range(0, len(order), args.segment_rows)]
    try:
        store = None
        for number, rows in enumerate(parts, 1):
            label = f"segment {number}/{len(parts)}"
            part = posts.take(rows)
            with posts_bar(len(part), f"{label}: candidate_tower") as bar:
                vectors = embed(part, bar)
            if store is None:  # the width is known once the tower has answered
                store = CorpusStore.create(building, int(vectors.shape[1]), args.window)
            columns = StorePosts(part.post_ids, part.author_ids, created[rows], vectors)
            add_sealed(store, columns, label)
        os.rename(building, final)
    except ArtifactError as error:  # StoreError is one
        shutil.rmtree(building, ignore_errors=True)
        raise cli.Exit(cli.fail(f"the store was not written: {error}")) from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    window = cli.format_duration(args.window)
    print(f"wrote {final}: {len(posts):,} posts in {len(parts)} sealed segments, window {window}")
    return final


def add_sealed(store: CorpusStore, posts: StorePosts, label: str) -> None:
    """One sealed segment, its index chosen by size; a bar while a big index is built."""
    spec = choose_index(len(posts))
    print(f"{label}: {len(posts):,} posts, index {describe_index(spec)}", flush=True)
    if spec.kind == "exact":
        store.add(posts, state=SEALED, index=spec)
        return
    with posts_bar(len(posts), f"{label}: index") as bar:
        store.add(posts, state=SEALED, index=spec, progress=bar.update)


# ----------------------------------------------------------------------------------------
# The command
# ----------------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.run(build, parse_args(argv))


def build(args) -> int:
    try:
        if args.store:
            name = check_store_name(args.store)
        else:
            name = check_out_name(args.out or default_out_name(args))
        posts = source_posts(args)
    except InputFileError as error:
        return cli.fail(str(error))
    client = None if args.in_process else connect_server(args)
    embed = in_process_embedder(args) if args.in_process else served_embedder(args, client)
    status = 0
    if args.store:
        write_store(args, name, posts, embed)
    else:
        embeddings = write_corpus(args, name, posts, embed)
        if args.check:
            status = check_embeddings(args, client, posts, embeddings)
    if args.reload and status != 0:
        print("not reloading the retriever: --check failed", file=sys.stderr)
    elif args.reload:
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
