"""The world's engagement model (phoenix.world.reactions) is the one the log generator uses:
its logs did not change when the model moved there, and it reproduces the generator's draws."""

from __future__ import annotations

import hashlib

import numpy as np

from phoenix.artifact_parts import stream
from phoenix.world import reactions, synthetic

SPEC = synthetic.WorldSpec(num_users=300, num_authors=40, num_posts=2000, num_days=4)
SEED = 7
# Recorded from the generator before the engagement model moved to reactions.py (same spec and
# seed, this machine's numpy): the logs of a seed must not change with the refactor.
LOGS_DIGEST = "02db744bebbfd4029911781f2941da42bc8d11dd0f37d3ffd3bed54534ad57e7"
LOGS_LENGTH = 5684
PROBS_DIGEST = "e9f68a077bb9003eed5d704fa5ad626d7f8d91b71683c4953ba81daf0079c74c"
IMPRESSION_FIELDS = ("user", "post", "ts", "request", "surface", "dwell_seconds", "actions")


def impressions_digest(impressions: synthetic.Impressions) -> str:
    digest = hashlib.sha256()
    for name in IMPRESSION_FIELDS:
        array = np.ascontiguousarray(getattr(impressions, name))
        digest.update(name.encode())
        digest.update(str(array.dtype).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def test_generated_logs_are_those_of_before_the_refactor():
    world, impressions = synthetic.generate_logs(SPEC, SEED)
    assert len(impressions) == LOGS_LENGTH
    assert impressions_digest(impressions) == LOGS_DIGEST
    probs = reactions.action_probabilities(
        world, impressions.user, impressions.post, impressions.ts, impressions.surface
    )
    assert hashlib.sha256(probs.tobytes()).hexdigest() == PROBS_DIGEST


def test_sample_reactions_draws_what_the_generator_drew():
    world, imp = synthetic.generate_logs(SPEC, SEED)
    drawn = reactions.sample_reactions(
        world, imp.user, imp.post, imp.ts, imp.surface, stream(SEED, "actions")
    )
    np.testing.assert_array_equal(drawn.actions, imp.actions)
    np.testing.assert_array_equal(drawn.dwell_seconds, imp.dwell_seconds)


def test_dwell_columns_follow_dwell_seconds_and_masked_actions_never_fire():
    world, imp = synthetic.generate_logs(SPEC, SEED)
    drawn = reactions.sample_reactions(
        world, imp.user, imp.post, imp.ts, imp.surface, np.random.default_rng(1)
    )
    dwell = drawn.actions[:, reactions.ACTION_INDEX["dwell"]].astype(bool)
    assert np.array_equal(dwell, drawn.dwell_seconds >= reactions.DWELL_THRESHOLD_S)
    media = world.post_media[imp.post]
    assert not drawn.actions[media != 1, reactions.ACTION_INDEX["photo_expand"]].any()
    assert not drawn.actions[media != 2, reactions.ACTION_INDEX["vqv"]].any()
    followed = reactions.follows_author(world, imp.user, imp.post)
    assert not drawn.actions[followed, reactions.ACTION_INDEX["follow_author"]].any()


def test_older_posts_are_less_liked():
    world = synthetic.make_world(SPEC, SEED)
    users, posts = np.zeros(2, np.int64), np.array([5, 5])
    created = world.post_created_ts[5]
    fresh, stale = reactions.affinity(
        world, users, posts, np.array([created, created + 3 * 86_400])
    )
    assert np.isclose(fresh - stale, 3 * reactions.W_AGE_PER_DAY, atol=1e-5)
