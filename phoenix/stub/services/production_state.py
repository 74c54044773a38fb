"""What the user_state stage answers beside the histories for an artifact of the production
family (X's production ranker, docs/production.md): ``contracts.PRODUCTION_STATE``.

- **Per history item** (the ranking history's, as the stage answers it): the impression time,
  the post's creation time, the viewer's timezone and local hour + 1, the post's semantic IDs
  [L, levels]. By id they come from the store's history (the hour, when the event gave none,
  from the time and timezone: ``History.hour_of_day``), the semantic IDs from the corpus store
  as the store reads the history (``UserStateStore(semantic_ids=...)``). A request carrying its
  history may carry them: what it leaves out is 0 (unknown), except the hour, computed from the
  items' impression times and timezones when it sent those, and the semantic IDs, looked up by
  post.
- **The profile** (``feed_features.PROFILE_FEATURES``, one value a row, installed apps [64]
  flags): the store's by id, the request's own with a history (0, unknown, where it sends none).
- **The request's context**: ``request_timezone``, the request's own, else the profile's home
  timezone (0, unknown, without one); ``request_hour_of_day``, the request's own, else the
  local hour + 1 of the server's clock in that timezone (``profile.request_context``).

Numpy only; the corpus look-up is the stage's (a look-up-only follower of the store).

Shape glossary (R rows of one request): L history items.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from phoenix.feed_features import SID_NUM_LEVELS, local_hour
from phoenix.schema.batches import stack_padded
from phoenix.schema.production_inputs import (
    HISTORY_CONTEXT_FEATURES,
    HISTORY_CONTEXT_INPUTS,
    PROFILE_INPUTS,
    REQUEST_CONTEXT,
)
from phoenix.user_state import History
from phoenix.user_state.profile import record_arrays

Arrays = dict[str, np.ndarray]
# post ids [...] int64 -> their semantic IDs [..., levels] int32 (zeros where unknown)
SemanticIds = Callable[[np.ndarray], np.ndarray]

HISTORY_CONTEXT_NAMES = tuple(spec.name for spec in HISTORY_CONTEXT_INPUTS)
PROFILE_NAMES = tuple(spec.name for spec in PROFILE_INPUTS)
REQUEST_TIMEZONE, REQUEST_HOUR = (spec.name for spec in REQUEST_CONTEXT)
# every input of the user_state stage that only the production family reads
INPUTS = (*HISTORY_CONTEXT_NAMES, *PROFILE_NAMES, REQUEST_TIMEZONE, REQUEST_HOUR)
HOME_TIMEZONE = "timezone"  # the profile's
LEVELS = SID_NUM_LEVELS


def item_context(history: History) -> tuple[np.ndarray, ...]:
    """The history's context arrays, in ``HISTORY_CONTEXT_INPUTS``' order."""
    features = history.features()
    return tuple(features[name] for name in HISTORY_CONTEXT_FEATURES)


def request_context(
    home_timezone: np.ndarray,
    now: float,
    timezone: np.ndarray | None = None,
    hour_of_day: np.ndarray | None = None,
) -> Arrays:
    """[R, 1] int32 each: the request's timezone (``timezone`` when sent, else the home one) and
    local hour + 1 (``hour_of_day`` when sent, else at ``now`` in that timezone)."""
    zone = np.asarray(home_timezone if timezone is None else timezone, np.int32).reshape(-1, 1)
    hour = local_hour(np.full(zone.shape, now), zone) if hour_of_day is None else hour_of_day
    return {REQUEST_TIMEZONE: zone, REQUEST_HOUR: np.asarray(hour, np.int32).reshape(-1, 1)}


def history_context(histories: Sequence[History]) -> Arrays:
    """[R, L, ...] of each history item's context, right-padded with zeros to the longest (the
    histories the stage answers, items it left out already gone)."""
    width = max(len(h) for h in histories)
    columns = [item_context(h) for h in histories]
    return {
        spec.name: stack_padded([c[i][None] for c in columns], width, len(columns))
        for i, spec in enumerate(HISTORY_CONTEXT_INPUTS)
    }


def profile_outputs(profiles: Mapping[str, np.ndarray]) -> Arrays:
    """{feature: [R, 1]} (installed apps [R, 64]) of {feature: [R] or [R, 64]} arrays."""
    return {
        spec.name: np.asarray(profiles[spec.name], spec.dtype).reshape(len(profiles[spec.name]), -1)
        for spec in PROFILE_INPUTS
    }


def stored(request, users: Sequence, histories: Sequence[History], now: float) -> Arrays:
    """One by-id request's production outputs: its rows' stored histories (as answered, with
    their semantic IDs), stored profiles (``UserState.profile_record``) and the request's
    context at ``now`` (the request's own, else from the profiles' home timezones)."""
    profiles = profile_outputs(record_arrays([u.profile_record for u in users]))
    return {
        **history_context(histories),
        **profiles,
        **request_context(
            profiles[HOME_TIMEZONE], now, request.request_timezone, request.request_hour_of_day
        ),
    }


def carried(request, semantic_ids: SemanticIds, now: float) -> Arrays:
    """One request's production outputs from the history, profile and context it carries
    (``UserStateRequest``; what it leaves out as described in the module's docstring)."""
    shape = request.history_post_ids.shape  # [R, L]
    out: Arrays = {}
    for spec in HISTORY_CONTEXT_INPUTS:
        sent = getattr(request, spec.name)
        zeros = np.zeros(shape + tuple(int(a) for a in spec.axes[1:]), spec.dtype)
        out[spec.name] = zeros if sent is None else np.asarray(sent, spec.dtype)
    if request.history_hour_of_day is None and request.history_impression_time is not None:
        out["history_hour_of_day"] = local_hour(
            out["history_impression_time"], out["history_timezone"]
        )
    if request.history_semantic_ids is None:
        out["history_semantic_ids"] = np.asarray(
            semantic_ids(request.history_post_ids), np.int32
        ).reshape(out["history_semantic_ids"].shape)
    rows = shape[0]
    for spec in PROFILE_INPUTS:
        sent = getattr(request, spec.name)
        unknown = np.zeros((rows, *spec.axes), spec.dtype)
        out[spec.name] = unknown if sent is None else np.asarray(sent, spec.dtype)
    out.update(
        request_context(
            out[HOME_TIMEZONE], now, request.request_timezone, request.request_hour_of_day
        )
    )
    return out
