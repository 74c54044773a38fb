"""The servers of the serving benchmark: one per dynamic-batching setting, all up at once."""

from __future__ import annotations

from pathlib import Path

from harness.serving_repository import (
    WORKLOADS,
    compiled_models,
    serving_repository,
    workload_widths,
)
from harness.triton import start_triton
from phoenix.ops.compile import ensure_programs
from phoenix.ops.triton_server import TritonServer


def repository_for(batching: str, args) -> Path:
    """The profile's repository for a batching setting (harness.serving_repository); a quick
    run's ranker, and recommend's ranker stage, which takes its parameters, compile only the
    candidate buckets its workloads fill."""
    widths = workload_widths(args.workloads)
    return serving_repository(
        args.build_dir,
        args.model_repository,
        device=args.device,
        batching=batching == "on",
        instances=args.instances,
        ranker_widths=widths if args.quick else None,
    )


def measured_models(workloads) -> list[str]:
    """The models the workloads call, in order (an ensemble brings its composing models)."""
    return list(dict.fromkeys(WORKLOADS[workload][0] for workload in workloads))


def start_servers(args) -> dict[str, TritonServer]:
    """One server per batching setting, all up at once (an idle server costs no CPU), each
    loading only the models the workloads call: the others would cost start-up time and
    device memory and be measured by nothing."""
    servers: dict[str, TritonServer] = {}
    models = measured_models(args.workloads)
    repositories = {batching: repository_for(batching, args) for batching in args.batching}
    compiled = compiled_models(models)
    if compiled:
        # one process compiles what the store lacks (each instance would compile it all), once:
        # the settings' repositories differ in the batcher alone, which no program depends on
        first = next(iter(repositories.values()))
        ensure_programs(args.artifacts, args.device, first, compiled)
    try:
        for batching, repository in repositories.items():
            log = args.build_dir / f"tritonserver-batching-{batching}.log"
            print(f"== dynamic batching {batching}: starting tritonserver (log {log})", flush=True)
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
