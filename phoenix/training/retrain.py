"""The next version from served logs: warm-started training, then the offline gate
(``python -m phoenix.training pipeline --logs DIR --init ARTIFACTS --out NEW``).

- The served artifacts (``--init``) give the starting weights (both towers, the hash tables,
  the retrieval temperature), the world (their training.json) and the config: the new version
  is trained with the same shapes and hash functions, and a preset or seed whose config
  differs is refused, naming the keys that differ.
- Training runs the preset's two phases (retrieval, then the ranker on the fixed tables) on
  the served logs' training rows, with fewer steps and a lower learning rate than training from
  scratch (``FINE_TUNE_STEPS_SHARE``, ``FINE_TUNE_LR_SHARE``).
- The new artifacts carry ``version`` = the old one + 1 (unversioned artifacts count as 1)
  and a corpus of the old corpus's posts, embedded with the new candidate tower (its digest
  is the new one: a corpus store of the old version is refused with the new towers).
- Both versions are evaluated on the held-out served rows; ``gate.json`` says whether the new
  one passes (``phoenix.training.gate``).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from phoenix import checkpoint
from phoenix.checkpoint import Corpus, read_json
from phoenix.checkpoint.params import LOG_TEMPERATURE_KEY
from phoenix.checkpoint.tower import candidate_tower_digest
from phoenix.config import ArtifactConfig, ArtifactError
from phoenix.training.data import LogIndex
from phoenix.training.evaluate import Evaluator, embed_posts
from phoenix.training.gate import GATE_FILE, GateRule, gate_result
from phoenix.training.pipeline import (
    TRAINING_FILE,
    finish_artifact_dir,
    run_summary,
    served_score_weights,
    train_phases,
    write_artifact_files,
)
from phoenix.training.presets import PRESETS, TrainPreset
from phoenix.training.train import INITIAL_LOG_TEMPERATURE
from phoenix.world.logs import LogError, load_logs
from phoenix.world.simulate import index_of

FINE_TUNE_STEPS_SHARE = 0.25  # of the preset's steps from scratch
FINE_TUNE_LR_SHARE = 0.3  # of the preset's learning rate: start near the served weights


class RetrainError(ValueError):
    """The served artifacts cannot be the start of this run: another config, another world,
    no training.json."""


def next_version(version: Optional[Union[str, int]]) -> int:
    """The version after ``version``: an integer (or integer text) + 1; unversioned artifacts
    are version 1. A label that is no number (``"2025-06"``) has no successor: name one."""
    if version is None:
        return 2
    if isinstance(version, int) and not isinstance(version, bool):
        return version + 1
    if isinstance(version, str) and version.strip().isdigit():
        return int(version) + 1
    raise RetrainError(
        f"version {version!r} of the served artifacts is not a number, so it has no next "
        "version; pass --version"
    )


def check_same_config(served: ArtifactConfig, config: ArtifactConfig, source: str) -> None:
    """RetrainError naming every key where ``config`` differs from the served one (the
    version label aside): warm-starting needs the same shapes and hash functions."""
    old, new = served.to_dict(), config.to_dict()
    old.pop("version", None)
    new.pop("version", None)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    if differ:
        shown = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in differ[:6])
        raise RetrainError(
            f"{source}: the config to train differs from the served artifacts' in "
            f"{', '.join(differ)} ({shown}); a warm start needs the same config: use the "
            "served artifacts' preset and seed (the defaults)"
        )


def warm_start_params(artifacts: checkpoint.Artifacts) -> dict:
    """The served weights in the training layout (``train.init_params``'s): both towers,
    the retrieval temperature (the initial one where the artifacts have none) and the
    three hash tables."""
    assert artifacts.retrieval_params is not None and artifacts.ranker_params is not None
    assert artifacts.tables is not None  # every part loaded (load_artifacts' default)
    retrieval: dict[str, dict[str, Any]] = {
        module: dict(values) for module, values in artifacts.retrieval_params.items()
    }
    scope, name = LOG_TEMPERATURE_KEY.rsplit("/", 1)
    retrieval.setdefault(scope, {}).setdefault(name, np.float32(INITIAL_LOG_TEMPERATURE))
    retrieval[scope][name] = np.float32(retrieval[scope][name])
    tables = {
        e: np.asarray(artifacts.tables[f"{e}_embeddings"]) for e in ("user", "item", "author")
    }
    ranker = {module: dict(values) for module, values in artifacts.ranker_params.items()}
    return {"ranker": ranker, "retrieval": retrieval, "tables": tables}


def fine_tune_phases(
    preset: TrainPreset,
    seed: int,
    retrieval_steps: Optional[int],
    ranker_steps: Optional[int],
    learning_rate: Optional[float],
) -> list:
    """The preset's two phases with fine-tuning steps and learning rate (defaults: shares of
    the preset's)."""
    lr = (
        preset.settings.learning_rate * FINE_TUNE_LR_SHARE
        if learning_rate is None
        else learning_rate
    )
    steps = {
        "retrieval": retrieval_steps
        if retrieval_steps is not None
        else max(1, int(preset.retrieval_steps * FINE_TUNE_STEPS_SHARE)),
        "ranker": ranker_steps
        if ranker_steps is not None
        else max(1, int(preset.ranker_steps * FINE_TUNE_STEPS_SHARE)),
    }
    for name, value in steps.items():
        if value < 1:
            raise ValueError(f"{name} steps must be >= 1, got {value}")
    return [
        dataclasses.replace(s, steps=steps[s.towers[0]], learning_rate=lr)
        for s in preset.phases(seed)
    ]


def reembedded_corpus(old: Corpus, world, config, params: dict) -> Corpus:
    """The served corpus's posts, embedded with the new candidate tower."""
    posts = index_of(world.post_ids, old.post_ids)
    if (posts < 0).any():
        raise RetrainError(
            f"{int((posts < 0).sum())} posts of the served corpus are not in the logs' world"
        )
    vectors = embed_posts(config, params, world, posts)
    return dataclasses.replace(old, embeddings=vectors)


def _served_training(init_dir: Path) -> dict:
    path = checkpoint.files.artifact_root(init_dir) / TRAINING_FILE
    if not path.is_file():
        raise RetrainError(
            f"{init_dir}: no {TRAINING_FILE}; --init needs trained artifacts (python -m "
            "phoenix.training pipeline writes them): their world and preset are the start"
        )
    return read_json(path, TRAINING_FILE)


def _check_same_world(info: dict, served: dict, logs_dir: Path, init_dir: Path) -> None:
    if info.get("spec") != served.get("world") or info.get("seed") != served.get("seed", 0):
        raise RetrainError(
            f"{logs_dir} holds logs of another world than {init_dir} was trained on (seed "
            f"{info.get('seed')} vs {served.get('seed')}); export the served logs with "
            f"--artifacts {init_dir}"
        )


def retrain(
    logs_dir: Path,
    init_dir: Path,
    out_dir: Path,
    *,
    preset_name: Optional[str] = None,
    seed: Optional[int] = None,
    retrieval_steps: Optional[int] = None,
    ranker_steps: Optional[int] = None,
    learning_rate: Optional[float] = None,
    version: Optional[Union[str, int]] = None,
    rule: GateRule = GateRule(),
    make_progress: Optional[Callable[[str, int], Callable]] = None,
    log=print,
) -> dict[str, Any]:
    """Train the next version of ``init_dir`` on the served logs of ``logs_dir``, write it to
    ``out_dir`` with its ``gate.json``; returns the gate."""
    started = time.perf_counter()
    init_dir, logs_dir, out_dir = Path(init_dir), Path(logs_dir), Path(out_dir)
    served_summary = _served_training(init_dir)
    try:
        served = checkpoint.load_artifacts(init_dir)
    except ArtifactError as error:
        raise RetrainError(f"--init {init_dir}: {error}") from None
    preset_name = preset_name or served_summary.get("preset")
    if preset_name not in PRESETS:
        raise RetrainError(f"{init_dir}: preset {preset_name!r} unknown; pass --preset")
    preset = PRESETS[preset_name]
    seed = int(served_summary.get("seed", 0)) if seed is None else seed
    config = preset.config(seed)
    check_same_config(served.config, config, f"--preset {preset_name} --seed {seed}")
    config = dataclasses.replace(
        config, version=next_version(served.config.version) if version is None else version
    )

    world, impressions, info = load_logs(logs_dir)
    _check_same_world(info, served_summary, logs_dir, init_dir)
    index = LogIndex(world, impressions, config, info.get("split_ts"), info.get("train_from_ts"))
    if len(index.train_sessions) == 0 or len(index.train_positives) == 0:
        raise LogError(
            f"{logs_dir}: no training requests or no positive engagement before the held-out "
            f"split ({len(index.train_sessions)} requests, {len(index.train_positives)} "
            "positives): serve longer, or hold out less"
        )
    log(
        f"version {served.config.version or 1} -> {config.version}: "
        f"{len(index.train_sessions):,} training requests, "
        f"{len(index.train_positives):,} training positives"
    )
    eval_set = index.eval_set(preset.eval_users, preset.eval_candidates, seed)
    if len(eval_set) == 0:
        raise LogError(f"{logs_dir}: no held-out user with a positive engagement to evaluate on")
    old_params = warm_start_params(served)
    phases = fine_tune_phases(preset, seed, retrieval_steps, ranker_steps, learning_rate)
    params, curves, timings = train_phases(
        index, eval_set, config, old_params, phases, preset.eval_every, seed, make_progress, log
    )

    t0 = time.perf_counter()
    corpus = reembedded_corpus(checkpoint.load_corpus(init_dir), world, config, params)
    partial, row = write_artifact_files(out_dir, config, params, corpus, index, eval_set)
    timings["write_artifacts_s"] = round(time.perf_counter() - t0, 1)

    t0 = time.perf_counter()
    evaluator = Evaluator(index, eval_set, config, served_score_weights())
    candidate = evaluator.model_metrics(params, corpus.embeddings)
    baseline = evaluator.model_metrics(old_params)
    timings["evaluate_s"] = round(time.perf_counter() - t0, 1)
    held = impressions.ts >= index.split_ts
    gate = gate_result(
        candidate,
        baseline,
        rule,
        {
            "rows": int(held.sum()),
            "users": len(eval_set),
            "from": int(index.split_ts),
            "to": int(impressions.ts[held].max()) if held.any() else None,
            "logs": str(logs_dir),
        },
    )
    gate["candidate_version"] = config.version
    gate["baseline_version"] = served.config.version or 1
    timings["total_s"] = round(time.perf_counter() - started, 1)
    summary = {
        "preset": preset_name,
        "seed": seed,
        "description": f"version {config.version}: {preset_name} warm-started from {init_dir}",
        "world": served_summary.get("world"),
        "init": {
            "path": str(init_dir),
            "version": served.config.version,
            "candidate_tower_digest": candidate_tower_digest(init_dir),
        },
        "logs": {"path": str(logs_dir), "split_ts": index.split_ts} | info.get("served", {}),
        "phases": [dataclasses.asdict(p) for p in phases],
        **run_summary(impressions, corpus, eval_set, world, row, curves),
        "evaluation": {"trained": candidate, "served_version": baseline},
        "gate": {k: gate[k] for k in ("passed", "metric", "tolerance", "rule")},
        "timings": timings,
    }
    finish_artifact_dir(partial, summary, extra_files={GATE_FILE: gate})
    return gate
