"""The user_state stage for an artifact of the production family, against a real redis-server
and a real corpus store: by id, every history item's context, its post's semantic IDs (looked
up in the store), the profile and the request's context (the request's own, else the home
timezone at the clock); with a history, what the request carries and what it leaves out;
refusals of the new inputs; the original family unchanged and refusing them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from phoenix.checkpoint import load_config
from phoenix.config import ACTION_NAMES
from phoenix.corpus_store import StoreFollower
from phoenix.corpus_store.segment import Posts
from phoenix.corpus_store.semantic_ids import SemanticIdSpec
from phoenix.corpus_store.store import CorpusStore
from phoenix.feed_features import ACTION_SLOTS, local_hour
from phoenix.schema.contracts import PRODUCTION_STATE_NAMES, RETRIEVER, USER_STATE
from phoenix.schema.requests import InputError
from phoenix.stub.corpus import FollowedStore, semantic_id_lookup
from phoenix.stub.services.user_state import (
    UserStateService,
    action_columns,
    feed_actions,
    placed_actions,
)
from phoenix.user_state import Engagement, Profile, UserStateStore, connect

NOW = 1_780_000_123.0  # an hour of day the tests do not depend on
EMB = 4
POSTS = np.array([11, 12, 13, 14])
CODES = np.arange(1, 4 * 6 + 1, dtype=np.int32).reshape(4, 6) * 10  # codes 10..240
USER, HOME = 7, 14  # home timezone: Asia/Tokyo (+9)
PROFILE = Profile(
    USER, NOW - 999, country=11, language=10, latitude=35.7, longitude=139.7,
    installed_apps=(0, 5, 63), profile_gender=2, inferred_gender=1, inferred_gender_score=0.75,
    age_bracket=3, age_years=29.0, timezone=HOME,
)  # fmt: skip


@pytest.fixture
def corpus(tmp_path):
    """A corpus store holding POSTS' semantic IDs but the last one's, followed for look-ups."""
    store = CorpusStore.create(tmp_path / "corpus", EMB)
    codes = CODES.copy()
    codes[-1] = 0  # a post stored without one
    vectors = np.eye(EMB, dtype=np.float32)
    store.add(Posts(POSTS, np.full(4, 5), np.full(4, int(NOW) - 500), vectors, codes))
    followed = FollowedStore(StoreFollower(tmp_path / "corpus", EMB, searchable=False).start())
    yield followed
    followed.close()


def service(
    tiny_artifacts, url: str, corpus=None, production: bool = True, config=None
) -> UserStateService:
    lookup = None if corpus is None else semantic_id_lookup(corpus)
    store = UserStateStore(connect(url), name=url, semantic_ids=lookup)
    config = config or load_config(tiny_artifacts)
    return UserStateService(config, store, production=production, corpus=corpus, max_batch_size=8,
                            clock=lambda: NOW)  # fmt: skip


def events() -> list[Engagement]:
    """Four engagements: without context (as before it existed), with a timezone and the
    post's creation time (the hour derived), with an hour given, with all."""
    return [
        Engagement.of(USER, 11, 5, NOW - 400, ["favorite"], surface=2, dwell_seconds=1.5),
        Engagement.of(USER, 12, 5, NOW - 300, ["click"], timezone=3, post_created_at=NOW - 900),
        Engagement.of(USER, 99, 5, NOW - 200, ["reply"], timezone=7, hour_of_day=5),
        Engagement.of(
            USER,
            14,
            5,
            NOW - 100,
            ["favorite"],
            timezone=HOME,
            hour_of_day=23,
            post_created_at=NOW - 150,
        ),  # fmt: skip
    ]


def by_id(**more) -> dict:
    return {"user_id": np.array([[USER]], np.int64), **more}


def test_by_id_answers_each_items_context_its_semantic_ids_the_profile_and_the_context(
    tiny_artifacts, redis_server, corpus
):
    UserStateStore(connect(redis_server.url)).apply([*events(), PROFILE])
    svc = service(tiny_artifacts, redis_server.url, corpus)

    (out,) = svc.handle([by_id()])

    stamps = [int(NOW) - 400, int(NOW) - 300, int(NOW) - 200, int(NOW) - 100]
    assert out["history_post_ids"].tolist() == [[11, 12, 99, 14]]
    assert out["history_impression_time"].tolist() == [stamps]
    assert out["history_creation_time"].tolist() == [[0, int(NOW) - 900, 0, int(NOW) - 150]]
    assert out["history_timezone"].tolist() == [[0, 3, 7, HOME]]
    derived = [int(local_hour(stamps[0], 0)), int(local_hour(stamps[1], 3))]
    assert out["history_hour_of_day"].tolist() == [[*derived, 5, 23]]
    # 11 and 12 in the store with codes, 99 not in it, 14 stored without codes
    expected = [CODES[0].tolist(), CODES[1].tolist(), [0] * 6, [0] * 6]
    assert out["history_semantic_ids"].tolist() == [expected]
    assert out["history_semantic_ids"].dtype == np.int32
    assert out["country"].tolist() == [[11]] and out["language"].tolist() == [[10]]
    assert out["latitude"][0, 0] == pytest.approx(35.7) and out["age_years"].tolist() == [[29.0]]
    apps = out["installed_apps"]
    assert apps.dtype == np.int8 and apps.shape == (1, 64)
    assert np.flatnonzero(apps[0]).tolist() == [0, 5, 63]
    assert out["inferred_gender_score"].tolist() == [[0.75]] and out["timezone"].tolist() == [[14]]
    # the request's context: the home timezone at the clock
    assert out["request_timezone"].tolist() == [[HOME]]
    assert out["request_hour_of_day"].tolist() == [[int(local_hour(NOW, HOME))]]
    dtypes = {spec.name: spec.dtype for spec in USER_STATE.outputs}
    for name in PRODUCTION_STATE_NAMES:
        assert out[name].dtype == dtypes[name], name

    # the request's own context wins, each part on its own
    (sent,) = svc.handle([by_id(request_timezone=np.array([[1]], np.int32))])
    assert sent["request_timezone"].tolist() == [[1]]
    assert sent["request_hour_of_day"].tolist() == [[int(local_hour(NOW, 1))]]
    (hour,) = svc.handle([by_id(request_hour_of_day=np.array([[9]], np.int32))])
    assert (hour["request_timezone"].tolist(), hour["request_hour_of_day"].tolist()) == (
        [[HOME]],
        [[9]],
    )


def test_the_original_outputs_are_the_original_familys_and_it_answers_no_more(
    tiny_artifacts, redis_server, corpus
):
    UserStateStore(connect(redis_server.url)).apply([*events(), PROFILE])
    (production,) = service(tiny_artifacts, redis_server.url, corpus).handle([by_id()])
    original_service = service(tiny_artifacts, redis_server.url, production=False)
    (original,) = original_service.handle([by_id()])
    assert set(original) == set(production) - set(PRODUCTION_STATE_NAMES)
    for name, array in original.items():
        np.testing.assert_array_equal(production[name], array, err_msg=name)
    assert not hasattr(original_service, "corpus")  # it reads no corpus


def test_rows_of_a_request_and_a_user_without_profile_or_history(tiny_artifacts, redis_server,
                                                                 corpus):  # fmt: skip
    UserStateStore(connect(redis_server.url)).apply([*events(), PROFILE])
    svc = service(tiny_artifacts, redis_server.url, corpus)
    (out,) = svc.handle([{"user_id": np.array([[USER], [424242]], np.int64)}])
    assert out["history_timezone"].tolist() == [[0, 3, 7, HOME], [0, 0, 0, 0]]  # right-padded
    assert out["history_semantic_ids"].shape == (2, 4, 6)
    assert not out["history_semantic_ids"][1].any()
    assert out["country"].tolist() == [[11], [0]]  # unknown
    assert out["request_timezone"].tolist() == [[HOME], [0]]
    assert out["request_hour_of_day"].tolist() == [[int(local_hour(NOW, HOME))],
                                                   [int(local_hour(NOW, 0))]]  # fmt: skip


def carried_history(**more) -> dict:
    """A request carrying a three-item history: post 12 in the store, 13 and 500 not."""
    return {
        "user_id": np.array([[USER]], np.int64),
        "history_post_ids": np.array([[12, 13, 500]], np.int64),
        "history_author_ids": np.array([[5, 5, 5]], np.int64),
        "history_actions": np.zeros((1, 3, 19), np.float32),
        "history_product_surface": np.array([[0, 1, 2]], np.int32),
        **more,
    }


def test_with_a_history_what_the_request_carries_and_what_it_leaves_out(
    tiny_artifacts, redis_server, corpus
):
    svc = service(tiny_artifacts, redis_server.url, corpus)
    times = np.array([[int(NOW) - 30, int(NOW) - 20, 0]], np.int64)
    (bare,) = svc.handle([carried_history()])
    for name in ("history_impression_time", "history_creation_time", "history_timezone",
                 "history_hour_of_day", "country", "installed_apps", "timezone"):  # fmt: skip
        assert not bare[name].any(), name  # unknown
    # semantic IDs looked up by post; the context at the clock in UTC (no timezone known)
    assert bare["history_semantic_ids"].tolist() == [[CODES[1].tolist(), CODES[2].tolist(),
                                                      [0] * 6]]  # fmt: skip
    assert bare["request_timezone"].tolist() == [[0]]
    assert bare["request_hour_of_day"].tolist() == [[int(local_hour(NOW, 0))]]

    sent_codes = np.full((1, 3, 6), 7, np.int32)
    (full,) = svc.handle([carried_history(
        history_impression_time=times,
        history_timezone=np.array([[3, 3, 3]], np.int32),
        history_semantic_ids=sent_codes,
        country=np.array([[2]], np.int32),
        installed_apps=np.eye(64, dtype=np.int8)[None, 4],
        timezone=np.array([[HOME]], np.int32),
    )])  # fmt: skip
    assert full["history_impression_time"].tolist() == times.tolist()
    # the hour of the items' times in their timezone; an unknown time: unknown hour
    assert full["history_hour_of_day"].tolist() == [
        [int(local_hour(NOW - 30, 3)), int(local_hour(NOW - 20, 3)), 0]
    ]
    assert full["history_semantic_ids"].tolist() == sent_codes.tolist()  # as sent
    assert full["country"].tolist() == [[2]]
    assert np.flatnonzero(full["installed_apps"]).tolist() == [4]
    assert full["request_timezone"].tolist() == [[HOME]]  # the home timezone sent
    (hours,) = svc.handle([carried_history(history_hour_of_day=np.array([[1, 2, 3]], np.int32),
                                           history_impression_time=times)])  # fmt: skip
    assert hours["history_hour_of_day"].tolist() == [[1, 2, 3]]  # as sent


@pytest.mark.parametrize(
    "arrays, fragment",
    [
        (by_id(history_timezone=np.array([[3]], np.int32)), "without a history"),
        (by_id(country=np.array([[3]], np.int32)), "without a history"),
        (carried_history(history_timezone=np.array([[3, 3, 32]], np.int32)),
         "input 'history_timezone': timezone values must lie in [0, 31]"),
        (carried_history(history_hour_of_day=np.array([[3, 25, 1]], np.int32)),
         "input 'history_hour_of_day'"),
        (carried_history(history_semantic_ids=np.full((1, 3, 6), 257, np.int32)),
         "input 'history_semantic_ids'"),
        (carried_history(history_semantic_ids=np.ones((1, 3, 5), np.int32)),
         "input 'history_semantic_ids': expected shape [R, L, 6]"),
        (carried_history(history_timezone=np.array([[3, 3]], np.int32)), "the same length"),
        (carried_history(history_impression_time=np.full((1, 3), 2**31, np.int64)),
         "input 'history_impression_time'"),
        (carried_history(installed_apps=np.full((1, 64), 2, np.int8)), "input 'installed_apps'"),
        (carried_history(latitude=np.array([[91.0]], np.float32)), "input 'latitude'"),
        (by_id(request_timezone=np.array([[40]], np.int32)), "input 'request_timezone'"),
        (by_id(request_hour_of_day=np.array([[-1]], np.int32)), "input 'request_hour_of_day'"),
    ],
)  # fmt: skip
def test_bad_production_inputs_are_refused_naming_them(tiny_artifacts, arrays, fragment):
    svc = service(tiny_artifacts, "redis://127.0.0.1:1/0")  # never read: refused before
    (result,) = svc.handle([arrays])
    assert isinstance(result, InputError), result
    assert fragment in str(result)


def test_the_original_family_refuses_the_production_inputs(tiny_artifacts):
    svc = service(tiny_artifacts, "redis://127.0.0.1:1/0", production=False)
    for arrays in (carried_history(country=np.array([[3]], np.int32)),
                   by_id(request_timezone=np.array([[3]], np.int32))):  # fmt: skip
        (result,) = svc.handle([arrays])
        assert isinstance(result, InputError)
        assert "production family only" in str(result)


def test_a_corpus_store_of_another_semantic_id_width_fails_its_look_ups_naming_it(tmp_path):
    store = CorpusStore.create(tmp_path / "wide", EMB, semantic_ids=SemanticIdSpec(levels=4))
    store.add(Posts(POSTS, np.full(4, 5), np.full(4, 1), np.eye(EMB, dtype=np.float32),
                    np.ones((4, 4), np.int32)))  # fmt: skip
    followed = FollowedStore(StoreFollower(tmp_path / "wide", EMB, searchable=False).start())
    try:
        with pytest.raises(ValueError, match="semantic IDs are 4 levels.*reads 6 levels"):
            semantic_id_lookup(followed)(POSTS)
    finally:
        followed.close()


def test_stored_action_flags_go_to_the_production_artifacts_slots_by_name(
    tiny_artifacts, redis_server
):
    """The store keeps the feed's 19 actions; artifacts of 64 action slots get each flag in the
    slot of its name (dwell_time has none), in both histories."""
    slots = dataclasses.replace(
        load_config(tiny_artifacts), action_names=ACTION_SLOTS, num_actions=len(ACTION_SLOTS)
    )
    UserStateStore(connect(redis_server.url)).apply(
        [
            Engagement.of(USER, 11, 5, NOW - 60, ["favorite", "repost", "dwell_time"]),
            Engagement.of(USER, 12, 5, NOW - 30, ["mute_author"]),
        ]  # fmt: skip
    )
    (out,) = service(tiny_artifacts, redis_server.url, config=slots).handle([by_id()])
    ranking = out["history_actions"][0]
    assert ranking.shape == (2, 64)
    named = [[ACTION_SLOTS[i] for i in np.flatnonzero(row)] for row in ranking]
    assert named == [["favorite", "repost"], ["mute_author"]]
    retrieval = out["retrieval_history_actions"][0]  # positive engagements only
    assert [ACTION_SLOTS[i] for i in np.flatnonzero(retrieval[0])] == ["favorite", "repost"]
    assert retrieval.shape == (1, 64)


def test_the_served_log_records_the_slots_as_the_stores_actions(tiny_artifacts):
    """What the request log keeps of a production history: the store's action bits, so that
    training reads one action vocabulary whatever the family (dwell_time has no slot)."""
    slots = dataclasses.replace(
        load_config(tiny_artifacts), action_names=ACTION_SLOTS, num_actions=len(ACTION_SLOTS)
    )
    columns = action_columns(slots)
    flags = np.eye(19, dtype=np.float32)  # one feed action per row
    placed = placed_actions(flags, columns, 64)
    assert placed.shape == (19, 64) and placed.sum() == 18  # dwell_time: no slot
    back = feed_actions(placed, columns)
    dwell_time = ACTION_NAMES.index("dwell_time")
    expected = flags.copy()
    expected[dwell_time] = 0
    np.testing.assert_array_equal(back, expected)
    assert action_columns(load_config(tiny_artifacts)) is None  # the original: as stored


def test_the_load_tests_checks_take_the_production_outputs_as_optional():
    """The original family's retriever and user_state answer none of the production outputs:
    the load test's shape check must not count them missing; a missing output it must."""
    from loadtest.checks import shape_problem

    original = {s.name: np.zeros((1, 0)) for s in RETRIEVER.outputs if not s.optional}
    assert shape_problem("retriever", original, {}) is None
    del original["post_age_seconds"]
    assert shape_problem("retriever", original, {}) == "output post_age_seconds missing"
    state = {s.name: np.zeros((1, 0)) for s in USER_STATE.outputs if not s.optional}
    assert shape_problem("user_state", state, {}) is None
    assert {s.name for s in RETRIEVER.outputs if s.optional} == {
        "semantic_ids", "timezone", "hour_of_day"
    }  # fmt: skip
