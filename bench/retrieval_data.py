"""Benchmark inputs for retrieval at scale: posts of the project's synthetic world embedded by
the trained demo towers, and users of that world encoded by its user tower. Never random
vectors: ANN recall on near-uniform vectors says nothing about recall on a trained tower's.

Shape glossary
  N  posts   Q  users   S  history_seq_len   A  actions   D  emb_size
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np

from harness.recall import exact_top_k, recall_per_user
from phoenix.corpus_store import Posts

TRAINED = Path("artifacts/trained-demo")
EMBED_BATCH = 8192


def generator_posts(artifacts: Path, num_posts: int, seed: Optional[int] = None, now=None):
    """(world, Posts): ``num_posts`` posts of the world the towers were trained on, embedded
    by the trained candidate tower, creation times shifted so the newest post is ``now``
    (default: the clock); ``seed``: training's."""
    from tqdm import tqdm

    from phoenix.engine import CandidateTower
    from phoenix.world.trained import trained_world

    world = trained_world(artifacts, num_posts, seed)
    authors = world.author_ids[world.post_author]  # [N]
    tower = CandidateTower.from_artifacts(artifacts, rows_per_call=EMBED_BATCH)
    with tqdm(total=len(authors), desc="embedding corpus", unit="post") as bar:
        vectors = tower(world.post_ids, authors, bar.update)
    now = time.time() if now is None else now
    created = world.post_created_ts - world.post_created_ts.max() + int(now)
    return world, Posts(world.post_ids, authors, created.astype(np.int64), vectors)


def user_histories(world, count: int, history_len: int, seed: int = 1):
    """``count`` users of the world with histories of posts on their own topics (as their
    engaged posts are), oldest first: (user rows [Q], post rows [Q, S])."""
    rng = np.random.default_rng(seed)
    topics = world.interest.shape[1]
    users = rng.choice(len(world.user_ids), count, replace=False)
    by_topic = [np.flatnonzero(world.post_topic == t) for t in range(topics)]
    posts = np.zeros((count, history_len), np.int64)
    for q, user in enumerate(users):
        liked = world.interest[user] / world.interest[user].sum()
        for s, topic in enumerate(rng.choice(topics, history_len, p=liked)):
            posts[q, s] = rng.choice(by_topic[topic])
    return users, posts


def query_users(artifacts: Path, world, count: int, seed: int = 1):
    """Users of one kind (harness.user_kinds has them all): (unit user vectors
    [Q, D] of the trained user tower, their histories as post rows of
    ``world`` [Q, S]) for ``count`` users of ``world`` who favorited posts of their topics."""
    from harness.user_kinds import encode_histories
    from phoenix.checkpoint import load_config

    history_len = load_config(artifacts).history_seq_len
    users, posts = user_histories(world, count, history_len, seed)
    return encode_histories(artifacts, world, world.user_ids[users], posts), posts


def recall_at_k(found: list, expected: np.ndarray) -> float:
    """Mean share of each user's exact top k found (ids or rows, as long as both agree)."""
    return float(recall_per_user(found, expected).mean())


__all__ = ["TRAINED", "exact_top_k", "generator_posts", "query_users", "recall_at_k"]
