"""The servers of the serving benchmark: one per dynamic-batching setting, all up at once."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.serving_measure import WORKLOADS
from harness.triton import start_triton
from phoenix.engine.batching import bucket_for
from phoenix.ops.compile import ensure_programs
from phoenix.ops.configs import write_repository
from phoenix.ops.profiles import profile
from phoenix.ops.triton_server import TritonServer
from phoenix.schema.contracts import RANKER, RANKER_CANDIDATE_BUCKETS
from phoenix.stub.services.catalog import SERVED_BY_SERVICES


def repository_for(batching: str, args) -> Path:
    """The profile's repository for a batching setting, with the ranker's prefix cache off:
    perf_analyzer replays a pool of users, and with the cache every request of a user after
    the first would rank against a cached prefix (docs/performance.md, "The prefix cache"),
    where these figures measure the whole ranking."""
    instances = args.instances
    device = "" if args.device == "cpu" else f"-{args.device}"
    counts = "".join(f"-{name}{count}" for name, count in sorted(instances.items()))
    suffix = f"{device}{counts}{'-nobatch' if batching == 'off' else ''}"
    base = profile(args.device)
    deployment = base.with_instances(instances).with_parameters(
        RANKER.name, ranker_parameters(base.models[RANKER.name].parameters, args)
    )
    return write_repository(
        args.build_dir / f"model_repository{suffix}",
        deployment,
        dynamic_batching=batching == "on",
        source=args.model_repository,
    )


def ranker_parameters(deployed: Mapping[str, Any], args) -> dict[str, Any]:
    """The ranker's prefix cache off (above). With --quick, only the candidate buckets its
    workloads fill: a quick run's servers then compile no program it never runs (with the
    CPU profile's five buckets, 40 cache-off programs where ranker-64 runs 8)."""
    values: dict[str, Any] = {"prefix_cache_mib": 0}
    called = (WORKLOADS[workload] for workload in args.workloads)
    widths = [width for model, width in called if model == RANKER.name and width is not None]
    if args.quick and widths:
        buckets = tuple(deployed.get("candidate_buckets", RANKER_CANDIDATE_BUCKETS))
        values["candidate_buckets"] = tuple(sorted({bucket_for(w, buckets) for w in widths}))
    return values


def measured_models(workloads) -> list[str]:
    """The models the workloads call, in order (an ensemble brings its composing models)."""
    return list(dict.fromkeys(WORKLOADS[workload][0] for workload in workloads))


def start_servers(args) -> dict[str, TritonServer]:
    """One server per batching setting, all up at once (an idle server costs no CPU), each
    loading only the models the workloads call: the others would cost start-up time and
    device memory and be measured by nothing."""
    servers: dict[str, TritonServer] = {}
    models = measured_models(args.workloads)
    try:
        for batching in args.batching:
            log = args.build_dir / f"tritonserver-batching-{batching}.log"
            print(f"== dynamic batching {batching}: starting tritonserver (log {log})", flush=True)
            repository = repository_for(batching, args)
            # one process compiles what the store lacks; each instance would compile it all
            served = [m for m in models if m in SERVED_BY_SERVICES] or None
            ensure_programs(args.artifacts, args.device, repository, served)
            servers[batching] = start_triton(
                repository, args.artifacts, log_path=log, exit_timeout_secs=5,
                model_control_mode="explicit", load_model=models,
            )  # fmt: skip
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, TritonServer]) -> None:
    for server in servers.values():
        server.stop()
