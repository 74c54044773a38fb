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

from phoenix.corpus_store import Posts

TRAINED = Path("artifacts/trained-demo")
EMBED_BATCH = 8192


def generator_posts(artifacts: Path, num_posts: int, seed: Optional[int] = None, now=None):
    """(world, Posts): ``num_posts`` posts of the world the towers were trained on, embedded
    by the trained candidate tower, creation times shifted so the newest post is ``now``
    (default: the clock); ``seed``: training's."""
    from tqdm import tqdm

    from phoenix.engine import CandidateTower
    from phoenix.training.pipeline import trained_world

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
    """(unit user vectors [Q, D] of the trained user tower, their histories as post rows of
    ``world`` [Q, S]) for ``count`` users of ``world`` who favorited posts of their topics."""
    from phoenix.serving.batches import batch_type
    from phoenix.serving.contracts import USER_ENCODER
    from phoenix.serving.services.common import PhoenixResources
    from phoenix.serving.services.retrieval import retrieval_engine, user_tower_inputs

    resources = PhoenixResources(artifacts, ("retrieval", "tables"))
    config = resources.config
    users, posts = user_histories(world, count, config.history_seq_len, seed)
    actions = np.zeros((count, config.history_seq_len, config.num_actions), np.float32)
    actions[..., config.action_names.index("favorite")] = 1.0
    batch = batch_type(USER_ENCODER)(
        user_id=world.user_ids[users],
        history_post_ids=world.post_ids[posts],
        history_author_ids=world.author_ids[world.post_author[posts]],
        history_actions=actions,
        history_product_surface=np.zeros(posts.shape, np.int32),
        sent={},
    )
    engine = retrieval_engine(resources)
    return engine.encode_users(*user_tower_inputs(resources, batch)), posts  # [Q, D], [Q, S]


def exact_top_k(embeddings: np.ndarray, users: np.ndarray, k: int, chunk: int = 1 << 20):
    """Row indices [Q, k] of the exact top k (float32 inner products), best first: the
    reference recall is measured against."""
    best_scores = np.full((len(users), 0), -np.inf, np.float32)
    best_rows = np.zeros((len(users), 0), np.int64)
    for start in range(0, len(embeddings), chunk):
        scores = users @ np.asarray(embeddings[start : start + chunk]).T  # [Q, chunk]
        top = np.argpartition(-scores, min(k, scores.shape[1]) - 1, axis=1)[:, :k]
        best_scores = np.concatenate([best_scores, np.take_along_axis(scores, top, 1)], 1)
        best_rows = np.concatenate([best_rows, top + start], 1)
        keep = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
        best_scores = np.take_along_axis(best_scores, keep, 1)
        best_rows = np.take_along_axis(best_rows, keep, 1)
    return best_rows


def recall_at_k(found: list, expected: np.ndarray) -> float:
    """Mean share of each user's exact top k found (ids or rows, as long as both agree)."""
    return float(np.mean([np.isin(e, f).mean() for f, e in zip(found, expected)]))
