"""The synthetic world a trained artifact directory was trained on (its training.json names
the world's spec and seed): rebuilt exactly, and its posts as the rows of a corpus.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

import numpy as np

from phoenix import checkpoint
from phoenix.checkpoint import ArtifactError, read_json
from phoenix.checkpoint.files import TRAINING_FILE, artifact_root, existing_file
from phoenix.corpus_store.building import InputFileError, PostRows
from phoenix.world import synthetic


def trained_world(artifact_dir: Path, num_posts: Optional[int] = None, seed: Optional[int] = None):
    """The synthetic world the towers of ``artifact_dir`` were trained on (its training.json),
    with ``num_posts`` posts (the spec's by default: the very world of training): the same users
    and authors, since ``make_world`` draws each from a stream of its own. ``seed``: training's
    by default."""
    path = existing_file(artifact_root(artifact_dir), TRAINING_FILE)
    summary = read_json(path, TRAINING_FILE)
    try:
        spec = synthetic.WorldSpec(**summary["world"])
    except (KeyError, TypeError, ValueError) as error:
        raise checkpoint.ArtifactError(f"{path}: no usable 'world' spec ({error!r})") from None
    seed = int(summary.get("seed", 0)) if seed is None else seed
    if num_posts is not None:
        spec = dataclasses.replace(spec, num_posts=num_posts)
    return synthetic.make_world(spec, seed)


def world_posts(artifacts: Path, count: int, seed: Optional[int], now: int) -> PostRows:
    """``count`` posts of the synthetic world in ARTIFACTS/training.json (the world the towers
    learned: its authors, topics, post ids and semantic IDs), shifted in time so that the newest
    is ``now`` (the world's own dates are in the past, where a window would expire them all)."""
    path = Path(artifacts) / TRAINING_FILE
    if not path.is_file():
        raise InputFileError(
            f"{path}: not found (--from-generator needs trained artifacts, e.g. "
            "artifacts/trained-demo)"
        )
    try:
        world = trained_world(artifacts, count, seed)
    except ArtifactError as error:
        raise InputFileError(str(error)) from None
    created = world.post_created_ts + (now - int(world.post_created_ts.max()))
    authors = world.author_ids[world.post_author]
    topics = world.post_topic.astype(np.int64)
    return PostRows(world.post_ids, authors, topics, created, world.post_semantic_ids)
