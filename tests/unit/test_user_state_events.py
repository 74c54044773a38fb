"""User-state events, the action split, the limits and the key layout, without Redis."""

import json
import logging

import numpy as np
import pytest

from phoenix.config import ACTION_NAMES, NEGATIVE_ACTIONS
from phoenix.schema.contracts import LIMITS, RANKER, USER_ENCODER
from phoenix.user_state import keys
from phoenix.user_state.actions import (
    POSITIVE_ACTIONS,
    action_bits,
    action_flags,
    action_mask,
    is_positive,
)
from phoenix.user_state.events import (
    Engagement,
    EventError,
    EventLimits,
    Follow,
    ParseCounts,
    Post,
    Unfollow,
    parse_event,
    parse_lines,
    to_json,
)
from phoenix.user_state.history import HISTORY_INPUTS, History, decode, encode
from phoenix.user_state.limits import UserStateLimits
from phoenix.user_state.server import RedisServerMissing, redis_binary

ENGAGEMENT = Engagement.of(7, 91, 3, 1_700_000_000.5, ["favorite", "dwell"], surface=2,
                           dwell_seconds=12.5)  # fmt: skip
SERVED = EventLimits(max_surface=15, max_dwell_seconds=float(np.finfo(np.float32).max))


def test_every_action_is_either_positive_or_negative_and_negative_wins():
    assert set(POSITIVE_ACTIONS) | set(NEGATIVE_ACTIONS) == set(ACTION_NAMES)
    assert not set(POSITIVE_ACTIONS) & set(NEGATIVE_ACTIONS)
    assert is_positive(action_mask(["favorite"]))
    assert is_positive(action_mask(["dwell_time"]))
    assert not is_positive(action_mask(["report"]))
    assert not is_positive(action_mask(["favorite", "mute_author"]))


def test_action_flags_follow_the_column_order():
    flags = action_flags(np.array([action_mask(["favorite", "dwell_time"])]))
    assert flags.shape == (1, len(ACTION_NAMES)) and flags.dtype == np.float32
    assert list(np.flatnonzero(flags[0])) == [0, ACTION_NAMES.index("dwell_time")]


def test_action_bits_invert_action_flags_for_every_action_and_any_flag_dtype():
    masks = np.array([0, 1, action_mask(["reply", "dwell_time"]), (1 << len(ACTION_NAMES)) - 1])
    flags = action_flags(masks)  # [4, A] float32
    assert action_bits(flags).tolist() == masks.tolist()
    assert action_bits(flags.astype(bool)).dtype == np.uint32
    assert action_bits(flags.astype(np.int8)).tolist() == masks.tolist()
    assert action_bits(flags[None]).shape == (1, 4)  # any leading axes


@pytest.mark.parametrize(
    "event", [ENGAGEMENT, Follow(7, 3, 5.0), Unfollow(7, 3, 6.0), Post(92, 3, 7.0)]
)
def test_json_lines_round_trip(event):
    assert parse_event(to_json(event), SERVED) == event


def test_actions_may_be_the_19_flags():
    flags = [0] * len(ACTION_NAMES)
    flags[0] = flags[ACTION_NAMES.index("dwell")] = 1
    line = json.loads(to_json(ENGAGEMENT)) | {"actions": flags}
    assert parse_event(json.dumps(line), SERVED) == ENGAGEMENT


def engagement_line(**fields) -> dict:
    """A valid engagement event's JSON object with ``fields`` changed or added."""
    line = {"type": "engagement", "user_id": 1, "post_id": 1, "author_id": 1, "ts": 1}
    return line | {"actions": ["click"]} | fields


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"type": "like"}, "type must be one of"),
        ({"type": "follow", "user_id": 1, "ts": 1}, "missing ['author_id']"),
        ({"type": "follow", "user_id": 1, "author_id": 2, "ts": 1, "x": 1}, "unknown ['x']"),
        (
            {"type": "post", "post_id": 0, "author_id": 2, "ts": 1},
            "post_id must be an integer in [1",
        ),
        ({"type": "post", "post_id": 1, "author_id": 2, "ts": -1}, "ts must be finite and >= 0"),
        (engagement_line(actions=[]), "at least one action"),
        (engagement_line(actions=["like"]), "unknown action 'like'"),
        (engagement_line(actions=[1, 0]), "exactly 19 integer flags"),
        (engagement_line(dwell_seconds="long"), "dwell_seconds must be a number"),
        # a surface is named against the served artifacts' surfaces, whatever is wrong with it
        (engagement_line(surface=-1), "surface must lie in [0, 15] (the product surfaces of "),
        (engagement_line(surface=16), "surface must lie in [0, 15] (the product surfaces of "),
        (engagement_line(surface=1.0), "surface must lie in [0, 15] (the product surfaces of "),
        (engagement_line(surface=True), "surface must lie in [0, 15] (the product surfaces of "),
    ],
)
def test_a_bad_event_says_what_is_wrong(obj, message):
    with pytest.raises(EventError) as error:
        parse_event(json.dumps(obj), SERVED)
    assert message in str(error.value)


def test_bad_lines_are_refused_with_a_warning_naming_the_line_and_counted(caplog):
    lines = [to_json(ENGAGEMENT), "{not json", "", to_json(Post(92, 3, 7.0)), '{"type": "x"}']
    counts = ParseCounts()
    with caplog.at_level(logging.WARNING):
        events = list(parse_lines(lines, "events.jsonl", SERVED, counts))
    assert events == [ENGAGEMENT, Post(92, 3, 7.0)]
    assert (counts.lines, counts.events, counts.skipped) == (4, 2, 2)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings[0] == (
        "events.jsonl:2: not JSON: Expecting property name enclosed in double quotes at column 2; "
        "line refused"
    )
    assert warnings[1].startswith("events.jsonl:5: type must be one of")
    assert all(w.endswith("; line refused") for w in warnings), warnings


def test_a_history_member_packs_the_whole_engagement_in_36_bytes():
    member = encode(ENGAGEMENT)
    assert len(member) == 36 and encode(ENGAGEMENT) == member
    record = decode([member])[0]
    assert (record["post_id"], record["author_id"], record["surface"]) == (91, 3, 2)
    assert record["ts_ms"] == 1_700_000_000_500 and record["dwell_seconds"] == 12.5


def test_history_arrays_are_the_contract_inputs():
    history = History.from_records(decode([encode(ENGAGEMENT)] * 3))
    for name, array in history.inputs().items():
        for contract in (RANKER, USER_ENCODER):
            if name in {s.name for s in contract.inputs}:
                spec = contract.input(name)
                assert array.dtype == spec.dtype and array.ndim == len(spec.axes), name
    assert set(history.inputs()) == set(HISTORY_INPUTS)
    assert history.actions.shape == (3, len(ACTION_NAMES))


def test_limits_refuse_nonsense_and_longer_sequences_than_kept():
    with pytest.raises(ValueError, match="history_cap must be > 0"):
        UserStateLimits(history_cap=0)
    with pytest.raises(ValueError, match="max_history_items"):
        UserStateLimits(history_cap=LIMITS.max_history_items + 1)
    with pytest.raises(ValueError, match="history length 300 must lie in"):
        UserStateLimits(history_cap=256).check_seq_len(300)
    assert UserStateLimits().served_cap == LIMITS.max_filter_ids


def test_one_users_keys_share_a_hash_tag():
    tags = {key.split("{")[1].split("}")[0] for key in
            (keys.user_key(42, kind) for kind in keys.USER_KEY_KINDS)}  # fmt: skip
    assert tags == {"42"}
    assert keys.author_posts_key(9) == "a:{9}:posts"
    with pytest.raises(ValueError, match="unknown user key kind"):
        keys.user_key(1, "likes")


def test_a_missing_redis_server_says_to_run_make_setup(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RedisServerMissing, match="make setup"):
        redis_binary("redis-server")


def test_id_members_parse_to_int64_in_order_and_refuse_what_is_not_an_id():
    from phoenix.user_state.store import _ids

    members = [b"9223372036854775807", b"1", b"42", b"123456789012345678"]
    assert _ids(members).tolist() == [int(m) for m in members]
    assert _ids(members).dtype == np.int64
    assert _ids([]).shape == (0,)
    for bad in ([b"1", b"x"], [b"1 2"], [b"1.5"]):
        with pytest.raises(ValueError, match="not a decimal id"):
            _ids(bad)


def test_served_records_read_back_newest_first_within_the_ttl_whatever_the_write_order():
    from phoenix.user_state.served import RECORD, pack, served_since

    data = pack([1, 2], 1000.0) + pack([3], 900.0) + pack([4], 1100.0) + pack([5], 1300.0)
    assert served_since(data, 1200.0, 350.0, 10).tolist() == [4, 2, 1, 3]  # 5 is after 1200
    assert served_since(data, 1200.0, 150.0, 10).tolist() == [4]  # from 1050 on
    assert served_since(data, 1200.0, 350.0, 2).tolist() == [4, 2]  # the newest cap
    assert served_since(None, 1200.0, 150.0, 10).shape == (0,)
    with pytest.raises(ValueError, match=f"not {RECORD.itemsize}-byte records"):
        served_since(data[:-1], 1200.0, 150.0, 10)


def test_served_records_in_time_order_read_as_any_order_would():
    # Records written in time order take a binary-search path; the oracle sorts every record.
    from phoenix.user_state.served import pack, served_since

    def oracle(times, posts, now, ttl, cap):
        kept = [(t, i, p) for i, (t, p) in enumerate(zip(times, posts)) if now - ttl <= t <= now]
        return [p for _, _, p in sorted(kept, reverse=True)][:cap]  # equal times: later first

    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(0, 40))
        times = np.sort(rng.integers(990, 1010, n)).astype(float)  # repeats: equal times
        if trial % 2:
            times = rng.permutation(times)  # the general path
        posts = rng.integers(1, 10**12, n)
        data = b"".join(pack([p], t) for p, t in zip(posts, times))
        now, ttl, cap = (
            float(rng.integers(995, 1012)),
            float(rng.integers(0, 12)),
            int(rng.integers(1, 45)),
        )
        expected = oracle(times.tolist(), posts.tolist(), now, ttl, cap)
        assert served_since(data, now, ttl, cap).tolist() == expected, (trial, now, ttl, cap)
