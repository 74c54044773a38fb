"""The served-log stage, the last of ``recommend``'s chain: what was served, written back to the
user state as a side effect of answering (``phoenix.user_state``, docs/user-state.md).

Per batch, ONE pipelined write: for each user row, a new request id, the feed's posts marked
served to the user (the next by-id request's ``user_state`` step reads them, and the retriever
excludes them for ``served_ttl_s``), the id added to the user's recent requests, and one entry
of the request log stream (``phoenix.user_state.request_log``: the ranking history, the
candidates and the feed). The write completes before the answer, so a user's next request
sees it.

A row whose request carried its own history is logged but marks nothing served: such a
request reads nothing from the store (``user_state``), so it writes nothing a by-id request
would read either; its client keeps its own state (``seen_post_ids``).

The write is a side effect, as X's are: when the store is down or unset, the feed is answered
anyway, with its request id, and the lost write is logged (a warning naming the store) and
counted (``unlogged_rows``). A request id is 63 random bits (never 0), new per user row.

Shape glossary (R rows of one request): L history items, K candidates, C' posts returned.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Sequence

import numpy as np

from phoenix.schema.contracts import SERVED_LOG
from phoenix.schema.request_types import REQUEST_TYPES
from phoenix.stub.services.common import Outputs
from phoenix.stub.services.user_state import (
    NoStore,
    StoreBackedService,
    action_columns,
    feed_actions,
)
from phoenix.user_state import UserStateError
from phoenix.user_state.actions import action_bits
from phoenix.user_state.request_log import RequestRecord

logger = logging.getLogger("phoenix.stub")
ServedLogRequest = REQUEST_TYPES[SERVED_LOG.name]


class NoStoreToWrite(NoStore):
    """No store configured: every write fails saying so (and the feed is still answered)."""

    record_served = NoStore._fail


def new_request_id() -> int:
    """63 random bits: a positive int64, unique in practice (0 is never given)."""
    return secrets.randbits(63) or 1


def row_record(
    request, row: int, request_id: int, now: float, columns: np.ndarray | None = None
) -> RequestRecord:
    """The request log entry of one user row, padding (post id 0) left out; the history's
    action flags as the store's actions (``columns``: ``user_state.action_columns`` of
    artifacts whose actions differ, the production family's slots)."""
    history = request.history_post_ids[row] != 0
    candidates = request.candidate_post_ids[row] != 0
    shown = request.ranked_post_ids[row] != 0
    return RequestRecord(
        request_id=request_id,
        user_id=int(request.user_id[row, 0]),
        ts=now,
        own_history=request.sent_history_post_ids is not None,
        num_actions=request.action_probs.shape[-1],
        history_post_ids=request.history_post_ids[row][history],
        history_author_ids=request.history_author_ids[row][history],
        history_actions=action_bits(feed_actions(request.history_actions[row][history], columns)),
        history_product_surface=request.history_product_surface[row][history],
        history_dwell_seconds=request.history_dwell_seconds[row][history],
        candidate_post_ids=request.candidate_post_ids[row][candidates],
        candidate_author_ids=request.candidate_author_ids[row][candidates],
        candidate_retrieval_scores=request.candidate_retrieval_scores[row][candidates],
        ranked_post_ids=request.ranked_post_ids[row][shown],
        ranked_author_ids=request.ranked_author_ids[row][shown],
        scores=request.scores[row][shown],
        retrieval_scores=request.retrieval_scores[row][shown],
        action_probs=request.action_probs[row][shown],
        in_network=request.in_network[row][shown],
    )


class ServedLogService(StoreBackedService):
    """Marks each row's feed served, logs the request, answers its request id."""

    request_type = ServedLogRequest
    absent_store = NoStoreToWrite

    def __init__(self, config, store, *, request_ids: Callable[[], int] = new_request_id, **kw):
        super().__init__(config, store, **kw)
        self.request_ids = request_ids
        self.unlogged_rows = 0  # rows whose write was lost (store down or unset)
        self.columns = action_columns(config)

    def run(self, requests: Sequence) -> list[Outputs]:
        now = self.clock()
        outputs, records = [], []
        for request in requests:
            ids = np.array([[self.request_ids()] for _ in range(request.rows)], np.int64)
            outputs.append({"request_id": ids})
            records += [
                row_record(request, r, int(ids[r, 0]), now, self.columns)
                for r in range(request.rows)
            ]
        self.write(records, now)
        return outputs

    def write(self, records: list[RequestRecord], now: float) -> None:
        """The batch's one write; a failure is logged and counted, never raised."""
        served = [
            (r.user_id, r.ranked_post_ids, str(r.request_id)) for r in records if not r.own_history
        ]
        try:
            self.store.record_served(served, now, log=records)
        except UserStateError as error:
            self.unlogged_rows += len(records)
            logger.warning(
                "served_log: %d rows answered without being recorded (%d so far): %s",
                len(records),
                self.unlogged_rows,
                error,
            )
