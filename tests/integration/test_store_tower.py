"""A real tritonserver refuses to serve a corpus store embedded by another candidate tower: the
retriever fails to load, the server does not get ready, and its log names both towers'
digests (phoenix/corpus_store/towers.py). The store is built by `build_store`, as
`phoenix-build-corpus --store` builds one, with a copy of the artifacts whose candidate tower
differs (one projection scaled, a version label)."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from phoenix.checkpoint import (
    RETRIEVAL_PARAMS_FILE,
    load_config,
    load_corpus,
    read_npz,
    save_config,
    write_npz,
)
from phoenix.checkpoint.tower import CANDIDATE_TOWER_SCOPE
from phoenix.corpus_store.building import PostRows, build_store
from phoenix.corpus_store.towers import tower_of
from phoenix.engine import CandidateTower
from phoenix.ops.configs import write_repository
from phoenix.ops.profiles import profile
from phoenix.ops.triton_server import TritonServerError

pytestmark = pytest.mark.integration


def retrained_tower(source, target):
    """A copy of ``source`` whose candidate tower is another (version 2)."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("compiled"))
    params = read_npz(target / RETRIEVAL_PARAMS_FILE, RETRIEVAL_PARAMS_FILE)
    key = next(k for k in sorted(params) if k.startswith(CANDIDATE_TOWER_SCOPE + "/"))
    params[key] = params[key] * 1.05
    write_npz(target / RETRIEVAL_PARAMS_FILE, params)
    save_config(target, dataclasses.replace(load_config(target), version=2))
    return target


def test_a_store_embedded_by_another_tower_is_refused_at_start(tiny_artifacts, tmp_path):
    from tests.integration.conftest import launch_server

    artifacts = tmp_path / "artifacts"
    shutil.copytree(tiny_artifacts, artifacts)
    other = retrained_tower(tiny_artifacts, tmp_path / "other")
    corpus = load_corpus(artifacts / "corpus.npz")
    posts = PostRows(corpus.post_ids, corpus.author_ids)
    build_store(
        artifacts / "store",
        posts,
        CandidateTower.from_artifacts(other),
        embedded_by=tower_of(other),
        report=lambda line: None,
    )
    mine, theirs = tower_of(artifacts), tower_of(other)
    assert mine.digest != theirs.digest
    repository = write_repository(tmp_path / "repository", profile("cpu").with_corpus("store"))
    log_path = tmp_path / "tritonserver.log"
    with pytest.raises(TritonServerError):
        server = launch_server(repository, artifacts, log_path=log_path, ready_timeout=300)
        server.stop()  # (not reached: the server must not get ready)
    log = log_path.read_text(errors="replace")
    refusals = [line for line in log.splitlines() if "was embedded by candidate tower" in line]
    assert refusals, log[-4000:]
    assert theirs.digest[:16] in refusals[0] and mine.digest[:16] in refusals[0]
    assert "version 2" in refusals[0] and str(artifacts / "store" / "manifest.json") in log
