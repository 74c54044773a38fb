"""A user's profile (``events.Profile``) as one Redis string, kept newest by its time.

Layout of the value (41 bytes): the profile's time in ms as a big-endian int64 (so that the
bytes of two values order as their times), a layout version (uint8), then the features of
``phoenix.feed_features.PROFILE_FEATURES`` little-endian: country and language (uint16),
latitude and longitude (float32), the installed apps as a 64-bit mask (bit i: app i), profile
and inferred gender (uint8), the inferred gender's score (float32), age bracket (uint8), age in
years (float32) and the home timezone (uint8).

A write replaces the value only with a greater one, byte by byte (``SET_NEWER``): the newest
profile wins, and of two with one time the same one always does, so applying profile events
again, in any order, leaves the same value (idempotent, as every user-state write). The key
has no expiry: a profile is what a user who comes back after months is served by.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from phoenix.feed_features import NUM_INSTALLED_APPS, PROFILE_FEATURES, local_hour
from phoenix.user_state.events import Profile
from phoenix.user_state.history import time_ms

LAYOUT = 1
RECORD = np.dtype(
    [
        ("ts_ms", ">i8"),
        ("layout", "u1"),
        ("country", "<u2"),
        ("language", "<u2"),
        ("latitude", "<f4"),
        ("longitude", "<f4"),
        ("installed_apps", "<u8"),
        ("profile_gender", "u1"),
        ("inferred_gender", "u1"),
        ("inferred_gender_score", "<f4"),
        ("age_bracket", "u1"),
        ("age_years", "<f4"),
        ("timezone", "u1"),
    ]
)
APP_BITS = np.uint64(1) << np.arange(NUM_INSTALLED_APPS, dtype=np.uint64)  # [64]

# KEYS[1]: the user's profile key; ARGV[1]: the packed profile. Compared byte by byte (Lua's
# string order follows the server's locale, which need not be the bytes').
SET_NEWER = """
local new, old = ARGV[1], redis.call('GET', KEYS[1])
if old then
  local n = math.min(#new, #old)
  local i = 1
  while i <= n and string.byte(new, i) == string.byte(old, i) do i = i + 1 end
  local newer = (i <= n and string.byte(new, i) > string.byte(old, i)) or (i > n and #new > #old)
  if not newer then return 0 end
end
redis.call('SET', KEYS[1], new)
return 1
"""


def pack(profile: Profile) -> bytes:
    """The stored value of ``profile``."""
    record = np.zeros(1, RECORD)
    record["ts_ms"] = time_ms(profile.ts)
    record["layout"] = LAYOUT
    for spec in PROFILE_FEATURES:
        value = getattr(profile, spec.name)
        if spec.kind == "apps":
            value = int(APP_BITS[list(value)].sum()) if value else 0
        record[spec.name] = value
    return record.tobytes()


def check_record(whose: str, data: bytes) -> None:
    """ValueError unless ``data`` is a stored profile of this layout (``whose``: for the
    message, e.g. "user 7")."""
    if len(data) != RECORD.itemsize or data[8] != LAYOUT:
        raise ValueError(
            f"the profile of {whose} is {len(data)} bytes of layout "
            f"{data[8] if len(data) > 8 else None}: not written by this store"
        )


def unpack(user_id: int, data: Optional[bytes]) -> Optional[Profile]:
    """The profile of a stored value; None for no value. ValueError for a value this store
    did not write."""
    if data is None:
        return None
    check_record(f"user {user_id}", data)
    record = np.frombuffer(data, RECORD)[0]
    values: dict[str, Any] = {}
    for spec in PROFILE_FEATURES:
        value = record[spec.name]
        if spec.kind == "apps":
            values[spec.name] = tuple(np.flatnonzero(int(value) & APP_BITS).tolist())
        else:
            values[spec.name] = float(value) if spec.kind == "float" else int(value)
    return Profile(user_id, int(record["ts_ms"]) / 1000.0, **values)


def record_arrays(records: Sequence[Optional[bytes]]) -> dict[str, np.ndarray]:
    """{feature name: array [B, ...]}: stored profiles (``UserState.profile_record``) as the
    production ranker's user features (``PROFILE_FEATURES``' names and dtypes; installed apps as
    [B, 64] flags), zeros for a user without one (None); decoded in one pass over the batch.
    ValueError for a value this store did not write."""
    present = [(i, data) for i, data in enumerate(records) if data is not None]
    for i, data in present:
        check_record(f"row {i}", data)
    rows = [i for i, _ in present]
    stored = np.frombuffer(b"".join(data for _, data in present), RECORD)
    out = {}
    for spec in PROFILE_FEATURES:
        shape = (len(records), spec.width) if spec.width else (len(records),)
        array = np.zeros(shape, spec.dtype)
        if spec.kind == "apps":
            array[rows] = (stored[spec.name][:, None] & APP_BITS) != 0
        else:
            array[rows] = stored[spec.name]
        out[spec.name] = array
    return out


def queue_set(pipe, key: str, profile: Profile) -> None:
    """Queue on ``pipe`` the write of ``profile`` to ``key`` unless it holds a newer one."""
    # execute_command: the cluster pipeline's eval() is a stub, but EVAL itself routes by key
    pipe.execute_command("EVAL", SET_NEWER, 1, key, pack(profile))


def profile_arrays(profiles: Sequence[Optional[Profile]]) -> dict[str, np.ndarray]:
    """``record_arrays`` of profiles (None: a user without one)."""
    return record_arrays([None if p is None else pack(p) for p in profiles])


def request_context(home_timezone: int, now: float, timezone: Optional[int] = None):
    """(timezone, hour of day + 1) of a request at ``now``: the request's own ``timezone``
    when it gives one, else the user's home timezone (0, unknown, without a profile)."""
    zone = home_timezone if timezone is None else timezone
    return zone, int(local_hour(now, zone))
