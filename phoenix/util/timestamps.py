"""How far ahead of now an input's Unix-second time may lie, and what a time past that most
likely is (imports the standard library only).

Every path that takes times from producers reads the bound from here: `phoenix-ingest` (a
post's ``created_at``) and `phoenix-events` (an event's ``ts``). A day covers any clock skew
and time-zone slip a producer can have; a time further ahead is a unit mistake, and the usual
one is milliseconds or microseconds since the epoch, which lie about a thousand or a million
times as far from zero as now does.
"""

from __future__ import annotations

import math
from typing import Optional

FUTURE_SLACK_S = 86_400  # a day: more is a unit mistake, not clock skew
# Units a time in seconds is mistaken for, by the power of ten they multiply it by.
_UNITS = {3: "milliseconds", 6: "microseconds", 9: "nanoseconds"}


def mistaken_unit(value: float, now: float) -> Optional[str]:
    """The unit ``value`` looks like it was written in ("milliseconds", ...) when it lies
    within a factor of about 3 of now times a thousand, a million or a billion; else None."""
    if not (value > 0 and now > 0 and math.isfinite(value)):
        return None
    exponent = math.log10(value / now)
    nearest = 3 * round(exponent / 3)
    return _UNITS.get(nearest) if abs(exponent - nearest) <= 0.5 else None


def too_far_ahead(value: float, now: float, slack_s: float = FUTURE_SLACK_S) -> Optional[str]:
    """None when ``value`` is at most ``slack_s`` ahead of ``now``, else why it is refused
    (naming the unit it looks like, if any)."""
    if value <= now + slack_s:
        return None
    slack = "a day" if slack_s == 86_400 else f"{slack_s:g} s"
    ahead = f"more than {slack} ahead of now ({int(now)})"
    unit = mistaken_unit(value, now)
    if unit:
        return f"{ahead}: it looks like {unit}; expected Unix seconds"
    return f"{ahead}; expected Unix seconds no later than that"
