"""Query users of every kind, drawn from the synthetic world and encoded by a trained user
tower: what retrieval recall is measured on (bench/bench_retrieval.py, tests of the store).

An ANN index tuned on users whose histories sit on one topic can miss users whose vectors lie
between the topics' clusters, so each kind below is measured on its own:

- ``one_topic``: every history post from one topic (the user's primary);
- ``two_three_topics``: posts from two or three topics, mixed;
- ``whole_corpus``: posts drawn from the whole corpus;
- ``new``: new user ids with 0 to 3 history posts (of one topic);
- ``moved``: the older history on one topic, the most recent quarter on another.

Histories are post rows of the world, oldest first; a shorter history is padded with row -1
(post id 0, the padding id, when encoded).

Shape glossary
  Q  users   S  history_seq_len   T  topics   D  emb_size
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

KINDS = ("one_topic", "two_three_topics", "whole_corpus", "new", "moved")
NO_POST = -1  # a padded history slot
NEW_USER_MAX_POSTS = 3


def kind_histories(world, kind: str, count: int, history_len: int, seed: int = 1):
    """(user ids [Q], history post rows [Q, S], NO_POST where padded) of ``count`` users of
    ``kind`` (one of KINDS) in ``world``."""
    if kind not in KINDS:
        raise ValueError(f"user kind {kind!r}, expected one of {KINDS}")
    rng = np.random.default_rng([seed, KINDS.index(kind)])
    topics = world.interest.shape[1]
    by_topic = [np.flatnonzero(world.post_topic == t) for t in range(topics)]
    users = rng.choice(len(world.user_ids), count, replace=False)
    user_ids = world.user_ids[users].astype(np.int64)
    primary = world.interest[users].argmax(axis=1)  # [Q]
    posts = np.full((count, history_len), NO_POST, np.int64)

    def of_topics(topic_per_slot: np.ndarray) -> np.ndarray:
        return np.array([rng.choice(by_topic[t]) for t in topic_per_slot], np.int64)

    for q in range(count):
        if kind == "one_topic":
            posts[q] = of_topics(np.full(history_len, primary[q]))
        elif kind == "two_three_topics":
            mixed = rng.choice(topics, rng.integers(2, 4), replace=False)
            posts[q] = of_topics(rng.choice(mixed, history_len))
        elif kind == "whole_corpus":
            posts[q] = rng.choice(len(world.post_ids), history_len)
        elif kind == "new":
            size = int(rng.integers(0, NEW_USER_MAX_POSTS + 1))
            posts[q, :size] = of_topics(np.full(size, primary[q]))
        else:  # moved: the most recent quarter on a topic the user did not read before
            recent = max(1, history_len // 4)
            new_topic = (primary[q] + rng.integers(1, topics)) % topics
            slots = np.r_[np.full(history_len - recent, primary[q]), np.full(recent, new_topic)]
            posts[q] = of_topics(slots)
    if kind == "new":  # ids no user of the world has
        user_ids = rng.integers(1 << 40, 1 << 62, count, dtype=np.int64)
    return user_ids, posts


def encode_histories(artifacts: Path, world, user_ids: np.ndarray, posts: np.ndarray):
    """Unit user vectors [Q, D] of ``artifacts``' user tower for users with these histories
    (post rows of ``world``, NO_POST padded), every history post favorited."""
    from phoenix.schema.batches import batch_type
    from phoenix.schema.contracts import USER_ENCODER
    from phoenix.stub.services.resources import PhoenixResources
    from phoenix.stub.services.retrieval import retrieval_engine, user_tower_inputs

    resources = PhoenixResources(artifacts, ("retrieval", "tables"))
    config = resources.config
    held = posts != NO_POST
    rows = np.where(held, posts, 0)
    actions = np.zeros((*posts.shape, config.num_actions), np.float32)
    actions[..., config.action_names.index("favorite")] = held
    batch = batch_type(USER_ENCODER)(
        user_id=user_ids,
        history_post_ids=np.where(held, world.post_ids[rows], 0),
        history_author_ids=np.where(held, world.author_ids[world.post_author[rows]], 0),
        history_actions=actions,
        history_product_surface=np.zeros(posts.shape, np.int32),
        sent={},
    )
    engine = retrieval_engine(resources)
    return engine.encode_users(*user_tower_inputs(resources, batch))  # [Q, D]


def users_of_kinds(artifacts: Path, world, count: int, history_len: int, seed: int = 1):
    """{kind: unit user vectors [count, D]} for every kind of KINDS (encoded in one pass: the
    tower's programs are built once)."""
    drawn = [kind_histories(world, kind, count, history_len, seed) for kind in KINDS]
    user_ids = np.concatenate([ids for ids, _ in drawn])
    posts = np.concatenate([rows for _, rows in drawn])
    vectors = encode_histories(artifacts, world, user_ids, posts)  # [len(KINDS) * count, D]
    return {kind: vectors[i * count : (i + 1) * count] for i, kind in enumerate(KINDS)}
