"""Synthetic logs, training and offline evaluation (the tiny preset, fixed seeds).

Training a preset end to end is slower-tier: tests/slow/test_training_pipeline.py.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import optax
import pytest

from phoenix.config import ACTION_NAMES
from phoenix.training.data import LogIndex
from phoenix.training.evaluate import auc, ndcg_at_k
from phoenix.training.presets import PRESETS
from phoenix.training.train import TrainSettings, make_optimizer
from phoenix.world import logs as log_files
from phoenix.world import synthetic

SMALL = dataclasses.replace(PRESETS["tiny"].world, num_users=400, num_posts=1_500)


# -- the log generator -------------------------------------------------------------------


def test_logs_are_deterministic_and_follow_the_schema(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        world, impressions = synthetic.generate_logs(SMALL, seed=3)
        log_files.save_logs(out, world, impressions, seed=3)
    for name in log_files.FILES:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    other, _ = synthetic.generate_logs(SMALL, seed=4)
    assert not np.array_equal(other.post_ids, world.post_ids)

    arrays = np.load(first / "impressions.npz", allow_pickle=False)
    for name, column in log_files.IMPRESSION_COLUMNS.items():
        assert arrays[name].dtype == np.dtype(column.dtype), name
        assert arrays[name].ndim == column.ndim, name
    assert arrays["actions"].shape[1] == len(ACTION_NAMES)
    assert set(np.unique(arrays["actions"])) <= {0, 1}
    meta = json.loads((first / "meta.json").read_text())
    assert meta["action_names"] == list(ACTION_NAMES) and meta["schema"] == 2
    assert meta["num_impressions"] == len(arrays["user_id"])

    loaded, imp, _ = log_files.load_logs(first)
    for table, read in ((world, loaded), (impressions, imp)):  # the reader inverts the writer
        for field in dataclasses.fields(table):
            written, back = getattr(table, field.name), getattr(read, field.name)
            if field.name == "profiles":
                written, back = written.arrays(), back.arrays()
                assert written.keys() == back.keys()
                pairs = [(written[k], back[k]) for k in written]
            else:
                pairs = [(written, back)]
            for w, b in pairs:
                assert np.array_equal(w, b), field.name
                assert np.asarray(w).dtype == np.asarray(b).dtype, field.name
    # every post shown was already created, within the age limit
    age = imp.ts - loaded.post_created_ts[imp.post]
    assert age.min() >= 0 and age.max() <= SMALL.max_post_age_days * synthetic.DAY
    np.testing.assert_array_equal(loaded.interest, world.interest)
    np.testing.assert_array_equal(loaded.follows, world.follows)


def test_logs_carry_the_planted_structure():
    world, imp = synthetic.generate_logs(SMALL, seed=1)
    favorite = imp.actions[:, ACTION_NAMES.index("favorite")].astype(bool)
    liked = world.interest[imp.user, world.post_topic[imp.post]] > 0
    disliked = world.dislike[imp.user, world.post_topic[imp.post]] > 0
    assert favorite[liked].mean() > 3 * favorite[~liked].mean()
    negative = synthetic.negative_mask(imp.actions)
    assert negative[disliked].mean() > 3 * negative[~disliked].mean()
    photo = imp.actions[:, ACTION_NAMES.index("photo_expand")].astype(bool)
    assert not photo[world.post_media[imp.post] != 1].any()
    dwell = imp.actions[:, ACTION_NAMES.index("dwell")].astype(bool)
    assert np.array_equal(dwell, imp.dwell_seconds >= synthetic.DWELL_THRESHOLD_S)


def test_histories_use_the_served_layout():
    world, imp = synthetic.generate_logs(SMALL, seed=2)
    config = PRESETS["tiny"].config(0)
    index = LogIndex(world, imp, config)
    user = int(imp.user[len(imp) // 2])
    rows = np.flatnonzero((imp.user == user) & imp.actions.any(1))
    t = int(imp.ts[rows[-1]])
    hist = index.history(np.array([user]), np.array([t]))[0]
    expected = rows[imp.ts[rows] < t][-config.history_seq_len :]  # newest S, oldest first
    assert hist[: len(expected)].tolist() == expected.tolist()
    assert (hist[len(expected) :] == -1).all()  # right-padded


def test_a_request_is_one_session_even_when_two_share_a_second():
    world, imp = synthetic.generate_logs(SMALL, seed=2)
    # give a user's second request the time of the first: (user, time) no longer tells them apart
    first = int(np.flatnonzero(imp.request[1:] != imp.request[:-1])[0]) + 1  # a request's 1st row
    user, ts = imp.user[first], imp.ts[first]
    nxt = first + int(np.argmax(imp.request[first:] != imp.request[first]))
    assert imp.user[nxt] == user, "pick a user with two requests"
    rows = imp.request == imp.request[nxt]
    collided = dataclasses.replace(imp, ts=np.where(rows, ts, imp.ts))
    assert log_files.in_training_order(collided) is collided  # a valid log, already in order
    index = LogIndex(world, collided, PRESETS["tiny"].config(0))
    assert len(index.session_start) == len(np.unique(imp.request))
    starts = set(index.session_start.tolist())
    assert first in starts and nxt in starts


def test_logs_in_any_row_order_are_read_in_training_order():
    _, imp = synthetic.generate_logs(SMALL, seed=2)
    assert log_files.in_training_order(imp) is imp  # the generator writes that order
    shuffle = np.random.default_rng(0).permutation(len(imp))
    shuffled = synthetic.Impressions(
        **{f.name: getattr(imp, f.name)[shuffle] for f in dataclasses.fields(imp)}
    )
    ordered = log_files.in_training_order(shuffled)
    for name in ("user", "ts", "request"):  # the same runs; a request's rows in file order
        assert np.array_equal(getattr(ordered, name), getattr(imp, name)), name
    same_rows = [np.lexsort((x.dwell_seconds, x.post, x.request)) for x in (ordered, imp)]
    for field in dataclasses.fields(imp):
        mine, theirs = getattr(ordered, field.name), getattr(imp, field.name)
        assert np.array_equal(mine[same_rows[0]], theirs[same_rows[1]]), field.name
    # two requests of one user at one time, their rows interleaved: each becomes one run
    first4 = {f.name: getattr(imp, f.name)[:4] for f in dataclasses.fields(imp)}
    first4.update(user=np.zeros(4, np.int32), ts=np.full(4, 5), request=np.array([1, 2, 1, 2]))
    ordered = log_files.in_training_order(synthetic.Impressions(**first4))
    assert ordered.request.tolist() == [1, 1, 2, 2]


def test_a_request_of_two_users_or_times_is_refused_with_its_id():
    _, imp = synthetic.generate_logs(SMALL, seed=2)
    request = imp.request.copy()
    request[imp.user != imp.user[0]] = 77  # every other user's rows in one request
    with pytest.raises(log_files.LogError, match="request_id 77 has rows of more than one"):
        log_files.in_training_order(dataclasses.replace(imp, request=request))
    one_user = imp.user == imp.user[0]
    request = np.where(one_user, 5, imp.request)  # one user's requests of different times
    assert len(np.unique(imp.ts[one_user])) > 1
    with pytest.raises(log_files.LogError, match="request_id 5 has rows"):
        log_files.in_training_order(dataclasses.replace(imp, request=request))


def test_metrics():
    assert auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    scores = np.array([[3.0, 2.0, 1.0]])
    gains = np.array([[0.0, 1.0, 2.0]])
    mask = np.ones_like(scores, bool)
    assert ndcg_at_k(-scores, gains, mask) == pytest.approx(1.0)
    assert ndcg_at_k(scores, gains, mask) < 0.7


# -- training --------------------------------------------------------------------------


def test_a_phase_moves_only_its_own_groups():
    """AdamW's decay would shrink weights without a gradient; a phase keeps them exact."""
    params = {g: {"w": np.full(4, 0.5, np.float32)} for g in ("ranker", "retrieval", "tables")}
    grads = {g: {"w": np.zeros(4, np.float32)} for g in params}
    grads["retrieval"]["w"][:] = 1.0
    for towers, frozen, moved in (
        (("retrieval",), (), {"retrieval", "tables"}),
        (("ranker",), ("tables",), {"ranker"}),
    ):
        settings = TrainSettings(steps=10, warmup_steps=1, weight_decay=0.1, towers=towers)
        settings = dataclasses.replace(settings, frozen=frozen)
        assert set(settings.trained_groups()) == moved
        optimizer = make_optimizer(settings)
        state, current = optimizer.init(params), params
        for _ in range(3):
            updates, state = optimizer.update(grads, state, current)
            current = optax.apply_updates(current, updates)
        for group in params:
            same = np.array_equal(current[group]["w"], params[group]["w"])
            assert same == (group not in moved), (towers, group, current[group]["w"])


def test_logs_of_another_seed_in_a_named_directory_are_never_written_over(tmp_path):
    from phoenix.training.pipeline import ensure_logs

    preset = dataclasses.replace(PRESETS["tiny"], world=SMALL)
    world, impressions = synthetic.generate_logs(SMALL, seed=1)
    log_files.save_logs(tmp_path, world, impressions, seed=1)
    before = {name: (tmp_path / name).read_bytes() for name in log_files.FILES}
    with pytest.raises(log_files.LogError, match="another preset or seed"):
        ensure_logs(preset, 2, tmp_path, log=lambda *_: None)
    assert {name: (tmp_path / name).read_bytes() for name in log_files.FILES} == before
    # the same seed is read back; the default directory may be regenerated for another
    read, _ = ensure_logs(preset, 1, tmp_path, log=lambda *_: None)
    assert np.array_equal(read.post_ids, world.post_ids)
    other, _ = ensure_logs(preset, 2, tmp_path, log=lambda *_: None, replace_others=True)
    assert json.loads((tmp_path / "meta.json").read_text())["seed"] == 2
    assert not np.array_equal(other.post_ids, world.post_ids)


def test_only_accelerator_presets_warn_on_a_cpu():
    assert "sized for a GPU" in PRESETS["mini"].cpu_warning("cpu")
    assert PRESETS["mini"].cpu_warning("gpu") is None
    assert PRESETS["demo"].cpu_warning("cpu") is None and PRESETS["tiny"].cpu_warning("cpu") is None


def test_the_cli_names_a_log_directory_it_will_not_use(tmp_path, capsys):
    from phoenix.training.cli import main

    world, impressions = synthetic.generate_logs(SMALL, seed=1)
    log_files.save_logs(tmp_path / "logs", world, impressions, seed=1)
    args = ["pipeline", "--preset", "tiny", "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*args, "--logs", str(tmp_path / "logs")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "holds logs of another preset or seed" in error
    assert not (tmp_path / "out").exists()
