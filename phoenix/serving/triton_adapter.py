"""The bridge between Triton's Python backend and ``phoenix.serving.services``.

Each ``model_repository/<model>/1/model.py`` subclasses ``ServiceModel`` and names its
service; everything else happens here. This module imports neither JAX nor Triton at import
time: the device settings must be in the environment before JAX loads, and tests import it
without a server.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("phoenix.serving")

ARTIFACT_DIR_ENV = "PHOENIX_ARTIFACT_DIR"
JAX_CACHE_ENV = "PHOENIX_JAX_CACHE_DIR"
REPO_ROOT = Path(__file__).resolve().parents[2]


def model_parameters(model_config: Mapping[str, Any]) -> dict[str, str]:
    """``parameters`` of a model config as a plain {key: string} dict."""
    params = model_config.get("parameters") or {}
    return {key: value.get("string_value", "") for key, value in params.items()}


def resolve_artifact_dir(params: Mapping[str, str], model_dir: str) -> Path:
    """$PHOENIX_ARTIFACT_DIR, else the ``artifact_dir`` parameter relative to the model dir."""
    chosen = os.environ.get(ARTIFACT_DIR_ENV) or params.get("artifact_dir", "")
    if not chosen:
        raise ValueError(
            f"no artifact directory: set ${ARTIFACT_DIR_ENV} or the 'artifact_dir' parameter"
        )
    path = Path(chosen)
    if not path.is_absolute():
        path = Path(model_dir) / path
    path = path.resolve()
    if not (path / "config.json").is_file():
        raise ValueError(f"artifact directory {path} has no config.json (make artifacts?)")
    return path


def configure_jax_environment(instance_kind: str, device_id: str) -> None:
    """Device and memory settings; must run before JAX is first imported in the stub."""
    if instance_kind.upper() == "GPU":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(device_id))
        # Without this the first instance takes 75% of the GPU and the others fail.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"


def enable_compilation_cache() -> None:
    """Persist compiled executables so restarts skip most of the warm-up compilation."""
    import jax

    cache = os.environ.get(JAX_CACHE_ENV) or str(REPO_ROOT / "build" / "jax-cache")
    Path(cache).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def parse_int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted(int(v) for v in text.split(",") if v.strip()))
    except ValueError:
        raise ValueError(
            f"parameter '{name}' must be a comma-separated list of ints: {text!r}"
        ) from None
    if not values or values[0] < 1:
        raise ValueError(f"parameter '{name}' must list positive ints, got {text!r}")
    return values


def batch_buckets_of(params: Mapping[str, str], max_batch: int) -> tuple[int, ...]:
    """The ``batch_buckets`` parameter if given, else powers of two up to ``max_batch``.

    Each bucket is one compiled shape per program, so GPU configurations list a few (fewer
    compilations at start-up) and CPU ones take every power of two (less padding)."""
    if params.get("batch_buckets"):
        buckets = parse_int_list(params["batch_buckets"], "batch_buckets")
        if buckets[-1] < max_batch:
            raise ValueError(
                f"parameter 'batch_buckets' {buckets} must reach max_batch_size {max_batch}"
            )
        return buckets
    from phoenix.serving.contracts import powers_of_two_up_to

    return powers_of_two_up_to(max_batch)


def build_service(name: str, params: Mapping[str, str], artifact_dir: Path, max_batch: int):
    """The service object of model ``name`` over ``artifact_dir``."""
    from phoenix.serving import contracts, services

    resources = services.PhoenixResources(artifact_dir)
    batch_buckets = batch_buckets_of(params, max_batch)
    if name == "user_encoder":
        return services.UserEncoderService(resources, batch_buckets=batch_buckets)
    if name == "candidate_tower":
        if not params.get("batch_buckets"):  # the CPU default: 256-row calls
            return services.CandidateTowerService(resources)
        return services.CandidateTowerService(resources, rows_per_call=batch_buckets[-1])
    if name == "retriever":
        corpus = params.get("corpus_file") or "corpus.npz"
        return services.RetrieverService(resources, corpus, batch_buckets=batch_buckets)
    if name == "ranker":
        return services.RankerService(
            resources,
            params.get("score_weights", ""),
            candidate_buckets=(
                parse_int_list(params["candidate_buckets"], "candidate_buckets")
                if params.get("candidate_buckets")
                else contracts.RANKER_CANDIDATE_BUCKETS
            ),
            batch_buckets=batch_buckets,
        )
    raise ValueError(f"unknown service {name!r}")


# Tensors cross the Triton boundary through DLPack only. The 2.51 stub's pybind11 numpy layer
# reads numpy 2 dtypes wrongly: the as_numpy method repeats element 0 and `Tensor(name, ndarray)`
# sends empty tensors (docs/serving.md, "numpy 2 and DLPack").


def input_array(tensor) -> np.ndarray:
    """A request tensor as a numpy array (a view of Triton's buffer while on the host)."""
    if tensor.is_cpu():
        return np.from_dlpack(tensor)
    import jax.dlpack  # a GPU-resident input, e.g. from a GPU model of an ensemble

    return np.asarray(jax.dlpack.from_dlpack(tensor))


def request_inputs(request) -> dict[str, np.ndarray]:
    """{input name: array} of one request."""
    return {tensor.name(): input_array(tensor) for tensor in request.inputs()}


def host_tensor(array: np.ndarray, dtype) -> Any:
    """``array`` as ``dtype`` in a host-resident JAX buffer, ready for ``Tensor.from_dlpack``.

    A numpy array's own DLPack capsule is not safe here: the backend renames the consumed
    capsule, numpy's destructor then fails on the name, and a stub died of it once. JAX's
    buffers are. ``enable_x64`` keeps int64 ids int64 (JAX would narrow them to int32).
    """
    import jax

    with jax.enable_x64(True):
        return jax.device_put(np.asarray(array, dtype=dtype), jax.devices("cpu")[0])


class ServiceModel:
    """Triton Python-backend model delegating to a ``phoenix.serving.services`` service."""

    service_name = ""

    def initialize(self, args: Mapping[str, str]) -> None:
        configure_jax_environment(
            args.get("model_instance_kind", "CPU"), args.get("model_instance_device_id", "0")
        )
        import triton_python_backend_utils as pb_utils

        self.pb = pb_utils
        config = json.loads(args["model_config"])
        params = model_parameters(config)
        self.output_dtypes = {
            out["name"]: pb_utils.triton_string_to_numpy(out["data_type"])
            for out in config.get("output", [])
        }
        enable_compilation_cache()
        started = time.perf_counter()
        artifact_dir = resolve_artifact_dir(params, args["model_repository"])
        self.service = build_service(
            self.service_name, params, artifact_dir, int(config.get("max_batch_size", 1) or 1)
        )
        compiled = self.service.warm_up()
        logger.warning(
            "%s ready: artifacts %s, %d shapes compiled in %.1f s",
            args.get("model_instance_name", self.service_name),
            artifact_dir,
            compiled,
            time.perf_counter() - started,
        )

    def execute(self, requests):
        from phoenix.serving.requests import InputError

        inputs = [request_inputs(request) for request in requests]
        try:
            results = self.service.handle(inputs)
        except Exception as error:  # never crash the stub: report the batch as failed
            logger.exception("%s: batch failed", self.service_name)
            results = [RuntimeError(f"{type(error).__name__}: {error}")] * len(requests)
        return [self._response(result, InputError) for result in results]

    def _response(self, result, input_error_type):
        pb = self.pb
        if isinstance(result, input_error_type):
            return pb.InferenceResponse(
                output_tensors=[], error=pb.TritonError(str(result), pb.TritonError.INVALID_ARG)
            )
        if isinstance(result, Exception):
            return pb.InferenceResponse(
                output_tensors=[], error=pb.TritonError(str(result), pb.TritonError.INTERNAL)
            )
        tensors = [
            pb.Tensor.from_dlpack(name, host_tensor(array, self.output_dtypes[name]))
            for name, array in result.items()
            if name in self.output_dtypes
        ]
        return pb.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.service = None
