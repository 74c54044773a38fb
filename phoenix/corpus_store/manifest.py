"""The store's manifest: which segments are live, how each is searched, the deleted posts and
the time window. Readers take the manifest as the truth; writers write new files first and the
manifest last (atomically, by rename), so a reader sees either the old store or the new one.

Layout of a store directory::

    manifest.json                      this module's Manifest
    segments/<name>/post_ids.npy       int64 [n], unique, > 0
    segments/<name>/author_ids.npy     int64 [n]
    segments/<name>/created_at.npy     int64 [n], unix seconds
    segments/<name>/embeddings.npy     float32 [n, D], unit rows
    segments/<name>/sorted_ids.npy     int64 [n], post_ids ascending (id look-ups)
    segments/<name>/id_order.npy       int64 [n], the row of each sorted id
    segments/<name>/semantic_ids.npy   uint16 [n, L], segments holding semantic IDs only
    segments/<name>/index.faiss        sealed segments with an ANN index only
    tombstones/<name>.npy              int64 [t], sorted deleted post ids
    store.lock                         writers take it; readers never do
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional, Union

from phoenix.config import ArtifactError
from phoenix.corpus_store.semantic_ids import SemanticIdSpec, spec_of

MANIFEST_FILE = "manifest.json"
FORMAT = "phoenix-corpus-store/1"
FRESH, SEALED = "fresh", "sealed"
EXACT, IVF_SQ8, IVF_PQ4FS = "exact", "ivf_sq8", "ivf_pq4fs"  # how a segment is searched
INDEX_KINDS = (EXACT, IVF_SQ8, IVF_PQ4FS)


class StoreError(ArtifactError):
    """A corpus store is missing, malformed or inconsistent (the message names the file)."""


@dataclass(frozen=True)
class IndexSpec:
    """How a segment is searched: ``exact`` (every row scored) or an IVF index probed in
    ``nprobe`` of ``nlist`` lists, whose vectors are 8-bit scalar-quantized (``ivf_sq8``) or
    product-quantized into ``pq_m`` 4-bit codes scanned by Faiss' fast-scan (``ivf_pq4fs``).

    Query-adaptive probing (``ann.lists_to_probe``): a user whose best list centroid scores
    ``s`` below ``probe_score`` sits between clusters, and probes ``nprobe * exp(probe_slope *
    (probe_score - s) + probe_mean_weight * m)`` lists, at most ``max_nprobe``, m its mean score
    over all the centroids (a user facing the corpus' dense middle finds its best posts spread
    over more lists). ``rerank``: the index is asked for
    ``rerank`` times the rows wanted, re-scored exactly in float32 (0: the index's quantized
    scores as they are). Stores written before these fields load with them absent: ``max_nprobe`` =
    ``nprobe``, no re-rank, no mean-score term, as they were searched then."""

    kind: str = EXACT
    nlist: int = 0
    nprobe: int = 0
    max_nprobe: int = 0  # 0: nprobe (no adaptive probing)
    probe_score: float = 0.0
    probe_slope: float = 0.0
    rerank: int = 0
    pq_m: int = 0  # ivf_pq4fs only: 4-bit codes per vector
    # ivf_pq4fs only: 2 when every post is in two lists (``ann.spill_lists``); 0: one, as
    # every store written before 2026-11-26's spilled assignment
    lists_per_post: int = 0
    probe_mean_weight: float = 0.0  # 0: the best centroid's score alone, as before 2026-11-27

    @property
    def spilled(self) -> bool:
        return self.lists_per_post == 2

    @property
    def most_probed(self) -> int:
        return max(self.nprobe, self.max_nprobe)

    def to_dict(self) -> dict[str, Any]:
        if self.kind == EXACT:
            return {"kind": self.kind}
        return {k: v for k, v in asdict(self).items() if v or k in ("kind", "nlist", "nprobe")}


@dataclass(frozen=True)
class SegmentEntry:
    name: str
    state: str  # FRESH (small, searched exactly) or SEALED (compacted, maybe indexed)
    rows: int
    min_created_at: int
    max_created_at: int
    index: IndexSpec = field(default_factory=IndexSpec)
    semantic_ids: bool = False  # the segment keeps its posts' semantic IDs (semantic_ids.npy)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["index"] = self.index.to_dict()
        if not self.semantic_ids:  # as segments were written before they could hold them
            del out["semantic_ids"]
        return out


@dataclass(frozen=True)
class Retired:
    """A segment or tombstone file no longer live: deleted by compaction after a grace period
    (a reader that read the previous manifest may still be opening it)."""

    path: str  # relative to the store
    since: float  # unix seconds


@dataclass(frozen=True)
class EmbeddedBy:
    """The candidate tower whose vectors a store holds: its digest
    (``phoenix.checkpoint.tower``), and, to say in messages, the artifacts' version label and
    the directory it was read from when the store was made."""

    digest: str  # sha256 hex of the candidate tower
    version: Optional[Union[str, int]] = None
    artifacts: str = ""

    def describe(self) -> str:
        version = "unversioned" if self.version is None else f"version {self.version!r}"
        where = f", artifacts {self.artifacts}" if self.artifacts else ""
        return f"candidate tower {self.digest[:16]} ({version}{where})"

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "version": self.version, "artifacts": self.artifacts}


@dataclass(frozen=True)
class Manifest:
    emb_size: int
    generation: int = 0
    segments: tuple[SegmentEntry, ...] = ()
    tombstones: Optional[str] = None  # file under tombstones/, None = no deletions
    window_seconds: Optional[int] = None  # posts older than this are not served
    retired: tuple[Retired, ...] = ()
    updated_at: float = 0.0
    # Every generation says which tower embedded its vectors; None: a store written before
    # stores recorded it (docs/retrieval.md, "Which tower embedded this store").
    embedded_by: Optional[EmbeddedBy] = None
    # The width of the posts' semantic IDs (a store written before it was recorded: the
    # defaults, phoenix.feed_features')
    semantic_ids: SemanticIdSpec = SemanticIdSpec()

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.segments)

    def next(self, **changes) -> Manifest:
        """The following generation with ``changes``."""
        return replace(self, generation=self.generation + 1, updated_at=time.time(), **changes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "generation": self.generation,
            "emb_size": self.emb_size,
            "embedded_by": None if self.embedded_by is None else self.embedded_by.to_dict(),
            "semantic_ids": self.semantic_ids.to_dict(),
            "window_seconds": self.window_seconds,
            "tombstones": self.tombstones,
            "segments": [s.to_dict() for s in self.segments],
            "retired": [asdict(r) for r in self.retired],
            "updated_at": self.updated_at,
        }


def _field(data: dict, key: str, kind, where: str):
    value = data.get(key)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        expected = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise StoreError(f"{where}: '{key}' is {value!r}, expected {expected}")
    return value


def _index_spec(data: Any, where: str) -> IndexSpec:
    if not isinstance(data, dict):
        raise StoreError(f"{where}: 'index' is {data!r}, expected an object")
    kind = data.get("kind")
    if kind == EXACT:
        return IndexSpec()
    if kind not in INDEX_KINDS:
        expected = ", ".join(repr(k) for k in INDEX_KINDS)
        raise StoreError(f"{where}: index kind {kind!r}, expected one of {expected}")
    nlist, nprobe = _field(data, "nlist", int, where), _field(data, "nprobe", int, where)
    if not 1 <= nprobe <= nlist:
        raise StoreError(f"{where}: nprobe {nprobe} must lie in [1, nlist={nlist}]")
    optional = lambda key, kind: _field(data, key, kind, where) if key in data else 0  # noqa: E731
    max_nprobe = optional("max_nprobe", int)
    if max_nprobe and not nprobe <= max_nprobe <= nlist:
        raise StoreError(f"{where}: max_nprobe {max_nprobe} must lie in [nprobe, nlist={nlist}]")
    rerank = optional("rerank", int)
    if rerank < 0:
        raise StoreError(f"{where}: rerank {rerank}, expected >= 0")
    pq_m = _field(data, "pq_m", int, where) if kind == IVF_PQ4FS else 0
    if kind == IVF_PQ4FS and pq_m < 1:
        raise StoreError(f"{where}: pq_m {pq_m}, expected >= 1 (4-bit codes per vector)")
    lists_per_post = optional("lists_per_post", int)
    if lists_per_post not in (0, 1, 2) or lists_per_post == 2 and (kind != IVF_PQ4FS or not rerank):
        raise StoreError(
            f"{where}: lists_per_post {lists_per_post}, expected 1, or 2 for an {IVF_PQ4FS!r} "
            "index with a re-rank (repeats of a post are dropped after re-scoring)"
        )
    return IndexSpec(
        kind,
        nlist,
        nprobe,
        max_nprobe,
        float(optional("probe_score", (int, float))),
        float(optional("probe_slope", (int, float))),
        rerank,
        pq_m,
        lists_per_post if lists_per_post == 2 else 0,
        float(optional("probe_mean_weight", (int, float))),
    )


def _embedded_by(data: Any, where: str) -> Optional[EmbeddedBy]:
    if data is None:
        return None
    if not isinstance(data, dict):
        raise StoreError(f"{where}: 'embedded_by' is {data!r}, expected an object or null")
    digest = _field(data, "digest", str, where)
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise StoreError(f"{where}: 'embedded_by' digest {digest!r}, expected 64 hex digits")
    version = data.get("version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
        raise StoreError(f"{where}: 'embedded_by' version {version!r}, expected a string or int")
    return EmbeddedBy(digest, version, str(data.get("artifacts", "")))


def _segment_entry(data: Any, where: str) -> SegmentEntry:
    if not isinstance(data, dict):
        raise StoreError(f"{where}: a segment is {data!r}, expected an object")
    name = _field(data, "name", str, where)
    where = f"{where}, segment {name!r}"
    if not name or "/" in name or name.startswith("."):
        raise StoreError(f"{where}: a segment name is a plain directory name")
    state = data.get("state")
    if state not in (FRESH, SEALED):
        raise StoreError(f"{where}: state {state!r}, expected '{FRESH}' or '{SEALED}'")
    entry = SegmentEntry(
        name,
        state,
        _field(data, "rows", int, where),
        _field(data, "min_created_at", int, where),
        _field(data, "max_created_at", int, where),
        _index_spec(data.get("index", {"kind": EXACT}), where),
        _field(data, "semantic_ids", bool, where) if "semantic_ids" in data else False,
    )
    if entry.rows < 1:
        raise StoreError(f"{where}: rows {entry.rows}, expected >= 1")
    return entry


def parse_manifest(data: Any, where: str) -> Manifest:
    """A Manifest from its JSON form, every field checked (``where`` names the file)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise StoreError(f"{where}: format {found!r}, expected {FORMAT!r}")
    emb_size = _field(data, "emb_size", int, where)
    window = data.get("window_seconds")
    if window is not None and (not isinstance(window, int) or window <= 0):
        raise StoreError(f"{where}: 'window_seconds' is {window!r}, expected null or > 0")
    tombstones = data.get("tombstones")
    if tombstones is not None and not isinstance(tombstones, str):
        raise StoreError(f"{where}: 'tombstones' is {tombstones!r}, expected null or a name")
    segments = tuple(_segment_entry(s, where) for s in _field(data, "segments", list, where))
    names = [s.name for s in segments]
    if len(set(names)) != len(names):
        raise StoreError(f"{where}: a segment is listed twice ({names})")
    retired = tuple(Retired(str(r["path"]), float(r["since"])) for r in data.get("retired", []))
    try:
        semantic_ids = spec_of(data.get("semantic_ids"), where)
    except ValueError as error:
        raise StoreError(str(error)) from None
    return Manifest(
        emb_size=emb_size,
        generation=_field(data, "generation", int, where),
        segments=segments,
        tombstones=tombstones,
        window_seconds=window,
        retired=retired,
        updated_at=float(data.get("updated_at", 0.0)),
        embedded_by=_embedded_by(data.get("embedded_by"), where),
        semantic_ids=semantic_ids,
    )


def read_manifest(root: Path) -> Manifest:
    """The manifest of the store at ``root``; StoreError naming the file if it is unusable."""
    path = Path(root) / MANIFEST_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise StoreError(f"{path}: not found (is {root} a corpus store?)") from None
    except OSError as error:
        raise StoreError(f"{path}: cannot be read ({error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise StoreError(f"{path}: not valid JSON ({error})") from None
    return parse_manifest(data, str(path))


def write_manifest(root: Path, manifest: Manifest) -> None:
    """Replace the manifest atomically: a reader sees the old one or this one, whole."""
    path = Path(root) / MANIFEST_FILE
    tmp = path.with_name(f".{MANIFEST_FILE}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as out:
        json.dump(manifest.to_dict(), out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
