"""Where each piece of user state lives in Redis.

Every key of one user carries the user id as its Redis Cluster hash tag (the part in braces),
so all of them hash to one slot: one node answers every read of a user, and a pipeline of one
user's commands goes to one node. An author's recent posts are keyed by the author id the
same way. User and author ids are raw int64 ids, written in decimal.

| key                         | type       | member / value                      | score          |
| --------------------------- | ---------- | ----------------------------------- | -------------- |
| ``u:{<user>}:seq``          | sorted set | one packed engagement (history.py)  | event time (s) |
| ``u:{<user>}:pos``          | sorted set | the same, positive engagement only  | event time (s) |
| ``u:{<user>}:follows``      | sorted set | followed author id                  | follow time    |
| ``u:{<user>}:served_posts`` | string     | (served time ms, post id) records   |                |
| ``u:{<user>}:requests``     | sorted set | request id                          | request time   |
| ``u:{<user>}:profile``      | string     | the newest profile (profile.py)     |                |
| ``a:{<author>}:posts``      | sorted set | post id                             | creation time  |
| ``requests:log``            | stream     | one served request (request_log.py) | entry id: time |

The served posts' records are described in served.py.
"""

from __future__ import annotations

SEQUENCE = "seq"  # every engagement: the ranking history
POSITIVE = "pos"  # positive engagement only: the retrieval history
FOLLOWS = "follows"
# A string (served.py); earlier versions kept a sorted set under "served", which is no longer read
# and expires by itself within served_ttl_s.
SERVED = "served_posts"
REQUESTS = "requests"
PROFILE = "profile"  # the user's profile features (profile.py)
USER_KEY_KINDS = (SEQUENCE, POSITIVE, FOLLOWS, SERVED, REQUESTS, PROFILE)
AUTHOR_POSTS = "posts"
# Every served request, all users together: one stream, read in order by a training export.
REQUEST_LOG_STREAM = "requests:log"


def user_key(user_id: int, kind: str) -> str:
    """The key of one of a user's structures (``kind`` in ``USER_KEY_KINDS``)."""
    if kind not in USER_KEY_KINDS:
        raise ValueError(f"unknown user key kind {kind!r}; expected one of {USER_KEY_KINDS}")
    return f"u:{{{int(user_id)}}}:{kind}"


def author_posts_key(author_id: int) -> str:
    """The key of an author's recent posts."""
    return f"a:{{{int(author_id)}}}:{AUTHOR_POSTS}"
