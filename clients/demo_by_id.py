"""The demo's by-id part: the trained world's users in the store, a feed by user id, and how
an engagement event and a followed author's new post change it (`make demo`)."""

from __future__ import annotations

import concurrent.futures
import time
from collections import Counter
from pathlib import Path

import numpy as np

from phoenix.checkpoint import load_example_sequence
from phoenix.client.client import connect, infer, recommend_inputs
from phoenix.user_state import Engagement, Post, UserStateStore
from phoenix.user_state import connect as connect_store
from phoenix.world.users import WorldUsers, load_users

TOP_K = 50
ROWS = 10
NEW_TOPIC_POSTS = 3  # favourites sent for the new topic


def start_loading(store_url: str, artifacts: Path, count: int) -> concurrent.futures.Future:
    """Load the example user and the first ``count`` users of the world, in a thread (the
    server starts meanwhile); the future gives (WorldUsers, Loaded)."""

    def load():
        world = WorldUsers.from_artifacts(artifacts)
        example = world.index_of(load_example_sequence(artifacts).user_id)
        users = np.union1d(world.population(count), [example])
        return world, load_users(UserStateStore(connect_store(store_url)), world, users)

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="load-users")
    future = pool.submit(load)
    pool.shutdown(wait=False)
    return future


def feed(client, user_id: int) -> dict:
    return infer(client, "http", "recommend", recommend_inputs({"user_id": user_id}, TOP_K))


def show(result: dict, info, title: str, marked: int | None = None) -> None:
    posts = result["ranked_post_ids"][0]
    print(f"\n{title}")
    for rank, post in enumerate(posts[:ROWS].tolist(), 1):
        topic = info.topic(post) if info else "?"
        author = info.author(post) if info else "?"
        mark = "  <- the new post" if post == marked else ""
        print(f"  {rank:>3}  {topic:<10} {author:<16} {post}{mark}")
    if info:
        topics = Counter(info.topic(p) for p in posts[:ROWS]).most_common()
        print(f"  topics of the top {ROWS}: " + ", ".join(f"{t} {n}" for t, n in topics))


def new_topic(world: WorldUsers, index: int) -> int:
    """The topic the user engaged with least and does not dislike."""
    w = world.world
    posts = world.post[world.starts[index] : world.starts[index + 1]]
    counts = np.bincount(w.post_topic[posts], minlength=len(w.topic_names))
    counts = counts.astype(float) + np.where(w.dislike[index] > 0, np.inf, 0)
    return int(np.argmin(counts))


def run(http_url: str, store_url: str, artifacts: Path, loading, info) -> None:
    world, loaded = loading
    store = UserStateStore(connect_store(store_url))
    print(f"\n{loaded.summary('the user-state store')} (the example user and the first "
          "others; phoenix-events load-world loads every one)")  # fmt: skip
    client = connect(http_url, "http")
    user_id = int(load_example_sequence(artifacts).user_id)
    index = world.index_of(user_id)
    [hist] = store.histories([user_id], time.time(), 16)
    before = feed(client, user_id)
    show(before, info, f"Feed of user {user_id} BY ID (recommend with user_id and top_k only; "
         f"the server read {len(hist.ranking)} history items from the store):")  # fmt: skip

    w = world.world
    topic = new_topic(world, index)
    served = set(before["ranked_post_ids"][0].tolist())
    candidates = [p for p in np.flatnonzero(w.post_topic == topic)[::-1].tolist()
                  if int(w.post_ids[p]) not in served][:NEW_TOPIC_POSTS]  # fmt: skip
    now = time.time()
    store.apply([Engagement.of(user_id, int(w.post_ids[p]), int(w.author_ids[w.post_author[p]]),
                               now - i, ["favorite", "dwell"], dwell_seconds=30.0)
                 for i, p in enumerate(candidates)])  # fmt: skip
    after = feed(client, user_id)
    name = w.topic_names[topic]

    def of_topic(result: dict) -> int:
        return sum(info.topic(p) == name for p in result["ranked_post_ids"][0].tolist())

    show(after, info, f"After an engagement event: user {user_id} favourited "
         f"{len(candidates)} {name} posts (a topic new to their history):")  # fmt: skip
    if info:
        print(f"  {name} posts in the whole feed of {TOP_K}: {of_topic(before)} before, "
              f"{of_topic(after)} after")  # fmt: skip

    author_index = int(w.follows[index][0])
    author = int(w.author_ids[author_index])
    new_post = int(w.post_ids.max()) + 1
    store.apply([Post(new_post, author, time.time())])
    latest = feed(client, user_id)
    handle = str(w.author_handles[author_index])
    if info:  # the new post is in no metadata: its author's handle and topic
        info.add(new_post, str(w.topic_names[w.author_topic[author_index]]), handle)
    show(latest, info, f"After a post event: {handle}, whom user {user_id} follows, posted "
         f"post {new_post}:", marked=new_post)  # fmt: skip
    posts = latest["ranked_post_ids"][0].tolist()
    where = f"at rank {posts.index(new_post) + 1}" if new_post in posts else "not in the feed"
    print(f"  the new post is {where}")
    if "in_network" in latest:
        share = float(np.mean(latest["in_network"][0]))
        print(f"  in-network share of the feed: {share:.0%}")
    else:
        print("  (this server does not say which posts are in-network)")
