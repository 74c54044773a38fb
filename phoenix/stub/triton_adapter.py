"""The bridge between Triton's Python backend and ``phoenix.stub.services``: tensors only.

Each ``model_repository/<model>/1/model.py`` subclasses ``ServiceModel`` and names its model;
the service comes from the registry in ``services``. Per ``execute`` the adapter reads each
request's tensors (DLPack), hands them to the service, and turns each result into a response:
outputs, INVALID_ARG for a request the service refused, INTERNAL for every request of a batch
that failed, each refusal and failure counted on Triton's ``/metrics`` (``request_metrics``),
each answer counted per model and artifact version, and the followed corpus store's
generation shown after each batch.
This module imports neither JAX nor Triton at import time: the device settings must be in the
environment before JAX loads, and tests import it without a server.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from phoenix.checkpoint.identity import ArtifactMismatch, artifact_version, config_digest, short
from phoenix.schema.contracts import ARTIFACT_DIR, ARTIFACT_VERSION, CONFIG_DIGEST
from phoenix.schema.input_error import InputError
from phoenix.stub.host_dlpack import host_buffers
from phoenix.stub.profile import StubProfile
from phoenix.stub.request_metrics import (
    CorpusMetrics,
    PrefixCacheMetrics,
    RequestMetrics,
    ServedMetrics,
)

if TYPE_CHECKING:  # imported in initialize, once the device settings are in the environment
    from phoenix.stub.services.common import Service

logger = logging.getLogger("phoenix.stub")


def with_host_platform(platforms: str) -> str:
    """JAX_PLATFORMS with "cpu" added: a GPU instance started under JAX_PLATFORMS=cuda failed
    every request without it while outputs left as host JAX buffers (seen on an H200,
    2026-11-26: "Unknown backend cpu"); kept so that host-side JAX work stays possible."""
    names = [p.strip() for p in platforms.split(",") if p.strip()]
    return ",".join(names if "cpu" in names else [*names, "cpu"])


def configure_jax_environment(instance_kind: str, device_id: str) -> None:
    """Device and memory settings; must run before JAX is first imported in the stub."""
    if instance_kind.upper() == "GPU":
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(device_id))
        # Without this the first instance takes 75% of the GPU and the others fail.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if platforms:  # unset: JAX brings up every platform it has, the host's among them
            os.environ["JAX_PLATFORMS"] = with_host_platform(platforms)
    else:
        os.environ["JAX_PLATFORMS"] = "cpu"


# Tensors cross the Triton boundary through DLPack only. The 2.51 stub's pybind11 numpy layer
# reads numpy 2 dtypes wrongly: the as_numpy method repeats element 0 and `Tensor(name, ndarray)`
# sends empty tensors (docs/serving.md, "numpy 2 and DLPack"). Outputs leave as host_dlpack's
# capsules over numpy's memory.


def check_loaded(parameters: dict[str, str], artifact_dir: Path) -> str:
    """The version label of the artifacts a model instance loads, checked against what its
    config states (an ``artifact_dir`` overridden by $PHOENIX_ARTIFACT_DIR could differ): the
    config digest, which clients trust, and the version label, which metrics carry."""
    stated = parameters.get(CONFIG_DIGEST.name, "")
    if stated and (loaded := config_digest(artifact_dir)) != stated:
        raise ArtifactMismatch(
            f"the config states artifacts of config digest {short(stated)} "
            f"({parameters.get(ARTIFACT_DIR.name)}), but {artifact_dir} has {short(loaded)}"
        )
    version = artifact_version(artifact_dir)
    stated = parameters.get(ARTIFACT_VERSION.name, "")
    if stated and stated != version:
        raise ArtifactMismatch(
            f"the config states artifacts of version {stated} "
            f"({parameters.get(ARTIFACT_DIR.name)}), but {artifact_dir} is version {version}"
        )
    return version


def input_array(tensor) -> np.ndarray:
    """A request tensor as a numpy array (a view of Triton's buffer while on the host)."""
    if tensor.is_cpu():
        return np.from_dlpack(tensor)
    import jax.dlpack  # a GPU-resident input, e.g. from a GPU model of an ensemble

    return np.asarray(jax.dlpack.from_dlpack(tensor))


def request_arrays(request) -> dict[str, np.ndarray]:
    """{input name: array} of one request."""
    return {tensor.name(): input_array(tensor) for tensor in request.inputs()}


def opened_program_stores() -> list:
    """The program stores this process opened; none, and JAX never imported, in a stub of a
    host-only model (services: why those never load it)."""
    programs = sys.modules.get("phoenix.engine.programs")
    return programs.ProgramStore.opened() if programs else []


class ServiceModel:
    """Triton Python-backend model delegating to the service of ``service_name``."""

    service_name = ""
    service: Optional[Service]  # from initialize to finalize

    def initialize(self, args: Mapping[str, str]) -> None:
        # Start-up makes nearly all of the stub's objects, and they live as long as it does
        # (JAX's modules, the programs, the corpus): the collector's passes over them during
        # start-up cost a JAX instance 0.13-0.16 CPU-s of its 2. So none run until it is
        # ready, and what it made is frozen out of every later pass (collections while
        # serving walk only what requests allocate). The cost: the 1.4-1.8 thousand objects
        # start-up leaves in reference cycles stay (one pass to free them costs 0.11 s), and
        # a start-up object that later ends in a cycle is never collected; reference counting
        # still frees every other one.
        gc.disable()
        try:
            self._initialize(args)
        finally:
            gc.freeze()
            gc.enable()

    def _initialize(self, args: Mapping[str, str]) -> None:
        configure_jax_environment(
            args.get("model_instance_kind", "CPU"), args.get("model_instance_device_id", "0")
        )
        import triton_python_backend_utils as pb_utils

        from phoenix.schema import served
        from phoenix.stub.registry import register_stub
        from phoenix.stub.services.catalog import build_service
        from phoenix.stub.services.common import ServiceSettings

        self.pb = pb_utils
        contract = served.contract(self.service_name)
        self.output_dtypes = {s.name: s.dtype for s in contract.outputs}
        started = time.perf_counter()
        config = json.loads(args["model_config"])
        settings = ServiceSettings.from_model_config(
            self.service_name, config, args["model_repository"]
        )
        # the served config must tell the truth about the artifacts (clients trust it)
        version = check_loaded(settings.parameters, settings.artifact_dir)
        served_as = args.get("model_name", self.service_name)  # ranker__next in a rollout
        self.service = build_service(settings)
        self.service.warm_up()
        # Metrics only once the instance will serve: an instance that fails to initialize
        # (a refused reload) leaves no series behind (request_metrics: why series are per stub)
        # every series names the model as served (ranker__next in a rollout) and its version
        self.metrics = RequestMetrics(pb_utils, served_as, version, contract.input_names)
        self.served = ServedMetrics(pb_utils, served_as, version, contract.output_names)
        corpus = getattr(self.service, "corpus", None)  # the retriever's, the policy's, chain's
        self.corpus_metrics = CorpusMetrics(pb_utils, served_as, version, corpus)
        prefix_cache = getattr(self.service, "prefix_cache", None)  # the ranker's, chain's
        self.cache_metrics = PrefixCacheMetrics(pb_utils, served_as, version, prefix_cache)
        stores = opened_program_stores()  # the service's (none for a host-only model)
        logger.warning(
            "%s ready in %.1f s: artifacts %s; programs %d loaded, %d compiled (store %s)",
            args.get("model_instance_name", self.service_name),
            time.perf_counter() - started,
            settings.artifact_dir,
            sum(s.counts["loaded"] for s in stores),
            sum(s.counts["compiled"] for s in stores),
            ", ".join(str(s.directory) for s in stores) or "none",
        )
        register_stub(args)  # so the supervisor can tell this process from the others
        self.profile = StubProfile.from_environment(
            args.get("model_instance_name", self.service_name)
        )

    def execute(self, requests):
        if self.profile is None:  # the usual case: nothing more on the request path
            return self._execute(requests)
        with self.profile.execution(len(requests)):
            return self._execute(requests)

    def _execute(self, requests):
        try:
            assert self.service is not None  # Triton sends no batch after finalize
            results = self.service.handle([request_arrays(request) for request in requests])
        except Exception as error:  # never crash the stub: report the batch as failed
            logger.exception("%s: batch failed", self.service_name)
            results = [RuntimeError(f"{type(error).__name__}: {error}")] * len(requests)
        answered = [result for result in results if not isinstance(result, Exception)]
        outputs = [(a, self.output_dtypes[name]) for r in answered for name, a in r.items()]
        buffers = iter(host_buffers(outputs))
        responses = [self._response(result, buffers) for result in results]
        self.served.count(answered)
        self.corpus_metrics.update()  # the generation this batch was answered from
        self.cache_metrics.update()
        return responses

    def _response(self, result, buffers):
        """The response to one request; ``buffers`` yields its outputs' host buffers in order."""
        pb = self.pb
        if isinstance(result, Exception):
            if isinstance(result, InputError):  # the request's fault, not the server's
                self.metrics.count_refused(result.input)
                code = pb.TritonError.INVALID_ARG
            else:
                self.metrics.count_failed()
                code = pb.TritonError.INTERNAL
            error = pb.TritonError(str(result), code)
            return pb.InferenceResponse(output_tensors=[], error=error)
        tensors = [pb.Tensor.from_dlpack(name, next(buffers)) for name in result]
        return pb.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        profile = getattr(self, "profile", None)  # None: initialize failed before it
        if profile is not None:
            saved = profile.save()
            if saved is not None:
                logger.warning("%s: profile of its executions in %s", profile.instance, saved)
        self.service = None
        for name in ("metrics", "served", "corpus_metrics", "cache_metrics"):
            counters = getattr(self, name, None)
            if counters is not None:  # None: initialize failed before it made them
                counters.close()
        # The stub process exits next. Its interpreter's shutdown would walk every object the
        # instance made (JAX, programs, the corpus) for cycles: 0.5 s of CPU per stub, 14
        # stubs per CPU server, in each unload, rollout and stop. Frozen objects are skipped.
        gc.freeze()
