"""Logs -> trained towers -> artifact directory -> offline evaluation (file I/O lives here).

``run_pipeline`` generates (or reads) synthetic logs, trains both towers in two phases
(``TrainPreset.phases``), writes the published artifact layout with ``phoenix.checkpoint``
(config, weights, tables, a corpus embedded with the trained candidate tower, an example
request), two sidecar files the loaders ignore, and evaluates on the held-out days:

    metadata.npz    post_ids, post_author_ids, post_topics, post_media, author_ids,
                    author_handles, topic_names, media_names: what the demo prints
    training.json   preset, seed, timings, learning curves, the evaluation table and the
                    example user's planted interests
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from phoenix import checkpoint
from phoenix.checkpoint import Corpus, ExampleSequence, read_json, write_json, write_npz
from phoenix.checkpoint.files import TRAINING_FILE
from phoenix.schema.contracts import RANKER_SCORE_WEIGHTS
from phoenix.training.data import LogIndex
from phoenix.training.evaluate import Evaluator, embed_posts
from phoenix.training.presets import PRESETS, TrainPreset
from phoenix.training.train import History, artifact_tables, init_params, train
from phoenix.world import synthetic
from phoenix.world.logs import LogError, load_logs, save_logs

METADATA_FILE = "metadata.npz"
EXAMPLE_TOP_K = 100


def served_score_weights() -> dict[str, float]:
    """The ranker's default ``score_weights``: the blend the server ranks with."""
    return dict(RANKER_SCORE_WEIGHTS)


# ----------------------------------------------------------------------------------------
# Logs
# ----------------------------------------------------------------------------------------


def ensure_logs(
    preset: TrainPreset, seed: int, logs_dir: Path, log=print, replace_others: bool = False
):
    """Read the logs of ``logs_dir`` if they are this preset's and seed's, else generate them.
    Logs of another preset or seed are replaced only with ``replace_others`` (the default
    build/logs directory); a directory the user named is never written over."""
    meta_path = logs_dir / "meta.json"
    if meta_path.is_file():
        meta = read_json(meta_path, "meta.json")
        if meta.get("seed") == seed and meta.get("spec") == dataclasses.asdict(preset.world):
            started = time.perf_counter()
            world, impressions, _ = load_logs(logs_dir)
            log(f"read {len(impressions):,} impressions from {logs_dir} "
                f"({time.perf_counter() - started:.1f} s)")  # fmt: skip
            return world, impressions
        if not replace_others:
            raise LogError(
                f"{logs_dir} holds logs of another preset or seed (seed {meta.get('seed')}); "
                "name another --logs directory, or delete this one to generate it again"
            )
    started = time.perf_counter()
    world, impressions = synthetic.generate_logs(preset.world, seed)
    save_logs(logs_dir, world, impressions, seed)
    log(
        f"generated {len(impressions):,} impressions of {preset.world.num_users:,} users "
        f"into {logs_dir} ({time.perf_counter() - started:.1f} s)"
    )
    return world, impressions


# ----------------------------------------------------------------------------------------
# Artifacts
# ----------------------------------------------------------------------------------------


def build_corpus(index: LogIndex, config, params: dict) -> Corpus:
    """The held-out days' recent posts, embedded with the trained candidate tower."""
    world = index.world
    posts = index.corpus_posts()
    vectors = embed_posts(config, params, world, posts)
    authors = world.author_ids[world.post_author[posts]]
    return Corpus(world.post_ids[posts], vectors, authors, world.post_topic[posts].astype(np.int64))


def pick_example_user(index: LogIndex, eval_set) -> int:
    """Row of ``eval_set`` for the example request: a full history and a planted dislike,
    then the most held-out impressions."""
    world = index.world
    lengths = (eval_set.history >= 0).sum(1)
    disliked = world.dislike[eval_set.users].any(1).astype(int)
    candidates = (eval_set.candidates >= 0).sum(1)
    order = np.lexsort((-candidates, -disliked, -lengths))
    return int(order[0])


def example_sequence(index: LogIndex, eval_set, row: int, config) -> ExampleSequence:
    world, imp = index.world, index.imp
    hist = eval_set.history[row]
    hist = hist[hist >= 0]
    cand = eval_set.candidates[row]
    cand = cand[cand >= 0][: config.candidate_seq_len]
    posts = imp.post[hist]
    return ExampleSequence(
        user_id=int(world.user_ids[eval_set.users[row]]),
        history_post_ids=tuple(world.post_ids[posts].tolist()),
        history_author_ids=tuple(world.author_ids[world.post_author[posts]].tolist()),
        history_actions=tuple(tuple(r) for r in imp.actions[hist].astype(int).tolist()),
        history_product_surface=tuple(imp.surface[hist].astype(int).tolist()),
        history_dwell_seconds=tuple(float(d) for d in imp.dwell_seconds[hist]),
        candidate_post_ids=tuple(world.post_ids[imp.post[cand]].tolist()),
        candidate_author_ids=tuple(world.author_ids[world.post_author[imp.post[cand]]].tolist()),
        candidate_product_surface=tuple(imp.surface[cand].astype(int).tolist()),
        top_k=EXAMPLE_TOP_K,
    )


def metadata_arrays(world) -> dict[str, np.ndarray]:
    return {
        "post_ids": world.post_ids,
        "post_author_ids": world.author_ids[world.post_author],
        "post_topics": world.post_topic.astype(np.int64),
        "post_media": world.post_media.astype(np.int64),
        "author_ids": world.author_ids,
        "author_handles": world.author_handles,
        "topic_names": np.array(world.topic_names),
        "media_names": np.array(synthetic.MEDIA_NAMES),
    }


def user_truth(world, user_index: int) -> dict[str, Any]:
    names = world.topic_names
    interest = world.interest[user_index]
    return {
        "interests": {names[t]: float(interest[t]) for t in np.flatnonzero(interest)},
        "dislikes": [names[t] for t in np.flatnonzero(world.dislike[user_index])],
        "follows": world.author_handles[world.follows[user_index]].tolist(),
    }


# ----------------------------------------------------------------------------------------
# The pipeline
# ----------------------------------------------------------------------------------------


def run_summary(impressions, corpus, eval_set, world, row: int, curves) -> dict[str, Any]:
    """The part of training.json every training run writes, first or warm-started: what it
    trained on, the example user (row ``row`` of the evaluation set), the curves."""
    return {
        "num_impressions": len(impressions),
        "corpus_size": len(corpus),
        "eval_users": len(eval_set),
        "example_user": {"user_id": int(world.user_ids[eval_set.users[row]])}
        | user_truth(world, int(eval_set.users[row])),
        "score_weights": served_score_weights(),
        "curves": curves,
    }


def run_pipeline(
    preset_name: str,
    out_dir: Path,
    seed: int = 0,
    logs_dir: Optional[Path] = None,
    results_path: Optional[Path] = None,
    evaluate: bool = True,
    make_progress: Optional[Callable[[str, int], Callable]] = None,
    log=print,
    preset: Optional[TrainPreset] = None,
) -> dict:
    """Generate/read logs, train, write ``out_dir`` and evaluate; returns training.json's data.

    ``make_progress(description, total_steps)`` returns the per-phase progress callback of
    ``phoenix.training.train.train`` (the CLI passes tqdm bars).
    """
    preset = preset or PRESETS[preset_name]
    warning = preset.cpu_warning(jax.default_backend())
    if warning:
        log(warning)
    started = time.perf_counter()
    out_dir = Path(out_dir)
    default_dir = Path("build/logs") / f"{preset_name}-seed{seed}"
    world, impressions = ensure_logs(
        preset, seed, Path(logs_dir or default_dir), log, replace_others=not logs_dir
    )
    config = preset.config(seed)
    index = LogIndex(world, impressions, config)
    log(
        f"{len(index.train_sessions):,} training requests, {len(index.train_positives):,} "
        f"training positives, corpus of {len(index.corpus_posts()):,} recent posts"
    )
    eval_set = index.eval_set(preset.eval_users, preset.eval_candidates, seed)
    initial = init_params(config, seed)
    params, curves, timings = train_phases(
        index, eval_set, config, initial, preset.phases(seed), preset.eval_every, seed,
        make_progress, log,
    )  # fmt: skip

    # -- artifacts: written beside out_dir, moved into place once complete ---------------
    t0 = time.perf_counter()
    corpus = build_corpus(index, config, params)
    out_dir, row = write_artifact_files(out_dir, config, params, corpus, index, eval_set)
    timings["write_artifacts_s"] = round(time.perf_counter() - t0, 1)

    summary: dict[str, Any] = {
        "preset": preset_name,
        "seed": seed,
        "description": preset.description,
        "world": dataclasses.asdict(preset.world),
        "phases": [dataclasses.asdict(s) for s in preset.phases(seed)],
        **run_summary(impressions, corpus, eval_set, world, row, curves),
    }
    if evaluate:
        t0 = time.perf_counter()
        evaluator = Evaluator(index, eval_set, config, summary["score_weights"])
        summary["evaluation"] = evaluator.evaluate(params, initial, corpus.embeddings)
        timings["evaluate_s"] = round(time.perf_counter() - t0, 1)
    timings["total_s"] = round(time.perf_counter() - started, 1)
    summary["timings"] = timings
    finish_artifact_dir(out_dir, summary, results_path)
    return summary


def train_phases(
    index: LogIndex,
    eval_set,
    config,
    params: dict,
    phases: list,
    eval_every: int,
    seed: int,
    make_progress: Optional[Callable[[str, int], Callable]] = None,
    log=print,
) -> tuple[dict, dict, dict[str, float]]:
    """Train ``params`` phase by phase (``TrainPreset.phases``) on ``index``'s training
    requests; (params, learning curves per tower, seconds per phase)."""
    rng = np.random.default_rng([seed, 7])
    curves: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for settings in phases:
        tower = settings.towers[0]

        def next_batches(step, settings=settings, tower=tower):
            return index.train_batch(tower, settings, rng)

        eval_batches = held_out_batches(index, eval_set, settings, tower)
        progress = make_progress(f"train {tower}", settings.steps) if make_progress else None
        params, history = train(
            config,
            params,
            next_batches,
            settings,
            eval_batches=eval_batches,
            eval_every=eval_every,
            progress=progress,
        )
        if progress is not None and hasattr(progress, "close"):
            progress.close()
        curves[tower] = history.to_dict()
        timings[f"train_{tower}_s"] = round(history.seconds, 1)
        log(_phase_summary(tower, history, settings))
    return params, curves, timings


def write_artifact_files(
    out_dir: Path, config, params: dict, corpus: Corpus, index: LogIndex, eval_set
) -> tuple[Path, int]:
    """Weights, tables, ``corpus``, an example request and metadata.npz, into a partial
    directory beside ``out_dir`` (``finish_artifact_dir`` moves it into place); (the partial
    directory, the eval_set row of the example request)."""
    out_dir = Path(out_dir)
    partial = out_dir.parent / f".{out_dir.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    checkpoint.save_artifacts(
        partial, config, params["ranker"], params["retrieval"], artifact_tables(params)
    )
    checkpoint.save_corpus(partial / checkpoint.CORPUS_FILE, corpus)
    row = pick_example_user(index, eval_set)
    checkpoint.save_example_sequence(partial, example_sequence(index, eval_set, row, config))
    write_npz(partial.resolve() / METADATA_FILE, metadata_arrays(index.world))
    return partial, row


def finish_artifact_dir(
    partial: Path, summary: dict, results_path: Optional[Path] = None, extra_files=None
) -> None:
    """Write training.json (and ``extra_files``: {name: JSON data}) into the partial
    directory, then move it into place (replacing an older directory of that name)."""
    write_json(partial.resolve() / TRAINING_FILE, _jsonable(summary))
    for name, data in (extra_files or {}).items():
        write_json(partial.resolve() / name, _jsonable(data))
    final_dir = partial.parent / partial.name[1 : -len(".partial")]
    shutil.rmtree(final_dir, ignore_errors=True)
    partial.rename(final_dir)
    if results_path is not None:
        results_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(results_path.resolve(), _jsonable(summary))


def held_out_batches(index: LogIndex, eval_set, settings, tower: str) -> dict:
    """A fixed batch of held-out data for the learning curves' held-out loss."""
    rows = np.arange(min(len(eval_set), 256))
    if tower == "ranker":
        cand = eval_set.candidates[rows][:, : settings.num_candidates]
        batch = index.user_arrays(eval_set.users[rows], eval_set.ts[rows])
        return {"ranker": batch | index.candidate_arrays(cand, eval_set.ts[rows])}
    imp = index.imp
    held = np.flatnonzero(index.positive & (imp.ts >= index.split_ts))
    picks = np.random.default_rng(0).choice(held, min(len(held), settings.retrieval_batch), False)
    return {"retrieval": index.retrieval_batch(np.sort(picks))}


def _phase_summary(tower: str, history: History, settings) -> str:
    key = "retrieval" if tower == "retrieval" else "ranker"
    first, last = history.train[key][0], history.train[key][-1]
    rate = history.examples[tower] / max(history.seconds - history.compile_seconds, 1e-9)
    return (
        f"{tower}: {settings.steps} steps in {history.seconds:.1f} s "
        f"(compile {history.compile_seconds:.1f} s, {rate:,.0f} examples/s), "
        f"loss {first:.3f} -> {last:.3f}"
    )


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.floating | float):
        value = float(obj)
        return None if not np.isfinite(value) else round(value, 6)
    if isinstance(obj, np.integer):
        return int(obj)
    return obj
