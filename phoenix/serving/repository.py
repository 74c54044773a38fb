"""Model configs (`config.pbtxt`): read them, check them against the contracts, derive variants.

Configs are read with protobuf's `text_format` into Triton's own `ModelConfig` message
(`tritonclient.grpc.model_config_pb2`), so a typo in a field name is an error here rather than
at server start. A derived repository (GPU instances, no batching, another queue delay) is a
copy whose configs are edited as messages and written back in protobuf text format; comments
of the source configs do not survive in the copy.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from phoenix.serving.contracts import ModelContract, TensorSpec

CONFIG_NAME = "config.pbtxt"
ModelConfig = model_config_pb2.ModelConfig
InstanceKind = model_config_pb2.ModelInstanceGroup.Kind
KIND_BY_DEVICE = {"cpu": "KIND_CPU", "gpu": "KIND_GPU"}


class PbtxtError(ValueError):
    """The text is not a valid protobuf-text ModelConfig."""


# ----------------------------------------------------------------------------------------
# Reading and writing
# ----------------------------------------------------------------------------------------


def parse_config(text: str) -> ModelConfig:
    """A ModelConfig from protobuf text; unknown fields and bad syntax raise PbtxtError."""
    try:
        return text_format.Parse(text, ModelConfig())
    except text_format.ParseError as error:
        raise PbtxtError(str(error)) from None


def format_config(config: ModelConfig) -> str:
    return text_format.MessageToString(config)


def read_config(path: str | Path) -> ModelConfig:
    """The ModelConfig of a config.pbtxt file; errors name the file."""
    path = Path(path)
    try:
        return parse_config(path.read_text())
    except PbtxtError as error:
        raise PbtxtError(f"{path}: {error}") from None


def model_config_paths(repository: Path) -> list[Path]:
    """config.pbtxt of every model (one level below the repository root)."""
    return sorted(path for path in Path(repository).glob(f"*/{CONFIG_NAME}") if path.is_file())


def string_parameters(config: ModelConfig) -> dict[str, str]:
    """The config's ``parameters`` as {key: string_value}."""
    return {key: value.string_value for key, value in config.parameters.items()}


# ----------------------------------------------------------------------------------------
# Checking a config against its contract
# ----------------------------------------------------------------------------------------


def _tensor_fields(tensor) -> dict:
    """What the contract fixes about a config tensor (ModelInput or ModelOutput)."""
    fields = {
        "data_type": model_config_pb2.DataType.Name(tensor.data_type),
        "dims": list(tensor.dims),
    }
    if isinstance(tensor, model_config_pb2.ModelInput):
        fields["optional"] = tensor.optional
        fields["allow_ragged_batch"] = tensor.allow_ragged_batch
    return fields


def _spec_fields(spec: TensorSpec, is_input: bool) -> dict:
    fields = {"data_type": spec.config_dtype, "dims": list(spec.dims)}
    if is_input:
        fields["optional"] = spec.optional
        fields["allow_ragged_batch"] = spec.ragged
    return fields


def _tensor_mismatches(what: str, found: Iterable, expected: Iterable[TensorSpec]) -> list[str]:
    """Differences between the config's inputs (or outputs) and the contract's."""
    found = {tensor.name: _tensor_fields(tensor) for tensor in found}
    expected = {spec.name: _spec_fields(spec, what == "input") for spec in expected}
    problems = [f"{what} {n!r} is not in the contract" for n in sorted(set(found) - set(expected))]
    problems += [f"{what} {n!r} is missing" for n in sorted(set(expected) - set(found))]
    for name in sorted(set(found) & set(expected)):
        for field, wanted in expected[name].items():
            value = found[name][field]
            if value != wanted:
                problems.append(f"{what} {name!r}: {field} {value}, contract {wanted}")
    return problems


def _step_mismatches(config: ModelConfig, contract: ModelContract) -> list[str]:
    found = [
        (step.model_name, dict(step.input_map), dict(step.output_map))
        for step in config.ensemble_scheduling.step
    ]
    expected = [
        (step.model, dict(step.input_map), dict(step.output_map)) for step in contract.steps
    ]
    if found == expected:
        return []
    return [f"ensemble steps {found} differ from the contract's {expected}"]


def contract_mismatches(config: ModelConfig, contract: ModelContract) -> list[str]:
    """Every way ``config`` disagrees with ``contract`` (empty when they agree)."""
    problems = []
    for field, wanted in (
        ("name", contract.name),
        ("max_batch_size", contract.max_batch_size),
        ("backend", contract.backend or ""),
        ("platform", contract.platform or ""),
    ):
        if getattr(config, field) != wanted:
            problems.append(f"{field} {getattr(config, field)!r}, contract {wanted!r}")
    problems += _tensor_mismatches("input", config.input, contract.inputs)
    problems += _tensor_mismatches("output", config.output, contract.outputs)
    parameters = string_parameters(config)
    for key, wanted in contract.parameters.items():
        if parameters.get(key) != wanted:
            problems.append(f"parameter {key!r} {parameters.get(key)!r}, contract {wanted!r}")
    return problems + _step_mismatches(config, contract)


# ----------------------------------------------------------------------------------------
# Deriving variants
# ----------------------------------------------------------------------------------------


def instance_kind_for(device: str) -> str:
    try:
        return KIND_BY_DEVICE[device]
    except KeyError:
        raise ValueError(
            f"device must be one of {sorted(KIND_BY_DEVICE)}, got {device!r}"
        ) from None


def set_instance_kind(config: ModelConfig, kind: str) -> None:
    """Set ``kind`` in every instance_group (adding one when the model has none).

    `gpus` lists are dropped when switching away from KIND_GPU, where Triton rejects them.
    """
    value = InstanceKind.Value(kind)
    if not config.instance_group:
        config.instance_group.add(kind=value)
    for group in config.instance_group:
        group.kind = value
        if kind != "KIND_GPU":
            del group.gpus[:]


def set_max_queue_delay(config: ModelConfig, microseconds: int) -> None:
    """Set max_queue_delay_microseconds of the dynamic batcher (none: unchanged)."""
    if microseconds < 0:
        raise ValueError("max_queue_delay_microseconds must be >= 0")
    if config.HasField("dynamic_batching"):
        config.dynamic_batching.max_queue_delay_microseconds = microseconds


def is_ensemble(config: ModelConfig) -> bool:
    return config.platform == "ensemble"


def has_dynamic_batching(config: ModelConfig) -> bool:
    return config.HasField("dynamic_batching")


@dataclass(frozen=True)
class GpuServing:
    """How a model is served on a GPU, where the CPU's settings would starve the device.

    A GPU's time per batch grows far less than the batch at these sizes (an assumption until
    the GPU section of docs/performance.md is measured), so batches are larger and the queue
    deeper; few batch and candidate buckets keep start-up compilation short (each
    bucket is one program per instance); one or two instances per GPU keep host work
    overlapped with device work without multiplying device memory.
    """

    max_batch_size: int
    batch_buckets: str
    instance_count: int
    max_queue_size: int
    max_queue_delay_us: int
    parameters: tuple[tuple[str, str], ...] = ()


GPU_SERVING = {
    "ranker": GpuServing(64, "1,8,64", 2, 1024, 1000, (("candidate_buckets", "64,256,1024"),)),
    "retriever": GpuServing(64, "1,8,64", 1, 1024, 500),
    "user_encoder": GpuServing(64, "1,8,64", 1, 1024, 500),
    "candidate_tower": GpuServing(4096, "4096", 1, 64, 500),  # one program of 4096 rows
}


def apply_gpu_serving(config: ModelConfig, serving: GpuServing) -> None:
    """Batch sizes, buckets, instance count and queue settings of ``serving``."""
    config.max_batch_size = serving.max_batch_size
    for group in config.instance_group:
        group.count = serving.instance_count
    config.parameters["batch_buckets"].string_value = serving.batch_buckets
    for key, value in serving.parameters:
        config.parameters[key].string_value = value
    if config.HasField("dynamic_batching"):
        batching = config.dynamic_batching
        batching.max_queue_delay_microseconds = serving.max_queue_delay_us
        if batching.HasField("default_queue_policy"):
            batching.default_queue_policy.max_queue_size = serving.max_queue_size


def derive_config(
    text: str,
    device: str = "cpu",
    dynamic_batching: bool = True,
    max_queue_delay_us: int | None = None,
) -> str:
    """One model's config.pbtxt rewritten for `device`, batching and queue delay choices.

    Ensembles are returned unchanged: they have no instances of their own (Triton refuses an
    instance_group there) and their steps are batched by the composing models.
    """
    kind = instance_kind_for(device)
    config = parse_config(text)
    if is_ensemble(config):
        return text
    set_instance_kind(config, kind)
    if device == "gpu" and config.name in GPU_SERVING:
        apply_gpu_serving(config, GPU_SERVING[config.name])
    if not dynamic_batching:
        config.ClearField("dynamic_batching")
    elif max_queue_delay_us is not None:
        set_max_queue_delay(config, max_queue_delay_us)
    return format_config(config)


def derive_repository(
    source: str | Path,
    dest: str | Path,
    *,
    device: str = "cpu",
    dynamic_batching: bool = True,
    max_queue_delay_us: int | None = None,
) -> Path:
    """Copy `source` into `dest` (replaced) with every model's config derived; return `dest`."""
    source, dest = Path(source).resolve(), Path(dest).resolve()
    if not source.is_dir():
        raise FileNotFoundError(f"model repository not found: {source}")
    if dest == source or source in dest.parents:
        raise ValueError(f"destination {dest} must lie outside the source repository {source}")
    instance_kind_for(device)  # fail before touching anything
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for config in model_config_paths(dest):
        try:
            derived = derive_config(
                config.read_text(), device, dynamic_batching, max_queue_delay_us
            )
        except PbtxtError as error:
            raise PbtxtError(f"{config.relative_to(dest)}: {error}") from error
        config.write_text(derived)
    return dest
