"""Simulated users of the synthetic world react with the log generator's own model."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.artifact_parts import stream
from phoenix.user_state.actions import action_flags
from phoenix.world import reactions, synthetic
from phoenix.world.simulate import (
    HOME_FOR_YOU,
    SimulatedUser,
    WorldClock,
    draw_user_ids,
    index_of,
)

SPEC = synthetic.WorldSpec(num_users=300, num_authors=40, num_posts=2000, num_days=4)
SEED = 7
NOW = 1_800_000_000.0  # a wall-clock time, far from the world's


@pytest.fixture(scope="module")
def logs():
    return synthetic.generate_logs(SPEC, SEED)


def at_impression(world, imp, row: int, seed: int = 0) -> SimulatedUser:
    """The simulated user of impression ``row``, its world clock at the impression's time."""
    clock = WorldClock(start_wall_ts=NOW, start_world_ts=float(imp.ts[row]))
    return SimulatedUser(world, int(world.user_ids[imp.user[row]]), seed, clock)


def test_simulated_probabilities_equal_the_generators_for_the_same_user_and_post(logs):
    """The online metric measures the world the models learnt."""
    world, imp = logs
    generated = reactions.sample_reactions(
        world, imp.user, imp.post, imp.ts, imp.surface, stream(SEED, "actions")
    )
    assert np.array_equal(generated.actions, imp.actions)  # these are the generator's draws
    home = np.flatnonzero(imp.surface == HOME_FOR_YOU)  # where simulated users look
    rows = stream(0, "rows").choice(home, 200, replace=False)
    for row in rows:
        seen = at_impression(world, imp, row).react([int(world.post_ids[imp.post[row]])], now=NOW)
        assert seen.impressions == 1
        np.testing.assert_array_equal(seen.reactions.probs[0], generated.probs[row])


def test_simulated_actions_fire_at_the_model_probabilities(logs):
    world, imp = logs
    user = at_impression(world, imp, 0, seed=3)
    feed = world.post_ids[np.unique(imp.post[imp.user == imp.user[0]])][:20]
    draws = 2000
    views = [user.react(feed, top_n=len(feed), now=NOW).reactions for _ in range(draws)]
    probs = views[0].probs
    rates = np.mean([v.actions for v in views], axis=0)
    sigma = np.sqrt(probs * (1 - probs) / draws)
    assert np.all(np.abs(rates - probs) <= 5 * sigma + 1e-3)


def test_reactions_are_reproducible_for_a_seed(logs):
    world, imp = logs
    feed = world.post_ids[imp.post[:30]]
    first, second, other = (
        at_impression(world, imp, 0, seed).react(feed, top_n=30, now=NOW) for seed in (1, 1, 2)
    )
    assert first.events == second.events
    assert np.array_equal(first.reactions.dwell_seconds, second.reactions.dwell_seconds)
    assert not np.array_equal(first.reactions.dwell_seconds, other.reactions.dwell_seconds)


def test_events_are_the_views_with_actions(logs):
    world, imp = logs
    feed = world.post_ids[imp.post[:40]]
    seen = at_impression(world, imp, 0).react(feed, top_n=40, now=NOW)
    acted = seen.reactions.actions.any(axis=1)
    assert len(seen.events) == int(acted.sum()) > 0
    flags = action_flags(np.array([e.actions for e in seen.events], np.int64))
    np.testing.assert_array_equal(flags, seen.reactions.actions[acted])
    for event, post, dwell in zip(
        seen.events, seen.post_ids[acted], seen.reactions.dwell_seconds[acted]
    ):
        (index,) = index_of(world.post_ids, np.array([post]))
        assert event.post_id == post and event.ts == NOW and event.surface == HOME_FOR_YOU
        assert event.author_id == world.author_ids[world.post_author[index]]
        assert event.dwell_seconds == pytest.approx(float(dwell))
        assert event.user_id == world.user_ids[imp.user[0]]


def test_the_top_n_is_viewed_and_unknown_posts_are_skipped_and_counted(logs):
    world, imp = logs
    unknown = int(world.post_ids.max()) + 1
    feed = [int(world.post_ids[3]), unknown, int(world.post_ids[9]), unknown, 5_000_000_000]
    flags = [True, False, False, True, True]
    seen = at_impression(world, imp, 0).react(feed, in_network=flags, top_n=4, now=NOW)
    assert seen.unknown_posts == 2 and seen.impressions == 2
    assert seen.post_ids.tolist() == [feed[0], feed[2]]
    assert seen.in_network.tolist() == [True, False]
    empty = at_impression(world, imp, 0).react([unknown], now=NOW)
    assert empty.impressions == 0 and empty.events == [] and empty.unknown_posts == 1


def test_simulated_users_are_drawn_reproducibly_and_must_be_the_worlds(logs):
    world, _ = logs
    first, again = draw_user_ids(world, 50, seed=4), draw_user_ids(world, 50, seed=4)
    assert np.array_equal(first, again) and len(np.unique(first)) == 50
    assert np.isin(first, world.user_ids).all()
    assert not np.array_equal(first, draw_user_ids(world, 50, seed=5))
    assert len(draw_user_ids(world, 10_000, seed=4)) == SPEC.num_users
    with pytest.raises(ValueError, match="not one of the world's users"):
        SimulatedUser(world, int(world.user_ids.max()) + 1, 0, WorldClock(NOW, NOW))


def test_the_world_clock_starts_where_the_logs_end(logs):
    world, _ = logs
    clock = WorldClock.after_logs(world, start_wall_ts=NOW)
    assert clock.world_ts(NOW) == SPEC.end_ts
    assert clock.world_ts(NOW + 90) == SPEC.end_ts + 90
