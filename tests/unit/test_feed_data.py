"""The data X's production ranker reads, without servers: the feature declarations
(phoenix/feed_features.py), the synthetic world's semantic IDs and profiles and their logs,
and the user-state events, history members and profiles that carry them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct

import numpy as np
import pytest

from phoenix import feed_features
from phoenix.feed_features import (
    HISTORY_NAMES,
    PROFILE_FEATURES,
    PROFILE_NAMES,
    SID_CODEBOOK_SIZE,
    SID_NUM_LEVELS,
    age_bracket,
    local_hour,
)
from phoenix.user_state.actions import action_mask
from phoenix.user_state.events import (
    Engagement,
    EventError,
    EventLimits,
    Profile,
    parse_event,
    to_json,
)
from phoenix.user_state.history import History, decode, encode
from phoenix.user_state.profile import (
    pack,
    profile_arrays,
    record_arrays,
    request_context,
    unpack,
)
from phoenix.world import logs as log_files
from phoenix.world import synthetic
from phoenix.world.features import CITIES, COUNTRY_NAMES, UserProfiles

SPEC = synthetic.WorldSpec(num_users=40, num_authors=12, num_posts=300, num_days=4)
LARGER = synthetic.WorldSpec(num_users=3000, num_authors=60, num_posts=4000, num_days=2)
SERVED = EventLimits(max_surface=15, max_dwell_seconds=float(np.finfo(np.float32).max))
TS = 1_700_000_000  # 2023-11-14 22:13:20 UTC


@pytest.fixture(scope="module")
def larger():
    return synthetic.make_world(LARGER, 5)


# -- the declarations ------------------------------------------------------------------------


def test_the_ranges_are_x_nano_configs():
    assert (SID_NUM_LEVELS, SID_CODEBOOK_SIZE) == (6, 256)
    assert feed_features.NUM_TIMEZONES == 32 and feed_features.NUM_HOURS_OF_DAY == 25
    assert feed_features.NUM_PRODUCT_SURFACES == 16
    sizes = {f.name: f.high + 1 for f in PROFILE_FEATURES if f.kind == "int"}
    assert (sizes["country"], sizes["language"], sizes["age_bracket"]) == (250, 200, 10)
    assert feed_features.feature("installed_apps").width == 64
    assert HISTORY_NAMES == (
        "product_surface", "impression_time", "creation_time", "timezone", "hour_of_day",
        "dwell_time", "semantic_ids",
    )  # fmt: skip


def test_every_holder_of_a_profile_names_its_fields_as_the_declarations():
    event_fields = [f.name for f in dataclasses.fields(Profile)]
    assert tuple(event_fields[2:-1]) == PROFILE_NAMES  # user_id, ts ... type
    assert tuple(f.name for f in dataclasses.fields(UserProfiles)) == PROFILE_NAMES


def test_the_local_hour_follows_the_timezone_and_is_unknown_without_a_time():
    zones = np.array([0, 1, 15, 24, 25, 99])  # UTC, New York, Kolkata, Sydney, Honolulu, past
    assert local_hour(TS, zones).tolist() == [23, 18, 4, 10, 13, 23]  # 22:13 UTC + 1
    assert local_hour(np.array([0, -5, TS]), 1).tolist() == [0, 0, 18]
    assert local_hour(TS + 3600 * np.arange(24), 0).tolist() == [23, 24, *range(1, 23)]


def test_age_brackets_start_at_their_floors_and_zero_is_unknown():
    ages = [0, 12, 13, 17, 18, 24, 25, 64, 65, 90]
    assert age_bracket(ages).tolist() == [0, 0, 1, 1, 2, 2, 3, 6, 7, 7]


# -- the world -------------------------------------------------------------------------------


def test_the_worlds_other_arrays_are_what_they_were_before_these_features():
    """sha256 of a small world's arrays, taken before the semantic IDs and profiles existed:
    they come from streams of their own, and the trained demo's world is unchanged."""
    world, imp = synthetic.generate_logs(SPEC, 3)
    digest = hashlib.sha256()
    for table, names in (
        (world, ["user_ids", "interest", "dislike", "follows", "activity", "author_ids",
                 "author_topic", "author_quality", "post_ids", "post_author", "post_topic",
                 "post_media", "post_created_ts", "post_quality"]),
        (imp, ["user", "post", "ts", "request", "surface", "dwell_seconds", "actions"]),
    ):  # fmt: skip
        for name in names:
            array = np.ascontiguousarray(getattr(table, name))
            digest.update(name.encode() + str(array.dtype).encode() + array.tobytes())
    expected = "9ee1042ec4e7e94eb44468d5565d9122853de5d4eed1d431bb684c057c43b9f4"
    assert digest.hexdigest() == expected


def test_semantic_ids_share_prefixes_by_topic_media_and_author(larger):
    sids, w = larger.post_semantic_ids, larger
    assert sids.shape == (LARGER.num_posts, 6) and sids.dtype == np.int32
    assert sids.min() >= 1 and sids.max() <= 256
    for level, key in ((0, w.post_topic), (1, w.post_topic * 3 + w.post_media),
                       (2, w.post_author)):  # fmt: skip
        # one code per group: the rows of a group agree at this level
        codes = {}
        for group, code in zip(key.tolist(), sids[:, level].tolist()):
            assert codes.setdefault(group, code) == code, (level, group)
    assert len(set(sids[:, 0].tolist())) == LARGER.num_topics  # a code per topic
    assert len(np.unique(sids, axis=0)) / len(sids) > 0.99  # the finest levels tell posts apart
    again = synthetic.make_world(LARGER, 5)
    assert np.array_equal(again.post_semantic_ids, sids)
    assert np.array_equal(again.profiles.installed_apps, w.profiles.installed_apps)
    assert not np.array_equal(synthetic.make_world(LARGER, 6).post_semantic_ids, sids)


def test_profiles_lie_in_xs_ranges_and_hint_at_interests(larger):
    profiles = larger.profiles
    for spec in PROFILE_FEATURES:
        values = getattr(profiles, spec.name)
        assert values.dtype == spec.dtype, spec.name
        assert values.shape[0] == LARGER.num_users, spec.name
        assert spec.low <= values.min() and values.max() <= spec.high, spec.name
    known = profiles.timezone > 0
    assert 0.01 < 1 - known.mean() < 0.06  # 3% unknown
    assert ((profiles.country > 0) == known).all() and (profiles.latitude[~known] == 0).all()
    country_of = {zone: COUNTRY_NAMES.index(c[1]) for zone, c in enumerate(CITIES, start=1)}
    assert all(country_of[z] == c for z, c in zip(profiles.timezone[known],
                                                  profiles.country[known]))  # fmt: skip
    primary = larger.interest.argmax(axis=1)
    has_primary_app = profiles.installed_apps[np.arange(LARGER.num_users), primary]
    assert 0.4 < has_primary_app.mean() < 0.6
    uninterested = larger.interest[:, : LARGER.num_topics] == 0
    assert not profiles.installed_apps[:, : LARGER.num_topics][uninterested].any()
    given = profiles.age_years > 0
    assert np.array_equal(profiles.age_bracket, age_bracket(profiles.age_years))
    assert 0.1 < 1 - given.mean() < 0.2 and profiles.age_years[given].min() >= 13


def test_logs_carry_the_features_and_a_schema_1_directory_still_loads(tmp_path):
    world, imp = synthetic.generate_logs(SPEC, 3)
    log_files.save_logs(tmp_path, world, imp, 3)
    arrays = np.load(tmp_path / "impressions.npz")
    assert np.array_equal(arrays["timezone"], world.profiles.timezone[imp.user])
    assert np.array_equal(arrays["hour_of_day"], local_hour(imp.ts, arrays["timezone"]))
    assert np.array_equal(np.load(tmp_path / "posts.npz")["semantic_ids"], world.post_semantic_ids)
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["semantic_ids"] == {"levels": 6, "codebook_size": 256}

    # a directory as schema 1 wrote it: no users.npz, no new columns
    old = tmp_path / "old"
    old.mkdir()
    for name in log_files.FILES:
        if name.endswith(".npz") and name != "users.npz":
            kept = {k: v for k, v in np.load(tmp_path / name).items()
                    if k not in ("timezone", "hour_of_day", "semantic_ids")}  # fmt: skip
            np.savez(old / name, **kept)
    (old / "meta.json").write_text(json.dumps(meta | {"schema": 1}))
    loaded, loaded_imp, _ = log_files.load_logs(old)
    assert np.array_equal(loaded.post_ids, world.post_ids)
    assert np.array_equal(loaded_imp.ts, imp.ts)
    assert not loaded.post_semantic_ids.any() and loaded.post_semantic_ids.shape == (300, 6)
    assert not loaded.profiles.installed_apps.any() and not loaded.profiles.timezone.any()

    (old / "meta.json").write_text(json.dumps(meta | {"schema": 3}))
    with pytest.raises(log_files.LogError, match="schema 3, expected one of"):
        log_files.load_logs(old)
    (old / "meta.json").write_text(json.dumps(meta))  # schema 2 without its columns
    with pytest.raises(log_files.LogError, match="posts.npz: missing column 'semantic_ids'"):
        log_files.load_logs(old)


# -- events, history members, profiles --------------------------------------------------------

OLD = Engagement.of(7, 91, 3, 1_700_000_000.5, ["favorite", "dwell"], surface=2,
                    dwell_seconds=12.5)  # fmt: skip
NEW = dataclasses.replace(OLD, timezone=1, post_created_at=1_699_990_000.0)
PROFILE = Profile(
    7, 1_700_000_000.0, country=3, language=1, latitude=51.5, longitude=-0.25,
    installed_apps=(17, 2), profile_gender=2, inferred_gender=1, inferred_gender_score=0.875,
    age_bracket=3, age_years=29.0, timezone=6,
)  # fmt: skip


def test_an_engagement_without_the_new_fields_is_the_same_member_and_line_as_before():
    packed = struct.pack("<qqIifq", 91, 3, action_mask(["favorite", "dwell"]), 2, 12.5,
                         1_700_000_000_500)  # fmt: skip
    assert encode(OLD) == packed
    assert json.loads(to_json(OLD)).keys() == {
        "type", "user_id", "post_id", "author_id", "ts", "actions", "surface", "dwell_seconds"
    }  # fmt: skip
    assert len(encode(NEW)) == 46 and encode(NEW)[:36] == packed  # the same, then the context
    assert parse_event(to_json(NEW), SERVED) == NEW


def test_members_of_both_forms_read_back_with_the_hour_from_time_and_timezone():
    given = dataclasses.replace(NEW, post_id=92, hour_of_day=5)
    records = decode([encode(OLD), encode(NEW), encode(given)])
    history = History.from_records(records)
    assert history.post_ids.tolist() == [91, 91, 92]
    assert history.creation_time.tolist() == [0, 1_699_990_000, 1_699_990_000]
    assert history.timezone.tolist() == [0, 1, 1]
    assert history.hour_of_day.tolist() == [23, 18, 5]  # UTC, New York, as given
    assert history.times.tolist() == [1_700_000_000.5] * 3
    features = history.features()
    assert tuple(features) == HISTORY_NAMES
    assert features["impression_time"].tolist() == [1_700_000_000] * 3
    assert features["semantic_ids"].shape == (3, 6) and not features["semantic_ids"].any()
    codes = np.arange(18, dtype=np.int32).reshape(3, 6)
    assert np.array_equal(history.with_semantic_ids(codes).semantic_ids, codes)
    assert np.array_equal(decode([encode(NEW)] * 2), decode([encode(NEW)] * 2))  # one form
    with pytest.raises(ValueError, match="not 36 or 46 bytes"):
        decode([encode(OLD), b"x" * 40])


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"timezone": 32}, "timezone must be an integer in [0, 31]"),
        ({"hour_of_day": 25}, "hour_of_day must be an integer in [0, 24]"),
        ({"timezone": True}, "timezone must be an integer"),
        ({"post_created_at": -1}, "post_created_at must be finite and >= 0"),
        ({"post_created_at": 1_700_000_000_000}, "post_created_at is 1700000000000, "),
    ],
)
def test_an_engagements_new_fields_are_refused_out_of_range(fields, message):
    line = json.loads(to_json(OLD)) | fields
    with pytest.raises(EventError, match=message.replace("[", r"\[")):
        parse_event(json.dumps(line), SERVED, now=1_700_000_000)


def test_a_profile_event_round_trips_and_packs_newest_first():
    assert PROFILE.installed_apps == (2, 17)  # kept sorted
    assert parse_event(to_json(PROFILE), SERVED) == PROFILE
    assert parse_event('{"type": "profile", "user_id": 8, "ts": 5}', SERVED) == Profile(8, 5.0)
    assert unpack(7, pack(PROFILE)) == PROFILE  # exact in float32
    assert unpack(7, None) is None
    older = dataclasses.replace(PROFILE, ts=PROFILE.ts - 1, country=200)
    assert pack(older) < pack(PROFILE)  # the bytes order as the times
    with pytest.raises(ValueError, match="not written by this store"):
        unpack(7, pack(PROFILE)[:-1])
    arrays = profile_arrays([PROFILE, None])
    assert tuple(arrays) == PROFILE_NAMES
    assert arrays["installed_apps"].shape == (2, 64)
    assert np.flatnonzero(arrays["installed_apps"][0]).tolist() == [2, 17]
    assert arrays["country"].tolist() == [3, 0] and arrays["latitude"].dtype == np.float32
    assert request_context(PROFILE.timezone, TS) == (6, 23)  # London in X's table: UTC
    assert request_context(PROFILE.timezone, TS, timezone=14) == (14, 8)  # the request's: Tokyo
    with pytest.raises(ValueError, match="the profile of row 1 is 40 bytes"):
        record_arrays([pack(PROFILE), pack(PROFILE)[:-1]])


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"country": 250}, "country must be an integer in [0, 249]"),
        ({"language": -1}, "language must be an integer in [0, 199]"),
        ({"latitude": 90.5}, "latitude must be a number in [-90, 90]"),
        ({"longitude": "east"}, "longitude must be a number"),
        ({"installed_apps": [3, 3]}, "installed_apps must be a list of distinct integers"),
        ({"installed_apps": [64]}, "installed_apps holds 64, expected a list"),
        ({"installed_apps": 5}, "installed_apps must be a list"),
        ({"profile_gender": 3}, "profile_gender must be an integer in [0, 2]"),
        ({"inferred_gender_score": 1.5}, "inferred_gender_score must be a number in [0, 1]"),
        ({"age_bracket": 10}, "age_bracket must be an integer in [0, 9]"),
        ({"age_years": float("nan")}, "age_years must be a number in [0, 150]"),
        ({"timezone": 1.0}, "timezone must be an integer in [0, 31]"),
        ({"city": "Paris"}, "unknown ['city']"),
    ],
)
def test_a_bad_profile_says_what_was_expected(fields, message):
    line = {"type": "profile", "user_id": 7, "ts": 5} | fields
    with pytest.raises(EventError, match=message.replace("[", r"\[")):
        parse_event(json.dumps(line), SERVED)
