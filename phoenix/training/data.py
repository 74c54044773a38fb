"""Training and evaluation requests from engagement logs, in the served input layout (numpy).

A request is what the servers receive: a user, the history of that user's engaged impressions
before the request time (oldest to newest, the newest ``history_seq_len`` kept, right-padded,
exactly as ``phoenix.schema.batches.pad_batch`` builds it) and candidates. Ids are
hashed with the artifact's hash functions (``phoenix.hashing``), so the hash arrays are the
ones the servers compute for the same raw ids.

- ranker training: one feed request (session) of the training days; its impressions are the
  candidates, labelled with their 19 actions and dwell seconds;
- retrieval training: one positive impression (favorite, reply, repost or quote) of the
  training days, with the history before its session;
- evaluation: one request per user at the first second of the held-out days; the candidates
  are the user's held-out impressions and the retrieval targets its held-out positives.

Batches are dicts of numpy arrays (``BATCH_KEYS``); ``phoenix.training.train`` turns them into
``RecsysBatch`` / ``RecsysEmbeddings`` with the trained tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from phoenix.config import ArtifactConfig
from phoenix.hashing import hash_ids
from phoenix.recsys_model import POST_AGE_MAX_MINUTES, REFERENCE_TIME
from phoenix.world.synthetic import DAY, Impressions, World, positive_mask


@dataclass
class EntityHashes:
    """Hashes of every user, post and author of a world (int32 [count, num_hashes])."""

    user: np.ndarray
    post: np.ndarray
    author: np.ndarray

    @classmethod
    def of(cls, world: World, config: ArtifactConfig) -> EntityHashes:
        def hashes(ids, entity):
            params = config.hash_params.for_entity(entity)
            return hash_ids(ids, params, config.vocab_size(entity)).astype(np.int32)

        return cls(
            hashes(world.user_ids, "user"),
            hashes(world.post_ids, "item"),
            hashes(world.author_ids, "author"),
        )


class LogIndex:
    """Impressions indexed for history look-ups, sessions and evaluation requests."""

    def __init__(
        self,
        world: World,
        impressions: Impressions,
        config: ArtifactConfig,
        split_ts: Optional[int] = None,
        train_from_ts: Optional[int] = None,
    ):
        """``split_ts``: first held-out second (default: the world spec's); training takes
        the requests and positives in [``train_from_ts``, ``split_ts``) (default: all before
        the split). Rows before ``train_from_ts`` still make up histories: served logs keep
        the engagements the store held before serving there (``served_export``)."""
        self.world = world
        self.imp = impressions
        self.config = config
        self.hashes = EntityHashes.of(world, config)
        self.split_ts = world.spec.split_ts if split_ts is None else int(split_ts)
        first = np.iinfo(np.int64).min if train_from_ts is None else int(train_from_ts)
        n_users = world.user_ids.shape[0]
        # engaged impressions (any action) make up histories; rows are in training order
        # (logs.in_training_order): by user, then time
        self.engaged = np.flatnonzero(impressions.actions.any(axis=1))
        eng_user = impressions.user[self.engaged].astype(np.int64)
        self._eng_key = (eng_user << 40) + (impressions.ts[self.engaged] - world.post_created_ts[0])
        self._eng_start = np.searchsorted(eng_user, np.arange(n_users))
        self.positive = positive_mask(impressions.actions)
        # sessions: runs of one request id = one feed request (two requests of a user in
        # the same second stay apart)
        change = np.ones(len(impressions), bool)
        change[1:] = impressions.request[1:] != impressions.request[:-1]
        self.session_start = np.flatnonzero(change)
        self.session_len = np.diff(np.append(self.session_start, len(impressions)))
        session_ts = impressions.ts[self.session_start]
        self.train_sessions = np.flatnonzero((session_ts >= first) & (session_ts < self.split_ts))
        in_training = (impressions.ts >= first) & (impressions.ts < self.split_ts)
        self.train_positives = np.flatnonzero(self.positive & in_training)
        # log q of each post as an in-batch positive (sampled-softmax correction)
        counts = np.bincount(impressions.post[self.train_positives], minlength=len(world.post_ids))
        self.post_logq = np.log(np.maximum(counts, 1) / max(len(self.train_positives), 1))

    # -- histories ---------------------------------------------------------------------

    def history(self, users: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Impression indices [B, S] of each user's newest engaged items before ``ts``
        (oldest first, right-padded with -1)."""
        S = self.config.history_seq_len
        key = (users.astype(np.int64) << 40) + (ts - self.world.post_created_ts[0])
        end = np.searchsorted(self._eng_key, key, side="left")
        start = self._eng_start[users]
        count = np.minimum(end - start, S)
        slot = np.arange(S)[None, :]
        idx = (end - count)[:, None] + slot
        return np.where(
            slot < count[:, None], self.engaged[np.minimum(idx, len(self.engaged) - 1)], -1
        )

    def user_arrays(self, users: np.ndarray, ts: np.ndarray, with_dwell=None) -> dict:
        """User and history arrays of requests at ``ts``; ``with_dwell`` [B] bool (all True
        if None) zeroes the dwell of the other rows (a request without dwell seconds)."""
        hist = self.history(users, ts)
        valid = hist >= 0
        h = np.maximum(hist, 0)
        post = self.imp.post[h]
        author = self.world.post_author[post]
        dwell = np.where(valid, self.imp.dwell_seconds[h], 0.0).astype(np.float32)
        if with_dwell is not None:
            dwell *= with_dwell[:, None]
        return {
            "user_hashes": self.hashes.user[users],
            "history_post_hashes": self.hashes.post[post] * valid[..., None],
            "history_author_hashes": self.hashes.author[author] * valid[..., None],
            "history_actions": (self.imp.actions[h] * valid[..., None]).astype(np.float32),
            "history_product_surface": np.where(valid, self.imp.surface[h], 0).astype(np.int32),
            "history_dwell_seconds": dwell,
        }

    def candidate_arrays(self, cand: np.ndarray, ts: np.ndarray, with_age=None) -> dict:
        """Candidate arrays of impression indices [B, C] (-1 = padding) at request ``ts``."""
        valid = cand >= 0
        c = np.maximum(cand, 0)
        post = self.imp.post[c]
        author = self.world.post_author[post]
        age = np.clip(ts[:, None] - self.world.post_created_ts[post], 0, None)
        known = valid if with_age is None else valid & with_age[:, None]
        # as served: post age in seconds becomes (REFERENCE_TIME, REFERENCE_TIME - age); 0 = unknown
        age = np.minimum(age, (POST_AGE_MAX_MINUTES + 60) * 60)
        return {
            "candidate_post_hashes": self.hashes.post[post] * valid[..., None],
            "candidate_author_hashes": self.hashes.author[author] * valid[..., None],
            "candidate_product_surface": np.where(valid, self.imp.surface[c], 0).astype(np.int32),
            "candidate_impr_ts": np.where(known, REFERENCE_TIME, 0).astype(np.int32),
            "candidate_post_creation_ts": np.where(known, REFERENCE_TIME - age, 0).astype(np.int32),
            "candidate_mask": valid,
            "labels": (self.imp.actions[c] * valid[..., None]).astype(np.float32),
            "dwell_labels": np.where(valid, self.imp.dwell_seconds[c], 0.0).astype(np.float32),
        }

    # -- training batches --------------------------------------------------------------

    def ranker_batch(
        self, sessions: np.ndarray, num_candidates: int, rng: Optional[np.random.Generator] = None
    ) -> dict:
        """A ranker batch of sessions; with ``rng``, half the rows drop their history dwell
        and half their post ages, as requests that omit those optional inputs do."""
        start, length = self.session_start[sessions], self.session_len[sessions]
        slot = np.arange(num_candidates)[None, :]
        cand = np.where(slot < length[:, None], start[:, None] + slot, -1)
        users = self.imp.user[start]
        ts = self.imp.ts[start]
        with_dwell = with_age = None
        if rng is not None:
            with_dwell = rng.random(len(sessions)) < 0.5
            with_age = rng.random(len(sessions)) < 0.5
        return self.user_arrays(users, ts, with_dwell) | self.candidate_arrays(cand, ts, with_age)

    def retrieval_batch(self, positives: np.ndarray) -> dict:
        """A retrieval batch: the history before each positive's session and the positive."""
        users, ts = self.imp.user[positives], self.imp.ts[positives]
        arrays = self.user_arrays(users, ts)
        post = self.imp.post[positives]
        arrays |= {
            "positive_post_hashes": self.hashes.post[post],
            "positive_author_hashes": self.hashes.author[self.world.post_author[post]],
            "positive_post_index": post.astype(np.int32),
            "positive_logq": self.post_logq[post].astype(np.float32),
        }
        return arrays

    def train_batch(self, tower: str, settings, rng: np.random.Generator) -> dict:
        """{tower: batch} of one train step: random sessions (ranker) or random positive
        impressions (retrieval) of the training days, ``settings``' batch size."""
        if tower == "ranker":
            sessions = rng.choice(self.train_sessions, settings.ranker_batch)
            return {"ranker": self.ranker_batch(sessions, settings.num_candidates, rng)}
        positives = rng.choice(self.train_positives, settings.retrieval_batch)
        return {"retrieval": self.retrieval_batch(positives)}

    # -- evaluation --------------------------------------------------------------------

    def corpus_posts(self) -> np.ndarray:
        """Post indices a recent-posts corpus serves for the held-out days: created from
        ``corpus_days`` before the split to the end of the logs."""
        spec = self.world.spec
        first = self.split_ts - int(spec.corpus_days * DAY)
        return np.flatnonzero(self.world.post_created_ts >= first)

    def eval_set(self, max_users: int, max_candidates: int, seed: int) -> EvalSet:
        """Held-out requests of up to ``max_users`` users with a held-out positive."""
        imp = self.imp
        held = imp.ts >= self.split_ts
        users_with_positive = np.unique(imp.user[held & self.positive])
        rng = np.random.default_rng(seed)
        users = np.sort(
            rng.choice(users_with_positive, min(max_users, len(users_with_positive)), replace=False)
        )
        # held-out impressions of these users, in time order (impressions sort by user, ts)
        rows = np.flatnonzero(held & np.isin(imp.user, users))
        first = np.searchsorted(imp.user[rows], users)
        count = np.diff(np.append(first, len(rows)))
        slot = np.arange(max_candidates)[None, :]
        cand = np.where(
            slot < count[:, None], rows[np.minimum(first[:, None] + slot, len(rows) - 1)], -1
        )
        ts = np.full(len(users), self.split_ts, np.int64)
        targets = [
            np.unique(imp.post[rows[f : f + n]][self.positive[rows[f : f + n]]])
            for f, n in zip(first, count)
        ]
        return EvalSet(
            users=users.astype(np.int32),
            ts=ts,
            candidates=cand,
            targets=targets,
            history=self.history(users.astype(np.int32), ts),
        )


@dataclass
class EvalSet:
    """Held-out requests: one per user at the split time."""

    users: np.ndarray  # int32 [E]
    ts: np.ndarray  # int64 [E]
    candidates: np.ndarray  # int64 [E, C] impression indices, -1 = padding
    targets: list  # E arrays of post indices with a held-out positive (all of them)
    history: np.ndarray  # int64 [E, S] impression indices, -1 = padding

    def __len__(self) -> int:
        return int(self.users.shape[0])
