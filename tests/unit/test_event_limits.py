"""An event is accepted only if serving takes what it becomes: each bad kind is refused naming
the field and what was expected, values at the bounds are accepted, and the bounds are
serving's own (an engagement just inside passes the ranker's input checks, one just past fails
them). Times: at most a day ahead of now, the bound phoenix-ingest puts on posts, and a time in
milliseconds or microseconds is refused saying so."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clients.events import served_limits
from phoenix.checkpoint import load_config
from phoenix.corpus_store.ingestion import BadLine
from phoenix.corpus_store.ingestion import parse_line as parse_post_line
from phoenix.schema.contracts import RANKER
from phoenix.schema.requests import InputCheck, InputError, check_values
from phoenix.user_state.events import Engagement, EventError, parse_event
from phoenix.user_state.history import History, decode, encode
from phoenix.util.timestamps import FUTURE_SLACK_S, mistaken_unit, too_far_ahead

TRAINED_DEMO = Path(__file__).resolve().parents[2] / "artifacts" / "trained-demo"
CONFIG = load_config(TRAINED_DEMO)
LIMITS = served_limits(TRAINED_DEMO)
NOW = 1_767_225_600.0
FLOAT32_MAX = float(np.finfo(np.float32).max)
ENGAGEMENT = {"type": "engagement", "user_id": 7, "post_id": 91, "author_id": 3,
              "ts": NOW - 60, "actions": ["favorite"], "surface": 1,
              "dwell_seconds": 2.5}  # fmt: skip


def engagement(**fields) -> str:
    """A good engagement's JSON line with ``fields`` changed."""
    return json.dumps(ENGAGEMENT | fields)


def parse(line: str):
    return parse_event(line, LIMITS, now=NOW)


def engagement_event(**fields) -> Engagement:
    """The good engagement with ``fields`` changed, as an event (the dataclass's own checks:
    what the store can hold)."""
    return Engagement.of(**{k: v for k, v in (ENGAGEMENT | fields).items() if k != "type"})


BAD = {  # kind -> (line, what the refusal says)
    "surface out of range": (
        engagement(surface=CONFIG.product_surface_vocab_size),
        f"surface must lie in [0, 15] (the product surfaces of {TRAINED_DEMO}), got 16",
    ),
    "negative surface": (  # the artifacts' surfaces, not the int64 bound of an id
        engagement(surface=-1),
        f"surface must lie in [0, 15] (the product surfaces of {TRAINED_DEMO}), got -1",
    ),
    "unknown action": (engagement(actions=["like"]), "unknown action 'like'; expected one of"),
    "negative id": (engagement(user_id=-1), "user_id must be an integer in [0, 2**63 - 1]"),
    "overflowing id": (
        engagement(post_id=2**63),
        "post_id must be an integer in [1, 2**63 - 1], got 9223372036854775808",
    ),
    "ms timestamp": (
        engagement(ts=NOW * 1000),
        "ts is 1767225600000.0, more than a day ahead of now (1767225600): it looks like "
        "milliseconds; expected Unix seconds",
    ),
    "us timestamp": (engagement(ts=int(NOW) * 10**6), "it looks like microseconds"),
    "a day ahead": (
        engagement(ts=NOW + FUTURE_SLACK_S + 1),
        "more than a day ahead of now (1767225600); expected Unix seconds no later than that",
    ),
    "NaN dwell": (engagement(dwell_seconds=float("nan")), "dwell_seconds must be finite"),
    "infinite dwell": (engagement(dwell_seconds=float("inf")), "dwell_seconds must be finite"),
    "dwell past float32": (
        engagement(dwell_seconds=1e39),
        "dwell_seconds must be at most 3.40282e+38 (what the models' dwell input holds)",
    ),
    "negative dwell": (engagement(dwell_seconds=-1), "dwell_seconds must be finite and >= 0"),
    "malformed line": ('{"type": "engagement", "user_id": 7,', "not JSON"),
    "follow in ms": (
        json.dumps({"type": "follow", "user_id": 7, "author_id": 3, "ts": NOW * 1000}),
        "looks like milliseconds",
    ),
    "post in us": (
        json.dumps({"type": "post", "post_id": 92, "author_id": 3, "ts": NOW * 1e6}),
        "looks like microseconds",
    ),
}


@pytest.mark.parametrize("kind", BAD)
def test_each_bad_kind_is_refused_saying_what_was_expected(kind):
    line, message = BAD[kind]
    with pytest.raises(EventError) as refused:
        parse(line)
    assert message in str(refused.value)


@pytest.mark.parametrize(
    "fields",
    [
        {"surface": CONFIG.product_surface_vocab_size - 1},
        {"dwell_seconds": FLOAT32_MAX},
        {"user_id": 0, "post_id": 2**63 - 1, "author_id": 2**63 - 1},
        {"ts": NOW + FUTURE_SLACK_S},
        {"ts": 0},
    ],
)
def test_values_at_the_bounds_are_accepted(fields):
    assert parse(engagement(**fields)) == engagement_event(**fields)


def test_a_time_slightly_ahead_is_kept_as_given():
    """Accepted unchanged: a clamp to now would make the same event a different member each
    time it is applied, and applying it again must change nothing."""
    assert parse(engagement(ts=NOW + 5)).ts == NOW + 5


def serving_refusal(event: Engagement) -> str | None:
    """What the ranker's input checks say of the history ``event`` becomes (None: taken)."""
    with np.errstate(over="ignore"):  # a dwell past float32 is packed as inf: serving's case
        history = History.from_records(decode([encode(event)]))
    for name, array in history.inputs().items():
        try:
            check_values(InputCheck.of(RANKER.input(name)), array[None], CONFIG)
        except InputError as error:
            return str(error)
    return None


@pytest.mark.parametrize(
    "field, inside, past",
    [("surface", CONFIG.product_surface_vocab_size - 1, CONFIG.product_surface_vocab_size),
     ("dwell_seconds", FLOAT32_MAX, 1e39)],
)  # fmt: skip
def test_the_bounds_are_the_ones_serving_checks(field, inside, past):
    taken = parse(engagement(**{field: inside}))
    assert serving_refusal(taken) is None
    with pytest.raises(EventError, match=field):
        parse(engagement(**{field: past}))
    # the event as the store could still hold it (int32 surface, finite dwell): serving refuses
    assert serving_refusal(engagement_event(**{field: past})) is not None


def test_the_future_bound_is_phoenix_ingests():
    ahead = NOW + FUTURE_SLACK_S + 1
    with pytest.raises(BadLine, match="more than a day ahead"):
        parse_post_line(json.dumps({"post_id": 92, "author_id": 3, "created_at": ahead}), NOW)
    with pytest.raises(EventError, match="more than a day ahead"):
        parse(engagement(ts=ahead))
    assert parse_post_line(json.dumps({"post_id": 92, "author_id": 3, "created_at": NOW}), NOW)


@pytest.mark.parametrize(
    "value, unit",
    [
        (NOW * 1e3, "milliseconds"),
        (NOW * 3e3, "milliseconds"),
        (NOW * 1e6, "microseconds"),
        (NOW * 1e9, "nanoseconds"),
        (NOW * 100, None),  # far ahead, but no unit's factor
        (NOW + 2 * FUTURE_SLACK_S, None),
    ],
)
def test_a_time_far_ahead_names_the_unit_it_looks_like(value, unit):
    assert mistaken_unit(value, NOW) == unit
    assert too_far_ahead(value, NOW) is not None
    assert (f"looks like {unit}" in too_far_ahead(value, NOW)) == (unit is not None)
