"""The user-state step: a user's histories and served posts, read from the user-state store by
user id (``phoenix.user_state``, docs/user-state.md), or the request's own history passed on.

Per batch, the rows that carry no history are read from the store in ONE pipelined read of
their histories (the newest ``history_seq_len`` engagements) and served posts. A request that
carries its own history never touches the store: both histories are that history, and no
post is known to be served. A user the store does not know gets empty histories (L = 0).

The store's URL is the ``user_state_url`` parameter, else ``$PHOENIX_USER_STATE_URL`` (serve
sets it). When the store is down or unset, each by-id request of the batch gets an error
naming the store (within the client's bounded timeouts), while the requests with their own
history are answered; the Redis client reconnects on its next call, so the store coming back
needs no restart.

Shape glossary (R rows of one request): L history items, N served posts, A actions.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from phoenix.checkpoint import load_config
from phoenix.serving.batches import stack_padded
from phoenix.serving.contracts import LIMITS, RETRIEVAL_PREFIX, USER_STATE
from phoenix.serving.requests import REQUEST_TYPES, InputError
from phoenix.serving.services.common import Arrays, Result, Service, ServiceSettings
from phoenix.user_state import (
    History,
    UserHistories,
    UserStateError,
    UserStateStore,
    UserStateUnavailable,
    connect,
)

USER_STATE_URL_ENV = "PHOENIX_USER_STATE_URL"
UserStateRequest = REQUEST_TYPES[USER_STATE.name]
HISTORY_NAMES = tuple(spec.name for spec in USER_STATE.inputs[1:])  # history_post_ids, ...
# A history the request carries: every one of these (dwell times are optional).
REQUIRED_WITH_HISTORY = tuple(
    s.name for s in USER_STATE.inputs[1:] if not s.name.endswith("dwell_seconds")
)


def store_url(parameter: str) -> str:
    """The store's URL: the parameter, else $PHOENIX_USER_STATE_URL ("" when neither)."""
    return parameter or os.environ.get(USER_STATE_URL_ENV, "")


class NoStore:
    """Stands in for the store when no URL is configured: every read fails saying so."""

    name = "(none)"

    def _fail(self, *args, **kwargs):
        raise UserStateUnavailable(
            "no user state store configured: set the user_state parameter 'user_state_url' or "
            f"${USER_STATE_URL_ENV} (phoenix-serve sets it); only requests carrying their own "
            "history can be served"
        )

    histories = served = _fail


class UserStateService(Service):
    """Histories and served posts per user row: from the request, else from the store."""

    request_type = UserStateRequest

    def __init__(
        self,
        config,
        store,
        *,
        max_batch_size: int,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config
        self.store = store
        self.seq_len = config.history_seq_len
        self.max_rows = max_batch_size  # no compiled shapes: numpy and Redis only
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> UserStateService:
        url = store_url(settings.parameters["user_state_url"])
        store = UserStateStore(connect(url), name=url) if url else NoStore()
        return cls(
            load_config(settings.artifact_dir), store, max_batch_size=settings.max_batch_size
        )

    def warm_up(self) -> int:
        return 0  # nothing to compile; the store is not required to be up at start-up

    def parse(self, arrays: Arrays):
        """A history is all of its required inputs or none of them."""
        request = super().parse(arrays)
        carried = [name for name in REQUIRED_WITH_HISTORY if getattr(request, name) is not None]
        if carried and len(carried) != len(REQUIRED_WITH_HISTORY):
            missing = sorted(set(REQUIRED_WITH_HISTORY) - set(carried))
            raise InputError(
                f"user_state: a request carrying a history needs {list(REQUIRED_WITH_HISTORY)}; "
                f"{missing} missing (send none of them to read the history by user_id)"
            )
        if request.history_dwell_seconds is not None and not carried:
            raise InputError("user_state: 'history_dwell_seconds' sent without a history")
        return request

    def run(self, requests: Sequence) -> list[Result]:
        by_id = [r for r in requests if r.history_post_ids is None]
        state = self.read([int(u) for r in by_id for u in r.user_id[:, 0]]) if by_id else None
        results, row = [], 0
        for request in requests:
            if request.history_post_ids is not None:
                results.append(own_history(request))
            elif isinstance(state, UserStateError):
                results.append(state)
            else:
                histories, served = state
                rows = slice(row, row + request.rows)
                results.append(stored_state(histories[rows], served[rows], self.config))
                row += request.rows
        return results

    def read(self, user_ids: list[int]):
        """(histories, served) of ``user_ids``, one pipelined read each; or the store's error."""
        now = self.clock()
        try:
            return self.store.histories(user_ids, now, self.seq_len), self.store.served(
                user_ids, now
            )
        except UserStateError as error:
            return error


# ----------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------


def history_outputs(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ranking and the retrieval history outputs, both ``arrays``."""
    return {**arrays, **{RETRIEVAL_PREFIX + name: array for name, array in arrays.items()}}


def own_history(request) -> dict[str, np.ndarray]:
    """A request's own history as both histories (dwell zeros when not sent: the model reads
    zeros as no dwell), and no served posts."""
    arrays = {name: getattr(request, name) for name in HISTORY_NAMES}
    if arrays["history_dwell_seconds"] is None:
        arrays["history_dwell_seconds"] = np.zeros(request.history_post_ids.shape, np.float32)
    served = np.zeros((request.rows, 0), np.int64)
    return {**history_outputs(arrays), "served_post_ids": served}


def stacked_history(histories: Sequence[History], num_actions: int) -> dict[str, np.ndarray]:
    """Rows of histories [R, L, ...], right-padded with zeros to the longest."""
    width = max(len(h) for h in histories)
    out = {}
    for name in HISTORY_NAMES:
        parts = [h.inputs()[name][None] for h in histories]
        if name == "history_actions":  # an empty history's flags still have A columns
            parts = [p.reshape(1, -1, num_actions) for p in parts]
        out[name] = stack_padded(parts, width, len(histories))
    return out


def stored_state(
    histories: Sequence[UserHistories], served: Sequence[np.ndarray], config
) -> dict[str, np.ndarray]:
    """One request's outputs from the store's rows."""
    ranking = stacked_history([h.ranking for h in histories], config.num_actions)
    retrieval = stacked_history([h.retrieval for h in histories], config.num_actions)
    served = [ids[: LIMITS.max_filter_ids] for ids in served]
    width = max(len(ids) for ids in served)
    return {
        **ranking,
        **{RETRIEVAL_PREFIX + name: array for name, array in retrieval.items()},
        "served_post_ids": stack_padded([ids[None] for ids in served], width, len(served)),
    }
