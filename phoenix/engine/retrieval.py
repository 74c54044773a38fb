"""Retrieval: jitted user and candidate towers, and exact top-k over a device-resident corpus.

The corpus is held in the compute dtype (``corpus_encoding="float"``, the default) or as int8
codes (``"int8"``): a quarter of the bytes to read per query (1.9x the queries/s over 1 M
posts on 2 CPU cores), which choose k + a margin candidates that exact float32 scores, from a
host copy, then rank. Its ids are the float corpus' unless int8 errors (about 1e-3 on unit
vectors) move an entry across that margin: recall@100 1.0 on the trained demo's towers over
1 M posts (bench/results/engine.json, docs/performance.md).

Shape glossary
  B  users in a call (padded to a batch bucket)   D  emb_size   M  corpus size
  k  top-k bucket   n  candidates embedded in one call
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple, Optional

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from phoenix.engine.batching import (
    DEFAULT_BATCH_BUCKETS,
    DEFAULT_TOP_K_BUCKETS,
    batch_slices,
    bucket_for,
    default_compute_dtype,
    example_inputs,
    pad_axis,
    take_users,
)
from phoenix.engine.programs import Program, ProgramStore
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.recsys_retrieval_model import (
    INF,
    PhoenixRetrievalModelConfig,
    candidate_tower_mlp,
    l2_normalize,
)


class CorpusTiles(NamedTuple):
    """A corpus on the device, zero-padded to whole tiles.

    Encoded "float", ``tiles`` holds the vectors in the compute dtype. Encoded "int8", it
    holds int8 codes and ``scales`` one float32 scale per row (vector ~ codes x scale): a
    quarter of the bytes to read per query, but approximate scores, so ``exact`` keeps the
    float32 vectors on the host to re-score the best candidates (``rerank``).
    """

    tiles: jax.Array  # [n, tile, D] in the compute dtype, or int8 codes
    size: int  # M, the real entries (the rest is padding)
    scales: Optional[jax.Array] = None  # [n, tile] float32 row scales of int8 codes
    exact: Optional[np.ndarray] = None  # [M, D] float32 on the host, with int8 codes


# Corpora up to this many rows are scored as one tile: a single top-k beats merging tiles.
ONE_TILE_ROWS = 262_144
SCORE_BIN = 128  # entries per bin of top-k's first pass (RetrievalEngine._top_k_fn)
# Rows per bin of the int8 top-k's first pass (RetrievalEngine._int8_top_k_fn): its second
# pass scores the rows of k bins again, so small bins (16 x 64 bytes at D = 64) keep that
# cheap; 8 gave the same speed, 32 one a third slower (1 M posts, 2 cores).
INT8_BIN = 16
CORPUS_ENCODINGS = ("float", "int8")  # RetrievalEngine(corpus_encoding=...)


# On a GPU, the scores of one tile for the largest batch may take this much device memory.
DEVICE_SCORE_BYTES = 4 << 30


def whole_bins(rows: int) -> int:
    """``rows`` rounded up to whole bins of SCORE_BIN (at least one)."""
    return max(SCORE_BIN, -(-rows // SCORE_BIN) * SCORE_BIN)


def default_corpus_tile(
    size: int, max_batch: int = DEFAULT_BATCH_BUCKETS[-1], backend: Optional[str] = None
) -> int:
    """Rows per tile: the whole corpus up to ONE_TILE_ROWS; beyond, 16 k rows on CPUs, where
    a [users, tile] block of scores stays in the caches. On other backends (GPUs), as few
    tiles as keep ``max_batch`` users' float32 scores of one within DEVICE_SCORE_BYTES, of
    even size (padding under a bin per tile): on an H200 (64 users,
    bench/results/gpu/topk-diag.json) the device program ran 1.5x as fast over 1 M posts as
    one tile than as tiles of ONE_TILE_ROWS, 2.3x over 10 M."""
    if size <= ONE_TILE_ROWS:
        return whole_bins(size)
    if (backend or jax.default_backend()) == "cpu":
        return 16_384
    fits = max(ONE_TILE_ROWS, DEVICE_SCORE_BYTES // (4 * max_batch) // SCORE_BIN * SCORE_BIN)
    tiles = -(-size // fits)
    return whole_bins(-(-size // tiles))


def corpus_tiles(embeddings: np.ndarray, tile: int, dtype) -> CorpusTiles:
    """``embeddings`` [M, D] as device tiles of ``tile`` rows, the last one zero-padded."""
    size = embeddings.shape[0]
    tile = min(tile, whole_bins(size))
    count = max(1, -(-size // tile))
    padded = pad_axis(embeddings, 0, count * tile).reshape(count, tile, -1)
    return CorpusTiles(jnp.asarray(padded, dtype), size)


def int8_rows(embeddings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes [M, D] and float32 scales [M] (max |x| / 127) of each row."""
    embeddings = np.asarray(embeddings, np.float32)
    largest = np.abs(embeddings).max(axis=1, initial=0.0)  # [M]
    scales = np.where(largest > 0, largest / 127, 1).astype(np.float32)  # a zero row: any
    codes = np.clip(np.rint(embeddings / scales[:, None]), -127, 127).astype(np.int8)
    return codes, scales


def int8_corpus_tiles(embeddings: np.ndarray, tile: int) -> CorpusTiles:
    """``embeddings`` [M, D] as int8 device tiles with row scales, tiles a whole number of
    INT8_BIN rows, and the float32 vectors on the host."""
    exact = np.ascontiguousarray(embeddings, np.float32)  # [M, D]; not copied if float32
    codes, scales = int8_rows(exact)
    tiled = corpus_tiles(codes, -(-tile // INT8_BIN) * INT8_BIN, jnp.int8)
    count, tile = tiled.tiles.shape[:2]
    scales = pad_axis(scales, 0, count * tile).reshape(count, tile)  # [n, tile]
    return tiled._replace(scales=jnp.asarray(scales), exact=exact)


def rerank(users, corpus, candidates, approximate, k):
    """The best ``k`` of each user's ``candidates`` by exact float32 scores.

    users [B, D] and corpus [M, D] float32; candidates [B, c] corpus indices and
    ``approximate`` [B, c] the scores they were chosen by, -INF for padding and excluded
    entries: those keep -INF, so they come last as in the float corpus' top-k. Returns
    indices and scores [B, k], best first, equal scores by lower index (the float corpus'
    order).
    """
    rows = np.minimum(candidates, len(corpus) - 1)  # [B, c]; padding rows masked below
    # einsum's own loop sums every row in one order: equal rows get equal scores (a tie)
    scores = np.einsum("bcd,bd->bc", corpus[rows], users)  # [B, c]
    scores = np.where(approximate <= np.float32(-INF), approximate, scores).astype(np.float32)
    order = np.lexsort((candidates, -scores), axis=1)[:, :k]  # [B, k]: score, then index
    return np.take_along_axis(candidates, order, 1), np.take_along_axis(scores, order, 1)


def local_excluded(excluded, first: int, tile: int):
    """Excluded indices [B, E] (-1 = none) as positions in the tile starting at ``first``;
    ``tile`` (out of range, dropped by a scatter) for those outside it."""
    local = excluded - first  # [B, E]
    return jnp.where((excluded >= 0) & (local >= 0) & (local < tile), local, tile)


def mask_excluded_in_bins(scores, bins, excluded, width: int):
    """``scores`` [B, k x width] of the rows of ``bins`` [B, k] (sorted, ``width`` rows
    each) with each user's ``excluded`` [B, E] indices (-1 = none) set to -INF.

    Each excluded index looks for its bin among the k (a binary search), rather than each
    of the k x width rows among the E excluded indices.
    """
    batch, chosen = bins.shape
    home = excluded // width  # [B, E] the bin of each excluded index
    find = jax.vmap(lambda b, h: jnp.searchsorted(b, h, method="scan_unrolled"))
    position = jnp.minimum(find(bins, home), chosen - 1)  # [B, E]
    found = (jnp.take_along_axis(bins, position, axis=1) == home) & (excluded >= 0)
    target = jnp.where(found, position * width + excluded % width, chosen * width)  # [B, E]
    return scores.at[jnp.arange(batch)[:, None], target].set(-INF, mode="drop")


def padded_index_lists(lists: Optional[Sequence[np.ndarray]], rows: int, width: int):
    """Per-row index arrays as one int32 [rows, width] array padded with -1."""
    out = np.full((rows, width), -1, np.int32)
    for r, indices in enumerate(lists or ()):
        if len(indices) > width:
            raise ValueError(f"row {r} excludes {len(indices)} entries, more than {width}")
        out[r, : len(indices)] = indices
    return out


class RetrievalEngine:
    """Jitted user tower, candidate tower and exact top-k over a corpus."""

    def __init__(
        self,
        config: PhoenixRetrievalModelConfig,
        params,
        *,
        compute_dtype=None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        top_k_buckets: Sequence[int] = DEFAULT_TOP_K_BUCKETS,
        candidate_chunk: int = 256,
        corpus_tile: Optional[int] = None,
        max_excluded: int = 4096,
        corpus_encoding: str = "float",
        rerank_margin: int = 100,
        store: Optional[ProgramStore] = None,
        num_actions: int = 19,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        # the histories' action width (the artifacts' num_actions): warm-up's example users
        self.num_actions = num_actions
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.params = jax.device_put(params)  # moved once, not with every call
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.top_k_buckets = tuple(sorted(top_k_buckets))
        self.candidate_chunk = candidate_chunk
        self.corpus_tile = corpus_tile  # None: default_corpus_tile of each corpus
        # One fixed width for the excluded-index lists: one compiled shape whatever a user saw.
        self.max_excluded = max_excluded
        if corpus_encoding not in CORPUS_ENCODINGS:
            raise ValueError(f"corpus_encoding {corpus_encoding!r}: one of {CORPUS_ENCODINGS}")
        self.corpus_encoding = corpus_encoding
        # int8 corpora: candidates beyond k re-scored exactly, room for the entries whose
        # int8 scores rank them a little too low
        self.rerank_margin = rerank_margin
        model = lambda: self.config.make()  # noqa: E731
        apply = lambda fn: hk.without_apply_rng(hk.transform(fn)).apply  # noqa: E731
        settings = {"dtype": jnp.dtype(self.dtype).name}
        self._users = Program(
            "user_tower",
            apply(lambda b, e: model().build_user_representation(b, e)[0]),
            store,
            settings=settings,
        )
        tower = "phoenix_retrieval_model/~build_candidate_representation/candidate_tower"
        self._tower = params.get(tower)
        self._candidates = Program("candidate_tower", self._candidate_fn, store, settings=settings)
        self._top_k = Program("top_k", self._top_k_fn, store, static_argnames=("k",))
        self._int8_top_k = Program("int8_top_k", self._int8_top_k_fn, store, static_argnames=("k",))
        self.corpus: Optional[CorpusTiles] = None

    def _candidate_fn(self, tower, post_emb, author_emb):
        stacked = jnp.concatenate([post_emb, author_emb], axis=-2)  # [n, h, D]
        if tower is None:  # mean-pooling tower: no parameters
            return l2_normalize(jnp.mean(stacked.astype(jnp.float32), axis=-2))
        w1, w2 = tower["candidate_tower_projection_1"], tower["candidate_tower_projection_2"]
        return candidate_tower_mlp(stacked.reshape(stacked.shape[0], -1), w1, w2)  # [n, D]

    @staticmethod
    def _top_k_fn(users, tiles, size, excluded, k):
        """Exact top-k of users [B, D] over corpus tiles [n, tile, D], in two passes.

        Pass 1 scores one tile at a time ([B, tile] instead of [B, M] at once), masks padding
        and each user's excluded indices ``excluded`` [B, E] (-1 = none), and keeps the scores
        in bins of SCORE_BIN entries with each bin's maximum. Pass 2 takes the k bins with the
        highest maxima, in corpus order, and the top k inside them: each of the k best entries
        lies in one of those bins, so the result is exact, and two small top-ks replace a
        top-k and a merge per tile (84 -> 184 queries/s over 1 M posts on 2 cores,
        bench/results/engine.json). Ties keep
        the lower index, as one top-k over the whole corpus does. The first pass holds every
        score until the second: B x M float32 (64 MB for 16 users over 1 M posts).
        """
        users = users.astype(tiles.dtype)
        batch, tile = users.shape[0], tiles.shape[1]
        width = SCORE_BIN if tile % SCORE_BIN == 0 else tile  # one bin per odd-sized tile
        user_rows = jnp.arange(batch)[:, None]  # [B, 1]

        def score_tile(_, t):
            first = t * tile
            scores = jnp.dot(users, tiles[t].T).astype(jnp.float32)  # [B, tile]
            index = first + jnp.arange(tile)  # [tile]
            scores = jnp.where(index[None] < size, scores, -INF)
            local = local_excluded(excluded, first, tile)  # [B, E]
            scores = scores.at[user_rows, local].set(-INF, mode="drop")
            binned = scores.reshape(batch, tile // width, width)  # [B, b, width]
            return None, (binned, binned.max(axis=-1))

        _, (binned, maxima) = jax.lax.scan(score_tile, None, jnp.arange(tiles.shape[0]))
        count, _, per_tile, _ = binned.shape  # binned [n, B, b, width], maxima [n, B, b]
        maxima = jnp.transpose(maxima, (1, 0, 2)).reshape(batch, count * per_tile)  # [B, nb]
        chosen = min(k, count * per_tile)
        _, bins = jax.lax.top_k(maxima, chosen)  # [B, k'] the bins holding the k best
        bins = jnp.sort(bins, axis=1)  # corpus order: ties keep the lower index
        picked = binned[bins // per_tile, user_rows, bins % per_tile]  # [B, k', width]
        scores, position = jax.lax.top_k(picked.reshape(batch, chosen * width), k)  # [B, k]
        bin_of = jnp.take_along_axis(bins, position // width, axis=1)
        return scores, (bin_of * width + position % width).astype(jnp.int32)

    @staticmethod
    def _int8_top_k_fn(users, codes, scales, size, excluded, k):
        """The best k entries by int8 scores of users [B, D] over int8 tiles ``codes``
        [n, tile, D] with row ``scales`` [n, tile], in two passes; approximate scores, which
        ``rerank`` replaces by exact ones.

        Pass 1 scores one tile at a time, as [tile, B] (a bin's maximum is then an
        elementwise max of rows of B scores), masks padding and each user's ``excluded``
        [B, E] indices (-1 = none), and keeps only the maximum of every INT8_BIN rows:
        writing every score, as the float top-k does (B x M float32, 64 MB for 16 users over
        1 M posts), cost about as much as the scoring. Pass 2 takes the k bins with the
        highest maxima (each of the k best entries lies in one), scores their rows again from
        the codes, masks the same entries and keeps the top k.
        """
        count, tile, dim = codes.shape
        batch, per_tile = users.shape[0], tile // INT8_BIN
        user_rows = jnp.arange(batch)[:, None]  # [B, 1]

        def score_tile(_, t):
            first = t * tile
            rows = codes[t].astype(jnp.float32)  # [tile, D]: converted in cache
            scores = jnp.dot(rows, users.T) * scales[t][:, None]  # [tile, B]
            index = first + jnp.arange(tile)  # [tile]
            scores = jnp.where(index[:, None] < size, scores, -INF)
            local = local_excluded(excluded, first, tile)  # [B, E]
            scores = scores.at[local, user_rows].set(-INF, mode="drop")
            return None, scores.reshape(per_tile, INT8_BIN, batch).max(axis=1)  # [b, B]

        _, maxima = jax.lax.scan(score_tile, None, jnp.arange(count))  # [n, b, B]
        maxima = maxima.reshape(count * per_tile, batch).T  # [B, nb]
        chosen = min(k, count * per_tile)
        _, bins = jax.lax.top_k(maxima, chosen)  # [B, k'] the bins holding the k best
        bins = jnp.sort(bins, axis=1)  # for mask_excluded_in_bins' search
        rows = jnp.take(codes.reshape(-1, INT8_BIN, dim), bins, axis=0)  # [B, k', bin, D]
        rows = rows.reshape(batch, chosen * INT8_BIN, dim).astype(jnp.float32)  # [B, c, D]
        row_scales = jnp.take(scales.reshape(-1, INT8_BIN), bins, axis=0)  # [B, k', bin]
        scores = jnp.einsum("bcd,bd->bc", rows, users) * row_scales.reshape(batch, -1)
        index = bins[:, :, None] * INT8_BIN + jnp.arange(INT8_BIN)  # [B, k', bin]
        index = index.reshape(batch, chosen * INT8_BIN)  # [B, c]
        scores = jnp.where(index < size, scores, -INF)  # [B, c]
        scores = mask_excluded_in_bins(scores, bins, excluded, INT8_BIN)
        scores, position = jax.lax.top_k(scores, k)  # [B, k]
        return scores, jnp.take_along_axis(index, position, axis=1)

    def encode_users(self, batch: RecsysBatch, emb: RecsysEmbeddings) -> np.ndarray:
        """Unit user vectors [B, D] (float32)."""
        out = []
        pad = lambda x, to: pad_axis(np.asarray(x), 0, to)  # noqa: E731
        hashes = self.config.hash_config
        assert hashes is not None  # set by the config's __post_init__
        for rows, pad_to in batch_slices(
            np.asarray(batch.user_hashes).shape[0], self.batch_buckets
        ):
            sub_b, sub_e = take_users(batch, emb, rows)
            # The user tower reads no candidate or optional field: give it one fixed
            # structure (dtype and shape) so that warm-up compiles what serving runs.
            sub_b = RecsysBatch(
                user_hashes=pad(np.asarray(sub_b.user_hashes, np.int32), pad_to),
                history_post_hashes=pad(np.asarray(sub_b.history_post_hashes, np.int32), pad_to),
                history_author_hashes=pad(
                    np.asarray(sub_b.history_author_hashes, np.int32), pad_to
                ),
                history_actions=pad(np.asarray(sub_b.history_actions, np.float32), pad_to),
                history_product_surface=pad(
                    np.asarray(sub_b.history_product_surface, np.int32), pad_to
                ),
                candidate_post_hashes=np.zeros((pad_to, 1, hashes.num_item_hashes), np.int32),
                candidate_author_hashes=np.zeros((pad_to, 1, hashes.num_author_hashes), np.int32),
                candidate_product_surface=np.zeros((pad_to, 1), np.int32),
            )
            d = self.config.emb_size
            sub_e = RecsysEmbeddings(
                user_embeddings=pad(np.asarray(sub_e.user_embeddings, np.float32), pad_to),
                history_post_embeddings=pad(
                    np.asarray(sub_e.history_post_embeddings, np.float32), pad_to
                ),
                history_author_embeddings=pad(
                    np.asarray(sub_e.history_author_embeddings, np.float32), pad_to
                ),
                candidate_post_embeddings=np.zeros(
                    (pad_to, 1, hashes.num_item_hashes, d), np.float32
                ),
                candidate_author_embeddings=np.zeros(
                    (pad_to, 1, hashes.num_author_hashes, d), np.float32
                ),
            )
            users = np.asarray(self._users(self.params, sub_b, sub_e), np.float32)
            out.append(users[: rows.stop - rows.start])
        return np.concatenate(out) if out else np.zeros((0, self.config.emb_size), np.float32)

    def encode_candidates(self, post_emb: np.ndarray, author_emb: np.ndarray) -> np.ndarray:
        """Unit candidate vectors [n, D] from hash embeddings [n, nI, D] and [n, nA, D]."""
        n, chunk = post_emb.shape[0], self.candidate_chunk
        out = []
        for start in range(0, n, chunk):
            p = pad_axis(post_emb[start : start + chunk], 0, chunk)
            a = pad_axis(author_emb[start : start + chunk], 0, chunk)
            out.append(np.asarray(self._candidates(self._tower, p, a), np.float32))
        if not out:
            return np.zeros((0, self.config.emb_size), np.float32)
        return np.concatenate(out)[:n]

    def set_corpus(self, embeddings: np.ndarray) -> None:
        """Place the corpus [M, D] on the device in tiles: in the compute dtype, or as int8
        codes with ``embeddings`` kept (not copied, so left unchanged) to re-rank."""
        embeddings = np.asarray(embeddings)
        size, largest = embeddings.shape[0], self.batch_buckets[-1]
        tile = self.corpus_tile or default_corpus_tile(size, largest)
        if self.corpus_encoding == "int8":
            self.corpus = int8_corpus_tiles(embeddings, tile)
        else:
            self.corpus = corpus_tiles(embeddings, tile, self.dtype)

    def _held_corpus(self) -> CorpusTiles:
        if self.corpus is None:
            raise ValueError("no corpus set")
        return self.corpus

    def _device_k(self, k: int) -> int:
        """Entries the device's top-k returns when ``k`` are asked for: a top-k bucket (one
        program each); with int8 codes ``rerank_margin`` more, to re-score exactly."""
        corpus = self._held_corpus()
        buckets, size = self.top_k_buckets, corpus.size
        if corpus.scales is None:
            return min(bucket_for(k, buckets), size)
        wanted = min(k, buckets[-1]) + self.rerank_margin
        if wanted > buckets[-1]:  # one program past the largest bucket
            return min(buckets[-1] + self.rerank_margin, size)
        return min(bucket_for(wanted, buckets), size)

    def _top_k_program(self) -> tuple[Program, tuple]:
        """The device's top-k program for the corpus held, and the corpus arrays it reads."""
        corpus = self._held_corpus()
        if corpus.scales is None:
            return self._top_k, (corpus.tiles,)
        return self._int8_top_k, (corpus.tiles, corpus.scales)

    def _device_top_k(self, users, excluded, k: int):
        """Scores and indices [B, k] of the device's top-k over the corpus, best first."""
        program, arrays = self._top_k_program()
        return program(users, *arrays, np.int32(self._held_corpus().size), excluded, k=k)

    def top_k(
        self,
        users: np.ndarray,
        k: int,
        exclude: Optional[np.ndarray] = None,
        exclude_indices: Optional[Sequence[np.ndarray]] = None,
    ):
        """Best ``k`` corpus indices and scores per user [B, k'] (k' = min(k, M)), best first.

        Entries a user must not get (e.g. already seen) are given either as ``exclude``
        [B, M] bool or, cheaper for big corpora, as ``exclude_indices`` (one index array per
        user). With int8 codes the device returns ``rerank_margin`` more candidates and the
        best k of them by exact float32 scores come back (``rerank``).
        """
        corpus = self._held_corpus()
        size = corpus.size
        k = min(k, size, bucket_for(k, self.top_k_buckets))  # at most the largest bucket
        kb = self._device_k(k)
        if exclude is not None:
            exclude_indices = [np.flatnonzero(row) for row in exclude]
        excluded = padded_index_lists(exclude_indices, users.shape[0], self.max_excluded)
        indices, scores = [], []
        for rows, pad_to in batch_slices(users.shape[0], self.batch_buckets):
            part = np.asarray(users[rows], np.float32)  # [b, D]
            s, i = self._device_top_k(
                pad_axis(part, 0, pad_to), pad_axis(excluded[rows], 0, pad_to), kb
            )
            n = rows.stop - rows.start
            i, s = np.asarray(i)[:n], np.asarray(s)[:n]  # [b, kb]
            if corpus.exact is not None:  # int8 codes: exact scores of the best kb
                i, s = rerank(part, corpus.exact, i, s, k)
            indices.append(i[:, :k])
            scores.append(s[:, :k])
        if not indices:
            return np.zeros((0, k), np.int32), np.zeros((0, k), np.float32)
        return np.concatenate(indices), np.concatenate(scores)

    def warm_up_users(self) -> int:
        """The user tower for every batch bucket; returns how many programs."""
        for rows in self.batch_buckets:
            self.encode_users(*example_inputs(self.config, rows, 1, num_actions=self.num_actions))
        return len(self.batch_buckets)

    def warm_up_candidates(self) -> int:
        """The candidate tower's one chunk program."""
        hashes, d = self.config.hash_config, self.config.emb_size
        assert hashes is not None  # set by the config's __post_init__
        self.encode_candidates(
            np.zeros((1, hashes.num_item_hashes, d), np.float32),
            np.zeros((1, hashes.num_author_hashes, d), np.float32),
        )
        return 1

    def warm_up_top_k(self) -> int:
        """Top-k over the current corpus for every batch bucket and top-k bucket, from shapes
        alone (a scan over a big corpus is not run for nothing)."""
        if self.corpus is None:
            return 0
        size, d = self.corpus.size, self.config.emb_size
        ks = sorted({self._device_k(min(k, size)) for k in range(1, self.top_k_buckets[-1] + 1)})
        shape = jax.ShapeDtypeStruct
        program, arrays = self._top_k_program()
        for rows in self.batch_buckets:
            for k in ks:
                program.prepare(
                    shape((rows, d), np.float32),
                    *arrays,
                    np.int32(size),
                    shape((rows, self.max_excluded), np.int32),
                    k=k,
                )
        return len(self.batch_buckets) * len(ks)

    def warm_up(self) -> int:
        """Every program of both towers and of top-k (benchmarks use them all)."""
        return self.warm_up_users() + self.warm_up_candidates() + self.warm_up_top_k()
