"""Retrieval: jitted user and candidate towers, and exact top-k over a device-resident corpus.

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
    pad_axis,
)
from phoenix.engine.programs import Program, ProgramStore
from phoenix.engine.ranking import _take_users, example_inputs
from phoenix.recsys_model import RecsysBatch, RecsysEmbeddings
from phoenix.recsys_retrieval_model import (
    INF,
    PhoenixRetrievalModelConfig,
    candidate_tower_mlp,
    l2_normalize,
)


class CorpusTiles(NamedTuple):
    """A corpus on the device, zero-padded to whole tiles."""

    tiles: jax.Array  # [n, tile, D] in the compute dtype
    size: int  # M, the real entries (the rest is padding)


# Corpora up to this many rows are scored as one tile: a single top-k beats merging tiles.
ONE_TILE_ROWS = 262_144
SCORE_BIN = 128  # entries per bin of top-k's first pass (RetrievalEngine._top_k_fn)


def default_corpus_tile(size: int) -> int:
    """Rows per tile: the whole corpus up to ONE_TILE_ROWS; beyond, 16 k rows on CPUs, where
    a [users, tile] block of scores stays in the caches."""
    if size <= ONE_TILE_ROWS:
        return max(128, -(-size // 128) * 128)
    return 16_384 if jax.default_backend() == "cpu" else ONE_TILE_ROWS


def corpus_tiles(embeddings: np.ndarray, tile: int, dtype) -> CorpusTiles:
    """``embeddings`` [M, D] as device tiles of ``tile`` rows, the last one zero-padded."""
    size = embeddings.shape[0]
    tile = min(tile, max(128, -(-size // 128) * 128))
    count = max(1, -(-size // tile))
    padded = pad_axis(embeddings, 0, count * tile).reshape(count, tile, -1)
    return CorpusTiles(jnp.asarray(padded, dtype), size)


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
        store: Optional[ProgramStore] = None,
    ):
        self.dtype = compute_dtype or default_compute_dtype()
        self.config = dataclasses.replace(config, fprop_dtype=self.dtype)
        self.params = jax.device_put(params)  # moved once, not with every call
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.top_k_buckets = tuple(sorted(top_k_buckets))
        self.candidate_chunk = candidate_chunk
        self.corpus_tile = corpus_tile  # None: default_corpus_tile of each corpus
        # One fixed width for the excluded-index lists: one compiled shape whatever a user saw.
        self.max_excluded = max_excluded
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
            local = excluded - first  # [B, E]
            local = jnp.where((excluded >= 0) & (local >= 0) & (local < tile), local, tile)
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

    def encode_users(self, batch: RecsysBatch, emb: RecsysEmbeddings) -> np.ndarray:
        """Unit user vectors [B, D] (float32)."""
        out = []
        pad = lambda x, to: None if x is None else pad_axis(np.asarray(x), 0, to)  # noqa: E731
        hashes = self.config.hash_config
        for rows, pad_to in batch_slices(
            np.asarray(batch.user_hashes).shape[0], self.batch_buckets
        ):
            sub_b, sub_e = _take_users(batch, emb, rows)
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
        """Place the corpus [M, D] on the device in the compute dtype, in tiles."""
        embeddings = np.asarray(embeddings)
        tile = self.corpus_tile or default_corpus_tile(embeddings.shape[0])
        self.corpus = corpus_tiles(embeddings, tile, self.dtype)

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
        user).
        """
        if self.corpus is None:
            raise ValueError("no corpus set")
        size = self.corpus.size
        k = min(k, size)
        kb = min(bucket_for(k, self.top_k_buckets), size)
        if exclude is not None:
            exclude_indices = [np.flatnonzero(row) for row in exclude]
        excluded = padded_index_lists(exclude_indices, users.shape[0], self.max_excluded)
        indices, scores = [], []
        for rows, pad_to in batch_slices(users.shape[0], self.batch_buckets):
            s, i = self._top_k(
                pad_axis(np.asarray(users[rows], np.float32), 0, pad_to),
                self.corpus.tiles,
                np.int32(self.corpus.size),
                pad_axis(excluded[rows], 0, pad_to),
                k=kb,
            )
            n = rows.stop - rows.start
            indices.append(np.asarray(i)[:n, :k])
            scores.append(np.asarray(s)[:n, :k])
        if not indices:
            return np.zeros((0, k), np.int32), np.zeros((0, k), np.float32)
        return np.concatenate(indices), np.concatenate(scores)

    def warm_up_users(self) -> int:
        """The user tower for every batch bucket; returns how many programs."""
        for rows in self.batch_buckets:
            self.encode_users(*example_inputs(self.config, rows, 1))
        return len(self.batch_buckets)

    def warm_up_candidates(self) -> int:
        """The candidate tower's one chunk program."""
        hashes, d = self.config.hash_config, self.config.emb_size
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
        ks = sorted({min(k, size) for k in self.top_k_buckets})
        shape = jax.ShapeDtypeStruct
        for rows in self.batch_buckets:
            for k in ks:
                self._top_k.prepare(
                    shape((rows, d), np.float32),
                    self.corpus.tiles,
                    np.int32(size),
                    shape((rows, self.max_excluded), np.int32),
                    k=k,
                )
        return len(self.batch_buckets) * len(ks)

    def warm_up(self) -> int:
        """Every program of both towers and of top-k (benchmarks use them all)."""
        return self.warm_up_users() + self.warm_up_candidates() + self.warm_up_top_k()
