"""Index specs in the manifest: the probing fields round-trip, and a store written before they
existed still loads, searched as it was (a fixed nprobe, no re-rank)."""

from __future__ import annotations

import numpy as np
import pytest

from phoenix.corpus_store.ann import (
    PROBE_MEAN_WEIGHT,
    ivf_spec,
    lists_to_probe,
    mean_score_probing,
    spilled_spec,
)
from phoenix.corpus_store.manifest import IVF_SQ8, IndexSpec, StoreError, _index_spec


def centroid_scores(best: list[float], mean: float = 0.0, nlist: int = 4096) -> np.ndarray:
    """Scores [B, nlist] over the centroids whose row b has its best at ``best[b]`` and its
    mean at ``mean`` (the others set to give that mean)."""
    rest = (mean * nlist - np.asarray(best, float)) / (nlist - 1)  # [B]
    scores = np.repeat(rest[:, None], nlist, axis=1)
    scores[:, 0] = best
    return scores


def test_probing_fields_round_trip_through_the_manifest():
    spec = ivf_spec(4096, 64)
    assert spec.max_nprobe > spec.nprobe and spec.rerank > 0
    assert _index_spec(spec.to_dict(), "manifest.json") == spec


def test_a_spilled_spec_round_trips_and_is_refused_without_a_rerank():
    spec = spilled_spec(ivf_spec(4096, 64))
    assert spec.spilled and spec.nprobe < ivf_spec(4096, 64).nprobe
    assert _index_spec(spec.to_dict(), "manifest.json") == spec
    entry = {**spec.to_dict(), "rerank": 0}
    with pytest.raises(StoreError, match="manifest.json: lists_per_post 2"):
        _index_spec(entry, "manifest.json")
    with pytest.raises(StoreError, match="lists_per_post 3"):
        _index_spec({**spec.to_dict(), "lists_per_post": 3}, "manifest.json")


def test_an_entry_without_probing_fields_loads_as_before():
    old = _index_spec({"kind": IVF_SQ8, "nlist": 4096, "nprobe": 128}, "manifest.json")
    assert old == IndexSpec(IVF_SQ8, 4096, 128)
    assert old.to_dict() == {"kind": IVF_SQ8, "nlist": 4096, "nprobe": 128}
    assert (lists_to_probe(old, centroid_scores([0.2, 0.9])) == 128).all()


def test_users_between_clusters_probe_more_lists_up_to_the_cap():
    spec = ivf_spec(4096, 64)
    probes = lists_to_probe(spec, centroid_scores([0.95, spec.probe_score, 0.6, -1.0]))
    assert probes[0] == probes[1] == spec.nprobe
    assert spec.nprobe < probes[2] < spec.max_nprobe
    assert probes[3] == spec.max_nprobe


def test_a_spec_without_a_mean_weight_ignores_the_mean_score():
    spec = spilled_spec(ivf_spec(4096, 64))
    assert spec.probe_mean_weight == 0
    low, high = (lists_to_probe(spec, centroid_scores([0.6], m)) for m in (0.0, 0.06))
    assert low == high


def test_a_user_facing_the_dense_middle_probes_more_lists_at_the_same_best_score():
    spec = mean_score_probing(spilled_spec(ivf_spec(4096, 64)))
    (low,), (high,) = (lists_to_probe(spec, centroid_scores([0.55], m)) for m in (0.0, 0.05))
    # exp(weight x 0.05), to the rounding of a count
    assert high / low == pytest.approx(np.exp(PROBE_MEAN_WEIGHT * 0.05), rel=0.02)
    assert spec.nprobe < low < high <= spec.max_nprobe


def test_mean_score_probing_starts_lower_and_round_trips():
    spilled = spilled_spec(ivf_spec(4096, 64))
    spec = mean_score_probing(spilled)
    assert spec.nprobe < spilled.nprobe and spec.max_nprobe == spilled.max_nprobe
    assert _index_spec(spec.to_dict(), "manifest.json") == spec
    assert "probe_mean_weight" not in spilled.to_dict()  # older entries are written as before


def test_a_cap_below_nprobe_is_refused_naming_the_file():
    entry = {"kind": IVF_SQ8, "nlist": 4096, "nprobe": 128, "max_nprobe": 64}
    with pytest.raises(StoreError, match="manifest.json: max_nprobe 64"):
        _index_spec(entry, "manifest.json")
