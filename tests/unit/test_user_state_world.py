"""The trained world's users as user-state events (phoenix/world/users.py), loaded into a
real redis-server."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phoenix.user_state import Engagement, Follow, UserStateStore, connect
from phoenix.user_state.events import Profile
from phoenix.user_state.profile import profile_arrays
from phoenix.user_state.server import RedisServer
from phoenix.world import synthetic
from phoenix.world.users import WorldUsers, load_users

pytestmark = pytest.mark.timeout(60)

NOW = 1_800_000_000.0
SPEC = {"num_users": 40, "num_authors": 12, "num_posts": 300, "num_days": 4}


@pytest.fixture(scope="module")
def world_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("trained")
    (path / "training.json").write_text(json.dumps({"seed": 3, "world": SPEC}))
    return path


def test_each_user_has_the_engagements_before_the_held_out_days_shifted_to_now(world_dir):
    users = WorldUsers.from_artifacts(world_dir, now=NOW)
    spec = synthetic.WorldSpec(**SPEC)
    world, imp = synthetic.generate_logs(spec, 3)
    index = int(users.most_active(1)[0])
    rows = np.flatnonzero((imp.user == index) & imp.actions.any(axis=1) & (imp.ts < spec.split_ts))
    assert len(rows) > 0
    events = users.user_events(index)
    engagements = [e for e in events if isinstance(e, Engagement)]
    assert [e.post_id for e in engagements] == world.post_ids[imp.post[rows]].tolist()
    assert [e.ts for e in engagements] == (imp.ts[rows] + NOW - spec.split_ts).tolist()
    assert max(e.ts for e in engagements) < NOW
    flags = [[(e.actions >> i) & 1 for i in range(19)] for e in engagements]
    assert flags == imp.actions[rows].tolist()
    assert [e.surface for e in engagements] == imp.surface[rows].tolist()
    assert [e.dwell_seconds for e in engagements] == imp.dwell_seconds[rows].tolist()
    # what the production ranker reads: the logs' timezone and hour, the post's creation time
    assert [e.timezone for e in engagements] == imp.timezone(world)[rows].tolist()
    assert [e.hour_of_day for e in engagements] == imp.hour_of_day(world)[rows].tolist()
    created = world.post_created_ts[imp.post[rows]] + NOW - spec.split_ts
    assert [e.post_created_at for e in engagements] == created.tolist()
    (profile,) = [e for e in events if isinstance(e, Profile)]
    for name, array in profile_arrays([profile]).items():
        assert np.array_equal(array[0], getattr(world.profiles, name)[index]), name
    follows = {e.author_id for e in events if isinstance(e, Follow)}
    assert follows == set(world.author_ids[world.follows[index]].tolist())
    assert all(e.user_id == world.user_ids[index] for e in events)


def test_keep_bounds_each_users_engagements_to_the_newest(world_dir):
    every = WorldUsers.from_artifacts(world_dir, now=NOW)
    kept = WorldUsers.from_artifacts(world_dir, now=NOW, keep=3)
    index = int(every.most_active(1)[0])
    assert every.engagement_counts()[index] > 3
    assert kept.engagement_counts().max() == 3
    newest = [e for e in every.user_events(index) if isinstance(e, Engagement)][-3:]
    assert [e for e in kept.user_events(index) if isinstance(e, Engagement)] == newest


def test_loaded_users_read_back_their_newest_history(world_dir):
    users = WorldUsers.from_artifacts(world_dir, now=NOW)
    with RedisServer() as server:
        store = UserStateStore(connect(server.url))
        loaded = load_users(store, users, batch_users=7)
        assert loaded.users == 40
        assert loaded.applied.engagements == len(users.user)
        assert loaded.applied.posts > 0
        index = int(users.most_active(1)[0])
        user_id = int(users.user_ids[index])
        [hist] = store.histories([user_id], NOW, 8)
        expected = [e for e in users.user_events(index) if isinstance(e, Engagement)]
        # the newest 8 by time (a session's impressions share one time: ties cut either way)
        assert hist.ranking.times.tolist() == [e.ts for e in expected[-8:]]
        newest = {e.post_id for e in expected if e.ts >= expected[-8].ts}
        assert set(hist.ranking.post_ids.tolist()) <= newest
        assert len(store.follows([user_id])[0]) > 0
        assert loaded.applied.profiles == 40
        assert store.profiles([user_id]) == [users.profile(index)]
        by_time = {(e.post_id, e.ts): e for e in expected}
        stored = [by_time[(p, t)] for p, t in zip(hist.ranking.post_ids, hist.ranking.times)]
        assert hist.ranking.timezone.tolist() == [e.timezone for e in stored]
        assert hist.ranking.hour_of_day.tolist() == [e.hour_of_day for e in stored]
