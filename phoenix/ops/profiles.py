"""Deployment profiles: how each served model runs on CPUs and on GPUs, written once.

A model's contract (``contracts``) says what it accepts and returns; a profile says how it is
deployed: instances, batch sizes and the buckets compiled at start-up, the dynamic batcher's
queue, and the parameters the model reads at start-up. ``configs`` generates every
``config.pbtxt`` from the two: the CPU profile writes ``<model>/config.pbtxt``, the GPU profile
``<model>/configs/gpu.pbtxt``, which Triton picks with ``--model-config-name=gpu``.

Why the numbers are what they are:
- CPU: two instances per model overlap one batch's Python work with the other's compute and
  keep the batcher busy (Triton 2.51 with a queue policy and one instance stalls ~0.5 s at
  times). Batch buckets are every power of two up to the batch size (least padding).
- GPU: a GPU's time per batch grows far less than the batch at these sizes, so batches are
  larger and queues deeper; few batch and candidate buckets keep start-up compilation short
  (each bucket is one program per instance); one or two instances per GPU overlap host work
  with device work without multiplying device memory. These are starting points until a GPU
  run measures them (docs/performance.md).
- Queues: past capacity a request is refused at once (UNAVAILABLE) rather than queued without
  bound; docs/reliability.md says how the sizes and the 5 s timeout were chosen.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from phoenix.schema.contracts import CORPUS_FILE
from phoenix.schema.recommend import stage_parameter
from phoenix.schema.served import CONTRACTS, CORPUS_READERS
from phoenix.schema.spec import powers_of_two_up_to


@dataclass(frozen=True)
class Queue:
    """The dynamic batcher's queue of one model."""

    max_delay_us: int  # how long the batcher waits to fill a batch
    max_size: int  # requests waiting past this are refused
    timeout_us: int = 5_000_000  # a request waiting longer is refused (clients may override)


@dataclass(frozen=True)
class Deployment:
    """How one model is deployed: instances, batch size and buckets, queue, parameters."""

    instances: int
    queue: Queue
    max_batch_size: Optional[int] = None  # None: the contract's
    # For models that compile per batch size; None: powers of two up to the batch size
    batch_buckets: Optional[tuple[int, ...]] = None
    # Typed values of parameters the contract declares (they override its defaults)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    instance_kind: Optional[str] = None  # None: the profile's; "KIND_CPU" for host-only models

    def batch_size(self, model: str) -> int:
        return self.max_batch_size or CONTRACTS[model].max_batch_size

    def parameter_values(self, model: str) -> dict[str, Any]:
        """The parameters this deployment gives ``model`` (its batch buckets included)."""
        values = dict(self.parameters)
        if CONTRACTS[model].compiles_batches:
            values["batch_buckets"] = self.batch_buckets or powers_of_two_up_to(
                self.batch_size(model)
            )
        elif self.batch_buckets is not None:
            raise ValueError(f"{model} compiles no batch sizes: batch_buckets does not apply")
        return values


@dataclass(frozen=True)
class Profile:
    """Every served model's deployment on one kind of device."""

    name: str  # "cpu" or "gpu": also the value of serve --device
    instance_kind: str  # Triton's instance_group kind
    config_name: Optional[str]  # None: config.pbtxt, else configs/<name>.pbtxt
    models: Mapping[str, Deployment]

    def instance_kind_of(self, model: str) -> str:
        """Triton's instance_group kind of ``model``: its own (host-only models) or the
        profile's."""
        return self.models[model].instance_kind or self.instance_kind

    def parameter_values(self, model: str) -> dict[str, Any]:
        """The parameters ``model`` is deployed with; a chain's are its stages' as this profile
        deploys them (one fact, one place), under the chain's names for them."""
        stages = CONTRACTS[model].stages
        if not stages:
            return self.models[model].parameter_values(model)
        values: dict[str, Any] = {}
        for stage in stages:
            for name, value in self.parameter_values(stage.model).items():
                key = stage_parameter(stage.model, name)
                if key in values and values[key] != value:
                    raise ValueError(
                        f"{model}: its stages disagree on the shared parameter {key!r} "
                        f"({values[key]!r} against {value!r} of {stage.model})"
                    )
                values[key] = value
        return values

    def config_path(self, model: str) -> str:
        """The config file of ``model`` under this profile, relative to the repository."""
        if self.config_name is None:
            return f"{model}/config.pbtxt"
        return f"{model}/configs/{self.config_name}.pbtxt"

    def with_corpus(self, corpus_file: str) -> Profile:
        """The same profile with every model that reads the corpus reading ``corpus_file`` (a
        corpus .npz or a corpus store directory, inside the artifact directory)."""
        models = {
            name: replace(d, parameters={**d.parameters, CORPUS_FILE.name: corpus_file})
            if name in CORPUS_READERS
            else d
            for name, d in self.models.items()
        }
        return replace(self, models=models)

    def with_instances(self, counts: Mapping[str, int]) -> Profile:
        """The same profile with ``counts[model]`` instances of each model named there."""
        unknown = sorted(set(counts) - set(self.models))
        if unknown:
            raise ValueError(f"no served model {unknown}; choose from {sorted(self.models)}")
        for name, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{name}: instances must be a whole number >= 1, got {count!r}")
        models = {
            name: replace(d, instances=counts.get(name, d.instances))
            for name, d in self.models.items()
        }
        return replace(self, models=models)

    def with_parameters(self, model: str, values: Mapping[str, Any]) -> Profile:
        """The same profile with ``model`` deployed with ``values`` over its parameters (a
        chain takes its stages' from them)."""
        if model not in self.models:
            raise ValueError(f"no served model {model!r}; choose from {sorted(self.models)}")
        deployment = self.models[model]
        changed = replace(deployment, parameters={**deployment.parameters, **values})
        return replace(self, models={**self.models, model: changed})

    def with_queue_delay(self, max_delay_us: int) -> Profile:
        """The same profile with every model's batcher waiting ``max_delay_us``."""
        if max_delay_us < 0:
            raise ValueError("max_queue_delay_us must be >= 0")
        models = {
            name: replace(d, queue=replace(d.queue, max_delay_us=max_delay_us))
            for name, d in self.models.items()
        }
        return replace(self, models=models)


_CPU_QUEUE = Queue(max_delay_us=2000, max_size=64)

CPU = Profile(
    name="cpu",
    instance_kind="KIND_CPU",
    config_name=None,
    models={
        "user_encoder": Deployment(2, _CPU_QUEUE),
        "candidate_tower": Deployment(2, _CPU_QUEUE, parameters={"rows_per_call": 256}),
        "retriever": Deployment(2, _CPU_QUEUE),
        "ranker": Deployment(2, _CPU_QUEUE),  # the contract's candidate buckets
        # numpy only, well under a millisecond per batch: no buckets to compile, and no
        # wait to fill a batch (it handles each request on its own, so waiting only adds
        # latency); two instances for the same reason as the others (one can stall)
        "feed_policy": Deployment(2, Queue(max_delay_us=0, max_size=64)),
        # Redis reads, one pipeline per batch: no wait to fill a batch (as feed_policy)
        "user_state": Deployment(2, Queue(max_delay_us=0, max_size=64)),
        # one Redis write per batch: no wait to fill a batch (as user_state)
        "served_log": Deployment(2, Queue(max_delay_us=0, max_size=64)),
        # recommend: every stage in one process, a batch at a time
        "recommend_chain": Deployment(2, Queue(max_delay_us=0, max_size=64)),
    },
)

_GPU_BATCHES: dict[str, Any] = dict(max_batch_size=64, batch_buckets=(1, 8, 64))

GPU = Profile(
    name="gpu",
    instance_kind="KIND_GPU",
    config_name="gpu",
    models={
        "user_encoder": Deployment(1, Queue(500, 1024), **_GPU_BATCHES),
        "candidate_tower": Deployment(1, Queue(500, 64), parameters={"rows_per_call": 4096}),
        "retriever": Deployment(1, Queue(500, 1024), **_GPU_BATCHES),
        "ranker": Deployment(
            2,
            Queue(1000, 1024),
            **_GPU_BATCHES,
            parameters={
                "candidate_buckets": (64, 256, 1024),
                "split_widths": False,
                # device memory: docs/deploy.md's GPU memory per stub bounds it
                "prefix_cache_mib": 512,
            },
        ),
        # the policy runs on the host (numpy) whatever the device: a CPU instance group
        "feed_policy": Deployment(2, Queue(0, 1024), max_batch_size=64, instance_kind="KIND_CPU"),
        # Redis reads on the host, whatever the device
        "user_state": Deployment(2, Queue(0, 1024), max_batch_size=64, instance_kind="KIND_CPU"),
        # Redis writes on the host, whatever the device
        "served_log": Deployment(2, Queue(0, 1024), max_batch_size=64, instance_kind="KIND_CPU"),
        # recommend's stages in one process: the towers and the ranker on the GPU, the host
        # stages beside them
        "recommend_chain": Deployment(2, Queue(1000, 1024), max_batch_size=64),
    },
)

PROFILES: dict[str, Profile] = {p.name: p for p in (CPU, GPU)}


def instance_counts(text: str) -> dict[str, int]:
    """``"ranker=8,retriever=2"`` as {"ranker": 8, "retriever": 2}: the command-line form of
    ``Profile.with_instances`` (which checks the names)."""
    counts = {}
    for item in filter(None, (v.strip() for v in text.split(","))):
        name, _, count = item.partition("=")
        if not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"{item!r}: expected MODEL=N with N >= 1 (e.g. ranker=8)")
        if name.strip() in counts:
            raise ValueError(f"{name.strip()!r} is given twice")
        counts[name.strip()] = int(count)
    return counts


def instance_counts_arg(text: str) -> dict[str, int]:
    """``instance_counts`` for argparse (``type=``), names checked against the profiles."""
    import argparse

    try:
        counts = instance_counts(text)
        GPU.with_instances(counts)  # the names checked where the counts are applied
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return counts


def profile(name: str) -> Profile:
    """The deployment profile by name ("cpu" or "gpu")."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"no deployment profile {name!r}; choose one of {sorted(PROFILES)}"
        ) from None
