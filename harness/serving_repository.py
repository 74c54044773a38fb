"""The serving benchmark's workloads and the model repositories it serves: the deployment
profile's, with the ranker's prefix cache off and, when asked, only the candidate buckets the
measured workloads fill; which models' programs a server loading some of them runs; and the
most users the batcher puts in one ranker call (IN_PROCESS_BATCH, the in-process side's).
bench/serving_servers.py starts servers over them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from phoenix.engine.batching import bucket_for
from phoenix.ops.configs import write_repository
from phoenix.ops.profiles import profile
from phoenix.schema.contracts import RANKER, RANKER_CANDIDATE_BUCKETS
from phoenix.schema.served import CONTRACTS
from phoenix.stub.services.catalog import SERVED_BY_SERVICES

RECOMMEND_TOP_K = 100
IN_PROCESS_BATCH = RANKER.max_batch_size  # the most users the batcher puts in one ranker call
# The workloads bench_serving measures, name: (model, candidates the ranker ranks per user):
# recommend's ranker stage ranks the posts its retriever returns, top_k of them (its requests
# carry a history and follow no author, so no in-network post joins them)
WORKLOADS = {
    "ranker-64": ("ranker", 64),
    "ranker-512": ("ranker", 512),
    "recommend": ("recommend", RECOMMEND_TOP_K),
}


def workload_widths(workloads: Sequence[str]) -> list[int]:
    """The candidates per user the ranker ranks in ``workloads`` (``ranker_parameters``)."""
    return [WORKLOADS[workload][1] for workload in workloads]


def ranker_parameters(
    deployed: Mapping[str, Any], ranker_widths: Optional[Sequence[int]]
) -> dict[str, Any]:
    """The ranker's prefix cache off: perf_analyzer replays a pool of users, and with the
    cache every request of a user after the first would rank against a cached prefix
    (docs/performance.md, "The prefix cache"), where these figures measure the whole ranking.
    With ``ranker_widths`` (the candidates per user of the ranker's workloads), only the
    candidate buckets those fill: the servers then compile no program the run never calls
    (with the CPU profile's five buckets, 40 cache-off programs where ranker-64 runs 8)."""
    values: dict[str, Any] = {"prefix_cache_mib": 0}
    if ranker_widths:
        buckets = tuple(deployed.get("candidate_buckets", RANKER_CANDIDATE_BUCKETS))
        values["candidate_buckets"] = tuple(sorted({bucket_for(w, buckets) for w in ranker_widths}))
    return values


def serving_repository(
    build_dir: Path,
    source: Path,
    *,
    device: str,
    batching: bool,
    instances: Mapping[str, int],
    ranker_widths: Optional[Sequence[int]] = None,
) -> Path:
    """The profile of ``device`` written under ``build_dir`` from the models in ``source``,
    with ``instances`` and the ranker's parameters above; no dynamic batcher unless
    ``batching``."""
    suffix = "" if device == "cpu" else f"-{device}"
    suffix += "".join(f"-{name}{count}" for name, count in sorted(instances.items()))
    suffix += "" if batching else "-nobatch"
    base = profile(device)
    deployment = base.with_instances(instances).with_parameters(
        RANKER.name, ranker_parameters(base.models[RANKER.name].parameters, ranker_widths)
    )
    return write_repository(
        build_dir / f"model_repository{suffix}",
        deployment,
        dynamic_batching=batching,
        source=source,
    )


def compiled_models(loaded: Sequence[str]) -> list[str]:
    """The models whose programs a server that loads only ``loaded`` runs, in order: an
    ensemble's are its steps' (``recommend``: ``recommend_chain``). Compiling for the whole
    repository instead builds the service of every model in it: for ``recommend`` alone over
    the GPU bench smoke's artifacts, 63 CPU-s against 52 for the chain alone (most of both is
    the chain's own programs: its ranker stage runs the cache-off ranker's)."""
    steps = ([step.model for step in CONTRACTS[name].steps] or [name] for name in loaded)
    named = dict.fromkeys(model for models in steps for model in models)
    return [model for model in named if model in SERVED_BY_SERVICES]
