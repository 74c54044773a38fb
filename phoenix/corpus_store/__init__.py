"""A corpus store: the retrieval corpus as immutable segments in a directory, a manifest saying
which are live, an ANN index per sealed segment, tombstones and a time window
(docs/retrieval.md). ``CorpusStore`` writes it, ``Snapshot`` searches one generation of it,
``StoreFollower`` keeps a serving process on the newest generation. Writing one from posts:
``building`` (a whole store, or a corpus file, at once), ``ingestion`` (JSON lines as they
come), both embedding through ``embedding`` (the server's candidate tower or this process').

May import the model layer, the checkpoint and ``phoenix.util``; the embedding of
posts comes in as a callable (``EmbedPosts``), so no client or server is imported here.
"""

from pathlib import Path

from phoenix.corpus_store.ann import choose_index
from phoenix.corpus_store.follow import StoreFollower
from phoenix.corpus_store.manifest import (
    FRESH,
    MANIFEST_FILE,
    SEALED,
    IndexSpec,
    Manifest,
    StoreError,
    read_manifest,
)
from phoenix.corpus_store.segment import Posts
from phoenix.corpus_store.snapshot import Hits, Snapshot
from phoenix.corpus_store.store import CompactReport, CorpusStore


def is_store(path) -> bool:
    """Whether ``path`` is a store directory (it holds a manifest)."""
    return (Path(path) / MANIFEST_FILE).is_file()


__all__ = [
    "FRESH",
    "MANIFEST_FILE",
    "SEALED",
    "CompactReport",
    "CorpusStore",
    "Hits",
    "IndexSpec",
    "Manifest",
    "Posts",
    "Snapshot",
    "StoreError",
    "StoreFollower",
    "choose_index",
    "is_store",
    "read_manifest",
]
