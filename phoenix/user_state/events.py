"""User-state events and their JSON-lines form.

Five kinds, one JSON object a line (``type`` names the kind; times are Unix seconds):

    {"type": "engagement", "user_id": 7, "post_id": 91, "author_id": 3, "ts": 1700000000.5,
     "actions": ["favorite", "dwell"], "surface": 0, "dwell_seconds": 12.5}
    {"type": "follow", "user_id": 7, "author_id": 3, "ts": 1700000000}
    {"type": "unfollow", "user_id": 7, "author_id": 3, "ts": 1700000100}
    {"type": "post", "post_id": 92, "author_id": 3, "ts": 1700000200}
    {"type": "profile", "user_id": 7, "ts": 1700000000, "country": 3, "language": 1,
     "latitude": 51.5, "longitude": -0.1, "installed_apps": [2, 17], "profile_gender": 2,
     "inferred_gender": 1, "inferred_gender_score": 0.9, "age_bracket": 3, "age_years": 29,
     "timezone": 6}

``actions`` lists action names (``phoenix.config.ACTION_NAMES``) or gives all 19 flags (0/1) in
column order; ``surface`` and ``dwell_seconds`` default to 0. An engagement needs at least one
action (an impression without one is no engagement). Post and author ids are >= 1 (0 is the
padding id of the model inputs); user ids are >= 0; every id fits an int64.

What X's production ranker reads beyond them (``phoenix.feed_features``, its ranges): an
engagement may carry the viewer's ``timezone`` (0..31, 0 unknown), the local ``hour_of_day``
+ 1 (1..24; 0 or absent: from ``ts`` and ``timezone``) and the post's ``post_created_at``
(Unix seconds, 0 or absent: unknown). A profile event gives a user's whole profile, every
field optional (absent: unknown, 0); the newest profile by ``ts`` is the user's.

An event read from a line is accepted only if serving would take what it becomes: the
``EventLimits`` of the served models bound the product surface and the dwell time (the
contract's bounds, resolved by the caller: `phoenix-events` does it from the served artifacts),
and a time may lie at most ``phoenix.util.timestamps.FUTURE_SLACK_S`` ahead of now (the bound
`phoenix-ingest` puts on posts; a time in milliseconds or microseconds is far past it). A time
slightly ahead is accepted as it is: reads cover [now - window, now], so such an event counts
from its own time on (docs/user-state.md, "Events and the stream").

``parse_event`` raises ``EventError`` naming what is wrong; ``parse_lines`` refuses bad lines
with a warning naming the source and line number, and counts them.

Imports: the standard library, ``phoenix.config``, ``phoenix.util`` (timestamps, JSON lines) and
``phoenix.user_state.actions``; nothing of the stub side (the layer above), which hands
its bounds down as ``EventLimits``.
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Union

from phoenix.config import ACTION_NAMES
from phoenix.config_parts import INT64_MAX
from phoenix.feed_features import HISTORY_FEATURES, PROFILE_FEATURES, Feature, feature
from phoenix.user_state.actions import NUM_ACTIONS, action_mask, action_names
from phoenix.util.json_lines import JSONLineError, json_line
from phoenix.util.timestamps import FUTURE_SLACK_S, too_far_ahead

logger = logging.getLogger(__name__)


class EventError(ValueError):
    """An event that cannot be applied: malformed JSON, a missing or wrong field."""


def _check_id(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        raise EventError(f"{name} must be an integer in [{low}, 2**63 - 1], got {value!r}")
    return value


def _check_number(name: str, value: Any, low: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EventError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value) or value < low:
        raise EventError(f"{name} must be finite and >= {low:g}, got {value!r}")
    return float(value)


def _check_feature(spec: Feature, value: Any) -> Any:
    """``value`` if it lies in ``spec``'s range (a set of apps: as a sorted tuple), else
    EventError naming the field and what was expected."""
    if spec.kind == "int" and type(value) is int and spec.low <= value <= spec.high:
        return value  # the usual case, first: every engagement has two such fields
    about = f" ({spec.about})" if spec.about else ""
    bounds = f"[{spec.low:g}, {spec.high:g}]{about}"

    def in_range(item: Any, integer: bool) -> bool:
        if isinstance(item, bool) or not isinstance(item, int if integer else int | float):
            return False
        return math.isfinite(item) and spec.low <= item <= spec.high

    if spec.kind == "apps":
        expected = f"a list of distinct integers in {bounds}"
        if not isinstance(value, list | tuple) or len(set(value)) != len(value):
            raise EventError(f"{spec.name} must be {expected}, got {value!r}")
        for item in value:
            if not in_range(item, True):
                raise EventError(f"{spec.name} holds {item!r}, expected {expected}")
        return tuple(sorted(value))
    if not in_range(value, spec.kind == "int"):
        kind = "an integer" if spec.kind == "int" else "a number"
        raise EventError(f"{spec.name} must be {kind} in {bounds}, got {value!r}")
    return value


@dataclass(frozen=True)
class Engagement:
    """A user's actions on a post (one history item)."""

    user_id: int
    post_id: int
    author_id: int
    ts: float
    actions: int  # bit i = ACTION_NAMES[i] (phoenix.user_state.actions)
    surface: int = 0
    dwell_seconds: float = 0.0
    # the production ranker's context (feed_features): 0 is unknown, or for the hour "from ts
    # and timezone"
    timezone: int = 0
    hour_of_day: int = 0
    post_created_at: float = 0.0
    type: str = field(default="engagement", init=False)

    def __post_init__(self):
        _check_id("user_id", self.user_id, 0)
        _check_id("post_id", self.post_id, 1)
        _check_id("author_id", self.author_id, 1)
        _check_number("ts", self.ts)
        _check_id("surface", self.surface, 0)
        if self.surface > 2**31 - 1:
            raise EventError(f"surface must fit an int32, got {self.surface}")
        _check_number("dwell_seconds", self.dwell_seconds)
        if not 0 < self.actions < 1 << NUM_ACTIONS:
            raise EventError("an engagement needs at least one action")
        for name in ("timezone", "hour_of_day"):
            _check_feature(feature(name, HISTORY_FEATURES), getattr(self, name))
        _check_number("post_created_at", self.post_created_at)

    @property
    def context(self) -> tuple[int, int, float]:
        """(timezone, hour_of_day, post_created_at): all 0 for an engagement without them."""
        return self.timezone, self.hour_of_day, self.post_created_at

    @classmethod
    def of(cls, user_id, post_id, author_id, ts, actions: Iterable[str], **rest) -> Engagement:
        """An engagement with its actions given by name."""
        try:
            mask = action_mask(actions)
        except ValueError as error:
            raise EventError(str(error)) from None
        return cls(user_id, post_id, author_id, ts, mask, **rest)


@dataclass(frozen=True)
class _FollowEdge:
    user_id: int
    author_id: int
    ts: float

    def __post_init__(self):
        _check_id("user_id", self.user_id, 0)
        _check_id("author_id", self.author_id, 1)
        _check_number("ts", self.ts)


@dataclass(frozen=True)
class Follow(_FollowEdge):
    type: str = field(default="follow", init=False)


@dataclass(frozen=True)
class Unfollow(_FollowEdge):  # not a Follow: the store tells them apart by class
    type: str = field(default="unfollow", init=False)


@dataclass(frozen=True)
class Post:
    """A new post of an author (the in-network source)."""

    post_id: int
    author_id: int
    ts: float  # creation time
    type: str = field(default="post", init=False)

    def __post_init__(self):
        _check_id("post_id", self.post_id, 1)
        _check_id("author_id", self.author_id, 1)
        _check_number("ts", self.ts)


@dataclass(frozen=True)
class Profile:
    """A user's whole profile as of ``ts`` (fields as ``feed_features.PROFILE_FEATURES``,
    each 0 when unknown); the store keeps the newest."""

    user_id: int
    ts: float
    country: int = 0
    language: int = 0
    latitude: float = 0.0
    longitude: float = 0.0
    installed_apps: tuple[int, ...] = ()  # indices of the apps installed, ascending
    profile_gender: int = 0
    inferred_gender: int = 0
    inferred_gender_score: float = 0.0
    age_bracket: int = 0
    age_years: float = 0.0
    timezone: int = 0  # the home timezone
    type: str = field(default="profile", init=False)

    def __post_init__(self):
        _check_id("user_id", self.user_id, 0)
        _check_number("ts", self.ts)
        for spec in PROFILE_FEATURES:
            object.__setattr__(self, spec.name, _check_feature(spec, getattr(self, spec.name)))


Event = Union[Engagement, Follow, Unfollow, Post, Profile]
_FIELDS = {
    "engagement": (
        {"user_id", "post_id", "author_id", "ts", "actions"},
        {"surface", "dwell_seconds", "timezone", "hour_of_day", "post_created_at"},
    ),
    "follow": ({"user_id", "author_id", "ts"}, set()),
    "unfollow": ({"user_id", "author_id", "ts"}, set()),
    "post": ({"post_id", "author_id", "ts"}, set()),
    "profile": ({"user_id", "ts"}, {spec.name for spec in PROFILE_FEATURES}),
}


def _mask_of(actions: Any) -> int:
    """Action names, or all 19 flags in column order, as a mask."""
    if not isinstance(actions, list):
        raise EventError(f"actions must be a list of action names or of {NUM_ACTIONS} flags")
    if all(isinstance(a, str) for a in actions):
        try:
            return action_mask(actions)
        except ValueError as error:
            raise EventError(str(error)) from None
    if len(actions) != NUM_ACTIONS or any(a not in (0, 1) or isinstance(a, float) for a in actions):
        raise EventError(
            f"actions must be action names or exactly {NUM_ACTIONS} integer flags (0 or 1) in "
            f"the order {', '.join(ACTION_NAMES)}; got {actions!r}"
        )
    return action_mask([name for name, flag in zip(ACTION_NAMES, actions) if flag])


@dataclass(frozen=True)
class EventLimits:
    """What the served models take of an event beyond what it can hold, and from when on its
    time is a mistake. The model bounds come from the contracts (``phoenix.schema.contracts``)
    resolved against the served artifacts by the layer that knows them; this one only checks.
    """

    max_surface: int  # the largest product surface of the served artifacts
    max_dwell_seconds: float  # the largest finite value of the dwell input's dtype
    served: str = "the served artifacts"  # what the bounds are of, for messages
    future_slack_s: float = FUTURE_SLACK_S

    def check(self, event: Event, now: float) -> None:
        """EventError unless serving would take ``event`` at ``now``."""
        problem = too_far_ahead(event.ts, now, self.future_slack_s)
        if problem:
            raise EventError(f"ts is {event.ts!r}, {problem}")
        if not isinstance(event, Engagement):
            return
        problem = too_far_ahead(event.post_created_at, now, self.future_slack_s)
        if problem:
            raise EventError(f"post_created_at is {event.post_created_at!r}, {problem}")
        self.check_surface(event.surface)
        if event.dwell_seconds > self.max_dwell_seconds:
            raise EventError(
                f"dwell_seconds must be at most {self.max_dwell_seconds:g} (what the models' "
                f"dwell input holds), got {event.dwell_seconds!r}"
            )

    def check_surface(self, surface: Any) -> None:
        """EventError naming the served artifacts' product surfaces unless ``surface`` is one
        of them (an integer in [0, max_surface])."""
        integer = isinstance(surface, int) and not isinstance(surface, bool)
        if not integer or not 0 <= surface <= self.max_surface:
            raise EventError(
                f"surface must lie in [0, {self.max_surface}] (the product surfaces of "
                f"{self.served}), got {surface!r}"
            )


def event_from_dict(obj: Any, limits: EventLimits, now: Optional[float] = None) -> Event:
    """The event a decoded JSON object describes, if serving would take it at ``now`` (default:
    the clock's); EventError says what is wrong."""
    event = _event_of(obj, limits)
    limits.check(event, time.time() if now is None else now)
    return event


def _event_of(obj: Any, limits: EventLimits) -> Event:
    """The event a decoded JSON object describes; EventError says what is wrong (a surface
    in terms of ``limits``: the served artifacts' product surfaces)."""
    if not isinstance(obj, dict):
        raise EventError(f"an event must be a JSON object, got {type(obj).__name__}")
    kind = obj.get("type")
    if kind not in _FIELDS:
        raise EventError(f"type must be one of {', '.join(_FIELDS)}, got {kind!r}")
    required, optional = _FIELDS[kind]
    missing = sorted(required - obj.keys())
    unknown = sorted(obj.keys() - required - optional - {"type"})
    if missing or unknown:
        raise EventError(
            f"{kind} event: missing {missing or 'nothing'}, unknown {unknown or 'none'}"
        )
    args = {k: v for k, v in obj.items() if k != "type"}
    if kind == "engagement":
        limits.check_surface(args.get("surface", 0))
        args["actions"] = _mask_of(args["actions"])
        return Engagement(**args)
    made: dict[str, Callable[..., Event]] = {
        "follow": Follow, "unfollow": Unfollow, "post": Post, "profile": Profile
    }  # fmt: skip
    return made[kind](**args)


def parse_event(line: str, limits: EventLimits, now: Optional[float] = None) -> Event:
    """One JSON line -> its event, if serving would take it at ``now`` (default: the clock's);
    EventError says what is wrong."""
    try:
        obj = json_line(line)
    except JSONLineError as error:
        raise EventError(f"not JSON: {error}") from None
    try:
        return event_from_dict(obj, limits, now)
    except TypeError as error:  # a dataclass refusing an argument
        raise EventError(str(error)) from None


def to_json(event: Event) -> str:
    """The JSON line of ``event`` (``parse_event`` reads it back equal)."""
    obj: dict[str, Any] = {"type": event.type}
    obj.update({k: v for k, v in vars(event).items() if k != "type"})
    if isinstance(event, Engagement):
        obj["actions"] = list(action_names(event.actions))
        for name in ("timezone", "hour_of_day", "post_created_at"):  # as lines before them
            if not obj[name]:
                del obj[name]
    if isinstance(event, Profile):
        obj["installed_apps"] = list(event.installed_apps)
    return json.dumps(obj, separators=(",", ":"))


@dataclass
class ParseCounts:
    """Lines read, events parsed and lines refused (``skipped``: each one was logged)."""

    lines: int = 0
    events: int = 0
    skipped: int = 0


def parse_counted(
    line: str, source: str, number: int, counts: ParseCounts, limits: EventLimits
) -> Event | None:
    """The event of one JSON line; None for a blank line or a refused one (logged as
    ``source:N: why; line refused`` and counted as skipped)."""
    if not line.strip():
        return None
    counts.lines += 1
    try:
        event = parse_event(line, limits)
    except EventError as error:
        counts.skipped += 1
        logger.warning("%s:%d: %s; line refused", source, number, error)
        return None
    counts.events += 1
    return event


def parse_lines(
    lines: Iterable[str], source: str, limits: EventLimits, counts: ParseCounts | None = None
) -> Iterator[Event]:
    """The events of JSON ``lines``; a bad line is logged as ``source:N: why`` and refused,
    blank lines are ignored. ``counts`` (if given) is updated as lines are read."""
    counts = counts if counts is not None else ParseCounts()
    for number, line in enumerate(lines, start=1):
        event = parse_counted(line, source, number, counts, limits)
        if event is not None:
            yield event


def read_event_file(
    path: str | Path, limits: EventLimits, counts: ParseCounts | None = None
) -> list[Event]:
    """Every good event of a JSON-lines file (bad lines refused, logged and counted)."""
    path = Path(path)
    with path.open(encoding="utf-8") as lines:
        return list(parse_lines(lines, str(path), limits, counts))
