"""Every cap, window, retention and TTL of the user state, declared once.

The history length a model reads is not here: it is the artifact's ``history_seq_len``
(``phoenix.config.ArtifactConfig``), passed to ``UserStateStore.histories``; ``history_cap`` only
bounds what is kept, and a model asking for more than is kept is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from phoenix.schema.contracts import LIMITS

DAY_S = 86_400.0


@dataclass(frozen=True)
class UserStateLimits:
    """What the store keeps and for how long. Times are seconds."""

    # Engagements kept per user in each history (all; positive): twice the longest
    # history_seq_len an artifact is made with (X's production nano ranker, 1,022), so such
    # a model is served the histories it reads; memory grows linearly with what a user
    # engaged with in the window (docs/user-state.md).
    history_cap: int = 2048
    # Older engagement says little about today's interests, and a user who stops engaging must
    # not hold memory for ever: both history keys expire this long after their last write.
    history_window_s: float = 30 * DAY_S
    # X's own following limit for most accounts; it bounds the in-network fan-out of a request
    # (one read per followed author). Beyond it the oldest follows are dropped.
    follows_cap: int = 5_000
    # A served post is kept as long as an in-network post is (author_posts_retention_s): after
    # that it cannot come back in-network, and the retrieval corpus window covers the rest.
    served_ttl_s: float = 2 * DAY_S
    # Served ids become a feed request's seen_post_ids, which the contract caps at this.
    served_cap: int = LIMITS.max_filter_ids
    # Posts kept per author: a prolific account (news, bots) posts hundreds a day, and a feed
    # takes only a few per author anyway (in_network's per_author_cap).
    author_posts_cap: int = 128
    # Thunder keeps an author's posts for 2 days: in-network is the fresh source, retrieval
    # reaches older posts.
    author_posts_retention_s: float = 2 * DAY_S
    # Recent requests of a user (for deduplicating retries and pacing): a day, at most this many.
    # The request log stream (request_log.py) keeps entries as long: the next day's training
    # job must have drained it by then.
    request_log_ttl_s: float = DAY_S
    request_log_cap: int = 100
    # In-network candidates of one request (the newest posts of the followed authors): a feed
    # shows few posts of one author (author diversity damps the second and later), so more
    # than a few per author would only crowd out other authors' posts before ranking.
    in_network_per_author: int = 3
    # ... and at most this many in all, newest first. They join the retriever's top_k before
    # ranking, whose cost grows with the candidates: 64 keeps a demo request (top_k 32-100)
    # within the ranker's 256-candidate bucket, and lets in-network be at most about half of
    # a feed before the policy's out_of_network_factor. At most LIMITS.max_candidates.
    in_network_total: int = 64
    # Entries of the request log stream, all users together (XADD MAXLEN): its memory bound.
    # An entry of a 127-item history, 100 candidates and a 100-post feed with its action
    # probabilities holds 15.7 KB of arrays (docs/user-state.md, "Served posts and the request
    # log"), so the cap holds the stream to a few hundred MB whatever the traffic: a day of one
    # demo pod's requests; past it the oldest entries go before their day is up, so a busier
    # server needs a drain that keeps pace (a training export) or a larger cap.
    request_stream_cap: int = 20_000

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"UserStateLimits.{field.name} must be > 0, got {value!r}")
        # what the store hands out must pass the contract's per-request limits
        within_contract = (
            ("history_cap", "max_history_items", "such histories would be refused"),
            ("in_network_total", "max_candidates", "the ranker would refuse them"),
        )
        for name, limit, why in within_contract:
            value, bound = getattr(self, name), getattr(LIMITS, limit)
            if value > bound:
                raise ValueError(
                    f"UserStateLimits.{name} {value} exceeds the contract's {limit} {bound}: {why}"
                )

    def check_seq_len(self, seq_len: int) -> None:
        """A ValueError unless ``seq_len`` histories can be served from what is kept."""
        if not 1 <= seq_len <= self.history_cap:
            raise ValueError(
                f"history length {seq_len} must lie in [1, history_cap={self.history_cap}]: the "
                "store keeps no more (raise UserStateLimits.history_cap for this artifact)"
            )
