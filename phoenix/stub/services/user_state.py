"""The user-state step: a user's histories, served posts and in-network posts, read from the
user-state store by user id (``phoenix.user_state``, docs/user-state.md), or the request's own
history passed on.

Per batch, the rows that carry no history are read from the store in one pipelined read of
their histories (the newest ``history_seq_len`` engagements), served posts and follows, and a
second of the followed authors' newest posts when any of them follows someone
(``UserStateStore.state``). A request that carries its own history never touches the store:
both histories are that history, and no post is known to be served or in-network. A user the
store does not know gets empty histories (L = 0).

The store's URL is the ``user_state_url`` parameter, else ``$PHOENIX_USER_STATE_URL`` (serve
sets it): a server's (``redis://``) or a cluster's (``redis+cluster://``), read by
``phoenix.user_state.client``; the client is made lazily, so the model loads with the store
down. When the store is down or unset, each by-id request of the batch gets an error
naming the store (within the client's bounded timeouts), while the requests with their own
history are answered; the Redis client reconnects on its next call, so the store coming back
needs no restart.

For an artifact of the production family the stage also answers what that ranker reads
(``production_state``: the history items' context, their posts' semantic IDs, the profile, the
request's timezone and hour), looking the semantic IDs up in the corpus (``corpus_file``: a
store followed for look-ups only, as the feed policy follows it); for the original family it
opens no corpus, answers none of them and refuses a request that sends their inputs.

Shape glossary (R rows of one request): L history items, N served posts, M in-network posts,
A actions.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Sequence

import numpy as np

from phoenix.checkpoint import load_config
from phoenix.checkpoint.production import is_production
from phoenix.config import ACTION_NAMES
from phoenix.schema.batches import stack_padded
from phoenix.schema.contracts import LIMITS, RETRIEVAL_PREFIX, USER_HISTORY, USER_STATE
from phoenix.schema.production_inputs import HISTORY_CONTEXT_INPUTS, PROFILE_INPUTS
from phoenix.schema.request_types import REQUEST_TYPES
from phoenix.schema.requests import InputError, value_bound
from phoenix.schema.wiring import passed_on_history
from phoenix.stub.corpus import ServedCorpus, open_corpus, semantic_id_lookup
from phoenix.stub.services import production_state
from phoenix.stub.services.common import Result, Service, ServiceSettings
from phoenix.user_state import (
    History,
    UserState,
    UserStateError,
    UserStateLimits,
    UserStateStore,
    UserStateUnavailable,
    connect,
)

logger = logging.getLogger("phoenix.stub")
USER_STATE_URL_ENV = "PHOENIX_USER_STATE_URL"
UserStateRequest = REQUEST_TYPES[USER_STATE.name]
# A history the request carries: every one of these (dwell times are optional).
REQUIRED_WITH_HISTORY = tuple(s.name for s in USER_HISTORY if not s.optional)
# What a request may send with its history only, and what only the production family reads
# (the request's context aside, which a request by id may send too).
WITH_HISTORY_ONLY = tuple(s.name for s in (*HISTORY_CONTEXT_INPUTS, *PROFILE_INPUTS))
PRODUCTION_ONLY = tuple(s.name for s in USER_STATE.inputs if s.name in production_state.INPUTS)


def store_url(parameter: str) -> str:
    """The store's URL: the parameter, else $PHOENIX_USER_STATE_URL ("" when neither)."""
    return parameter or os.environ.get(USER_STATE_URL_ENV, "")


class NoStore:
    """Stands in for the store when no URL is configured: every read fails saying so."""

    name = "(none)"
    limits = UserStateLimits()

    def _fail(self, *args, **kwargs):
        raise UserStateUnavailable(
            "no user state store configured: set the user_state parameter 'user_state_url' or "
            f"${USER_STATE_URL_ENV} (phoenix-serve sets it); only requests carrying their own "
            "history can be served"
        )

    state = _fail


class StoreBackedService(Service):
    """A service over the user-state store: numpy and Redis only, nothing to compile."""

    absent_store = NoStore  # stands in, failing every call, when no store URL is configured

    def __init__(
        self, config, store, *, max_batch_size: int, clock: Callable[[], float] = time.time
    ):
        self.config = config
        self.store = store
        self.max_rows = max_batch_size  # no compiled shapes: numpy and Redis only
        self.clock = clock

    @classmethod
    def from_settings(cls, settings: ServiceSettings):
        url = store_url(settings.parameters["user_state_url"])
        # lazy: the store need not be up at start-up
        store = UserStateStore(connect(url, lazy=True), name=url) if url else cls.absent_store()
        return cls(
            load_config(settings.artifact_dir), store, max_batch_size=settings.max_batch_size
        )

    def warm_up(self) -> int:
        return 0


class UserStateService(StoreBackedService):
    """Histories and served posts per user row: from the request, else from the store; for
    the production family also what its ranker reads (``production``, with ``corpus``: what
    the histories' semantic IDs are looked up in)."""

    request_type = UserStateRequest

    def __init__(
        self, config, store, *, production: bool = False, corpus: ServedCorpus | None = None,
        **options,
    ):  # fmt: skip
        super().__init__(config, store, **options)
        self.seq_len = config.history_seq_len
        store.limits.check_seq_len(self.seq_len)  # at start-up, not in every request
        self.production = production
        if corpus is not None:
            self.corpus = corpus  # the adapter exports a followed store's generation

    @classmethod
    def from_settings(cls, settings: ServiceSettings):
        config = load_config(settings.artifact_dir)
        production = is_production(config)
        corpus = None
        if production:  # look-ups only: no vectors, no index
            corpus = open_corpus(settings.artifact_dir, settings.parameters["corpus_file"], config)
        url = store_url(settings.parameters["user_state_url"])
        store = (
            UserStateStore(
                connect(url, lazy=True),  # lazy: the store need not be up at start-up
                name=url,
                semantic_ids=None if corpus is None else semantic_id_lookup(corpus),
            )
            if url
            else cls.absent_store()
        )
        return cls(
            config,
            store,
            production=production,
            corpus=corpus,
            max_batch_size=settings.max_batch_size,
        )

    def semantic_ids(self, post_ids: np.ndarray) -> np.ndarray:
        """The posts' semantic IDs by the corpus (zeros without one)."""
        corpus = getattr(self, "corpus", None)
        if corpus is None:
            return np.zeros(post_ids.shape + (production_state.LEVELS,), np.int32)
        return semantic_id_lookup(corpus)(post_ids)

    def admit(self, request):
        """A history is all of its required inputs or none of them; the items' context and
        the profile come with a history only, and only to the production family."""
        request = super().admit(request)
        carried = [name for name in REQUIRED_WITH_HISTORY if getattr(request, name) is not None]
        if carried and len(carried) != len(REQUIRED_WITH_HISTORY):
            missing = sorted(set(REQUIRED_WITH_HISTORY) - set(carried))
            raise InputError(
                f"user_state: a request carrying a history needs {list(REQUIRED_WITH_HISTORY)}; "
                f"{missing} missing (send none of them to read the history by user_id)"
            )
        if request.history_dwell_seconds is not None and not carried:
            raise InputError("user_state: 'history_dwell_seconds' sent without a history")
        sent = [name for name in PRODUCTION_ONLY if getattr(request, name) is not None]
        if sent and not self.production:
            raise InputError(
                f"user_state: {sent} are read by the production family only; these artifacts "
                "are of the original family (docs/production.md)"
            )
        alone = [name for name in WITH_HISTORY_ONLY if name in sent]
        if alone and not carried:
            raise InputError(
                f"user_state: {alone} sent without a history (by user_id the store gives the "
                "history's context and the profile)"
            )
        return request

    def run(self, requests: Sequence) -> list[Result]:
        now = self.clock()  # what the store's windows and the requests' hours are read at
        by_id = [r for r in requests if r.history_post_ids is None]
        state = self.read([int(u) for r in by_id for u in r.user_id[:, 0]], now) if by_id else None
        results: list[Result] = []
        row = 0
        for request in requests:
            if request.history_post_ids is not None:
                results.append(self.passed_on(request, now))
            elif isinstance(state, UserStateError):
                results.append(state)
            else:
                assert state is not None  # read for the requests by id
                users = state[row : row + request.rows]
                results.append(self.stored(request, users, now))
                row += request.rows
        return results

    def passed_on(self, request, now: float) -> dict[str, np.ndarray]:
        """The outputs of a request carrying its history."""
        outputs = passed_on_history(request.arrays())
        if self.production:
            outputs.update(production_state.carried(request, self.semantic_ids, now))
        return outputs

    def stored(self, request, users: Sequence[UserState], now: float) -> dict[str, np.ndarray]:
        """The outputs of a request by id from its rows' stored state."""
        ranking = [servable(u.histories.ranking, self.config, self.production) for u in users]
        outputs = stored_state(users, self.config, ranking)
        if self.production:
            outputs.update(production_state.stored(request, users, ranking, now))
        return outputs

    def read(self, user_ids: list[int], now: float) -> list[UserState] | UserStateError:
        """The state of ``user_ids`` at ``now`` (one batch read: ``UserStateStore.state``), or
        the store's error."""
        try:
            return self.store.state(user_ids, now, self.seq_len)
        except UserStateError as error:
            return error


# ----------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------


def action_columns(config) -> np.ndarray | None:
    """Where the store's action flags (``config.ACTION_NAMES``' 19 columns) go among the
    artifacts' actions: None where they are the same (the original family), else each stored
    action's column by name, -1 where the artifacts have none (the production family's 64
    slots name the feed's actions as they are, ``feed_features.ACTION_SLOTS``, and have no
    dwell_time slot)."""
    names = tuple(config.action_names)
    if names == ACTION_NAMES:
        return None
    return np.array([names.index(n) if n in names else -1 for n in ACTION_NAMES])


def placed_actions(actions: np.ndarray, columns: np.ndarray | None, width: int) -> np.ndarray:
    """Stored action flags [..., 19] as the artifacts' [..., width] (``action_columns``)."""
    if columns is None:
        return actions
    out = np.zeros(actions.shape[:-1] + (width,), actions.dtype)
    kept = columns >= 0
    out[..., columns[kept]] = actions[..., kept]
    return out


def feed_actions(flags: np.ndarray, columns: np.ndarray | None) -> np.ndarray:
    """The artifacts' action flags [..., A] as the store's 19 (``action_columns``; the
    inverse of ``placed_actions``: a slot of no feed action is not kept)."""
    if columns is None:
        return flags
    out = np.zeros(flags.shape[:-1] + (len(columns),), flags.dtype)
    kept = columns >= 0
    out[..., kept] = flags[..., columns[kept]]
    return out


def stacked_history(histories: Sequence[History], config=None) -> dict[str, np.ndarray]:
    """Rows of histories [R, L, ...], right-padded with zeros to the longest (an empty
    history's actions are [0, A] already); their action flags in ``config``'s columns when
    given (``action_columns``)."""
    width = max(len(h) for h in histories)
    inputs = [h.inputs() for h in histories]
    out = {
        spec.name: stack_padded([row[spec.name][None] for row in inputs], width, len(inputs))
        for spec in USER_HISTORY
    }
    if config is not None:
        columns = action_columns(config)
        out["history_actions"] = placed_actions(out["history_actions"], columns, config.num_actions)
    return out


def stacked_ids(rows: Sequence[np.ndarray]) -> np.ndarray:
    """[R, longest] int64 ids, right-padded with 0."""
    width = max(len(ids) for ids in rows)
    return stack_padded([np.asarray(ids, np.int64)[None] for ids in rows], width, len(rows))


def excludable_served(user: UserState) -> np.ndarray:
    """The newest served posts that fit beside the history in the retriever's exclusion list
    (history + served, at most max_filter_ids a row). A user served the whole served_cap
    within the TTL (a hot user: measured under Locust's Zipf traffic) would otherwise overflow
    it and fail the retriever's whole batch; the oldest served posts give way."""
    room = LIMITS.max_filter_ids - len(user.histories.ranking)
    return user.served[: max(room, 0)]


def servable_items(history: History, config, production: bool = False) -> np.ndarray:
    """[L] bool: the history items whose every value the model's contract accepts (the
    ranker's history specs, against these artifacts; with ``production``, the items' context
    too). The event path refuses the others, but an item stored before a change of artifacts
    (fewer product surfaces) or written around it must not reach the model, whose stages no
    longer check what this one hands on."""
    keep = np.ones(len(history), bool)
    if not len(history):
        return keep
    arrays = list(zip(USER_HISTORY, history.inputs().values()))
    if production:
        arrays += list(zip(HISTORY_CONTEXT_INPUTS, production_state.item_context(history)))
    for spec, array in arrays:
        values = array.reshape(len(history), -1).astype(np.float64)
        low, high = (value_bound(b, config) for b in (spec.values.low, spec.values.high))
        ok = np.isfinite(values)
        if low is not None:
            ok &= values >= low
        if high is not None:
            ok &= values <= high
        keep &= ok.all(axis=1)
    return keep


def servable(history: History, config, production: bool = False) -> History:
    """``history`` without the items the model would refuse (``servable_items``), logged."""
    keep = servable_items(history, config, production)
    if keep.all():
        return history
    logger.warning(
        "user_state: %d stored history items outside the served artifacts' limits left out",
        int((~keep).sum()),
    )
    return dataclasses.replace(
        history, **{f.name: getattr(history, f.name)[keep] for f in dataclasses.fields(history)}
    )


def stored_state(
    users: Sequence[UserState], config, ranking_histories: Sequence[History] | None = None
) -> dict[str, np.ndarray]:
    """One request's outputs from the store's rows (items the model would refuse left out;
    ``ranking_histories``: the rows' ranking histories already so)."""
    if ranking_histories is None:
        ranking_histories = [servable(u.histories.ranking, config) for u in users]
    ranking = stacked_history(ranking_histories, config)
    retrieval = stacked_history([servable(u.histories.retrieval, config) for u in users], config)
    return {
        **ranking,
        **{RETRIEVAL_PREFIX + name: array for name, array in retrieval.items()},
        "served_post_ids": stacked_ids([excludable_served(u) for u in users]),
        "in_network_post_ids": stacked_ids([u.in_network.post_ids for u in users]),
        "in_network_author_ids": stacked_ids([u.in_network.author_ids for u in users]),
    }
