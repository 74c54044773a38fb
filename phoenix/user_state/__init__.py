"""User state kept server-side in Redis: engagement histories, follows, served posts, request
log, and authors' recent posts for the in-network source (docs/user-state.md).

- limits: every cap, window, retention and TTL (``UserStateLimits``), declared once
- actions: the positive / negative split of the 19 actions
- keys: the key layout (one hash tag per user: one cluster slot)
- events: the events and their JSON lines; history: the packed history member and arrays
- profile: a user's profile (the production ranker's user features) as one string
- client: ``connect`` with bounded timeouts, errors naming the store
- store: ``UserStateStore`` (writes, pipelined batch reads)
- stream: the Redis Stream consumer that applies events
- server: a local redis-server / 3-node cluster as child processes
- embedded: the store serve starts, its data in a folder that outlives it

May import the schema (the contract's limits), the corpus store (dating posts), the
model layer and ``phoenix.util``; never the stub side, the clients or the operations.
"""

from phoenix.user_state import compat  # noqa: F401  (first: before anything imports redis)
from phoenix.user_state.client import UserStateError, UserStateUnavailable, connect
from phoenix.user_state.events import Engagement, EventError, Follow, Post, Profile, Unfollow
from phoenix.user_state.history import History, UserHistories
from phoenix.user_state.limits import UserStateLimits
from phoenix.user_state.store import InNetworkPosts, UserState, UserStateStore

__all__ = [
    "Engagement",
    "EventError",
    "Follow",
    "History",
    "InNetworkPosts",
    "Post",
    "Profile",
    "Unfollow",
    "UserHistories",
    "UserState",
    "UserStateError",
    "UserStateLimits",
    "UserStateStore",
    "UserStateUnavailable",
    "connect",
]
