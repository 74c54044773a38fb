"""Loads, unloads and inferences on a running server through its model repository API (with
the admin key when the API is restricted), and the edits of a served model's config (Triton's
JSON form) that load a model again under another name or from other artifacts.
``phoenix.ops.rollout`` and the loop demo drive a server with it.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.client.client import infer
from phoenix.client.inprocess import server_model_config
from phoenix.ops.admin_key import admin_headers
from phoenix.ops.served_repository import precompile_model_files
from phoenix.ops.supervisor.state import NEXT_SUFFIX
from phoenix.schema.contracts import ARTIFACT_DIR

# The stand-in that clears a failed load's mark on Triton's readiness (Server.clear_failed).
STAND_IN_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input {{ name: "unused" data_type: TYPE_INT8 dims: 1 }}
output {{ name: "nothing" data_type: TYPE_INT8 dims: 1 }}
"""
STAND_IN_MODEL = '''"""A stand-in: phoenix.ops.rollout loads it to clear a failed load."""


class TritonPythonModel:
    def execute(self, requests):
        return []
'''
# A drained model's inference count has not moved for this long.
DRAIN_QUIET_S = 1.0
DRAIN_TIMEOUT_S = 30.0
LOAD_TIMEOUT_S = 600.0


class RolloutError(RuntimeError):
    """A rollout that cannot go on (the message says what the server serves now).
    ``changed``: the server may serve a mix of versions (a switch stopped part way); else it
    serves what it served before."""

    def __init__(self, message: str, changed: bool = False):
        super().__init__(message)
        self.changed = changed


# ----------------------------------------------------------------------------------------
# Configs (Triton's JSON form, as GET /v2/models/<m>/config answers)
# ----------------------------------------------------------------------------------------


def parameter(config: Mapping[str, Any], name: str) -> str:
    return config.get("parameters", {}).get(name, {}).get("string_value", "")


def reads_artifacts(config: Mapping[str, Any]) -> bool:
    return ARTIFACT_DIR.name in config.get("parameters", {})


def retargeted(
    config: Mapping[str, Any], stated: Mapping[str, str], name: Optional[str] = None
) -> dict[str, Any]:
    """A copy of a model's ``config`` reading the artifacts ``stated`` describes
    (``served_repository.stated_artifacts``: directory, version label, config digest), under
    ``name`` when given; its other parameters as they are."""
    new = copy.deepcopy(dict(config))
    parameters = new.setdefault("parameters", {})
    parameters.update({key: {"string_value": value} for key, value in stated.items()})
    if name is not None:
        new["name"] = name
    return new


def renamed(config: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A copy of ``config`` under ``name``, its instance groups unnamed (Triton names them
    after the model: two models' instances of one name trip the Python backend's unload)."""
    new = copy.deepcopy(dict(config))
    new["name"] = name
    for group in new.get("instance_group", []):
        group.pop("name", None)
    return new


def ensemble_steps(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    steps = config.get("ensemble_scheduling", {}).get("step")
    if not steps:
        raise RolloutError(f"{config.get('name')!r} is no ensemble (no ensemble_scheduling)")
    return steps


def step_models(config: Mapping[str, Any]) -> list[str]:
    return [step["model_name"] for step in ensemble_steps(config)]


def with_step_models(
    config: Mapping[str, Any], models: Mapping[str, str], name: Optional[str] = None
) -> dict[str, Any]:
    """A copy of the ensemble ``config`` whose steps call ``models[step model]`` (steps not in
    ``models`` as they are), under ``name`` when given."""
    new = renamed(config, name or config["name"])
    for step in ensemble_steps(new):
        step["model_name"] = models.get(step["model_name"], step["model_name"])
    return new


# ----------------------------------------------------------------------------------------
# The server
# ----------------------------------------------------------------------------------------


def write_model_folder(repository: Path, service: str, config: Mapping[str, Any]) -> Path:
    """``repository/<config name>/``: ``config`` as config.pbtxt and version 1 running
    ``service``'s model.py (copied from ``repository/<service>/1/``), its bytecode beside it
    (so loading writes nothing there)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    name = config["name"]
    folder = Path(repository) / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    header = f"# {name}: {service} loaded beside it by phoenix.ops.rollout\n"
    (folder / "config.pbtxt").write_text(header + text_format.MessageToString(message))
    # the service's own entry point, as the repository serves it under the service's name
    shutil.copyfile(Path(repository) / service / "1" / "model.py", folder / "1" / "model.py")
    precompile_model_files(folder)
    return folder


def model_states(client, protocol: str, headers=None) -> dict[str, str]:
    """{model: state} of the repository index (READY, UNAVAILABLE, ...): a restricted API, so
    ``headers`` carry the admin key when the server has one."""
    kwargs = {"as_json": True} if protocol == "grpc" else {}
    index = client.get_model_repository_index(headers=headers, **kwargs)
    entries = index.get("models", []) if isinstance(index, dict) else index
    return {e["name"]: e.get("state", "") for e in entries}


def inference_count(client, protocol: str, model: str) -> int:
    """Requests the model has answered, all its versions together (0 when not loaded)."""
    kwargs = {"as_json": True} if protocol == "grpc" else {}
    try:
        stats = client.get_inference_statistics(model, **kwargs)
    except Exception:  # tritonclient raises its own types: an unloaded model has none
        return 0
    return sum(int(s.get("inference_count", 0)) for s in stats.get("model_stats", []))


class Server:
    """The loads, unloads and inferences a rollout makes on one server, whose model repository
    is the folder ``repository`` (the one tritonserver's --model-repository names)."""

    def __init__(self, client, protocol: str, admin_key: Optional[str], repository: Path):
        self.client, self.protocol = client, protocol
        self.headers = admin_headers(admin_key, protocol)
        self.repository = Path(repository)
        if not self.repository.is_dir():
            raise RolloutError(f"the model repository {self.repository} is no folder here")

    def config(self, model: str) -> dict[str, Any]:
        return server_model_config(self.client, self.protocol, model)

    def states(self) -> dict[str, str]:
        """{model: state} of the server's repository index."""
        return model_states(self.client, self.protocol, self.headers)

    def state(self, model: str) -> str:
        return self.states().get(model, "UNAVAILABLE")

    def ready_models(self) -> list[str]:
        return sorted(m for m, state in self.states().items() if state == "READY")

    def load(
        self, name: str, config: Optional[Mapping[str, Any]], files: Optional[dict] = None
    ) -> None:
        """Load ``name`` (with ``config`` as override when given); RolloutError unless it is
        then ready."""
        text = json.dumps(config) if config is not None else None
        try:
            self.client.load_model(name, headers=self.headers, config=text, files=files)
        except Exception as error:
            raise RolloutError(f"loading {name} failed: {error}") from None
        if not self.client.is_model_ready(name):
            raise RolloutError(f"{name} is not ready after its load")

    def each(self, action: Callable[[str], None], models: Sequence[str]) -> None:
        """``action(model)`` for every model: at once over gRPC (its client may be shared
        between threads; Triton loads models in parallel), one after the other over HTTP.
        Every action runs; the first error is raised after."""
        if self.protocol != "grpc" or len(models) < 2:
            for model in models:
                action(model)
            return
        with ThreadPoolExecutor(len(models), thread_name_prefix="rollout") as pool:
            for future in [pool.submit(action, model) for model in models]:
                future.result()

    def unload(self, name: str) -> None:
        self.client.unload_model(name, headers=self.headers)

    def load_beside(self, model: str, config: Mapping[str, Any], loaded: list[str]) -> str:
        """``config`` of ``model`` loaded as ``<model>__next`` from a folder of its own; its
        name goes into ``loaded`` before the load, so that a load that fails is cleaned up
        with the others (unloaded, its folder removed: a model left UNAVAILABLE in the index
        keeps Triton's readiness false)."""
        name = model + NEXT_SUFFIX
        loaded.append(name)
        write_model_folder(self.repository, model, renamed(config, name))
        self.load(name, None)
        return name

    def discard(self, names: Sequence[str]) -> None:
        """Unload ``names`` whatever state they are in and remove their folders, so none stays
        in the repository index nor keeps Triton unready (a failed load: ``clear_failed``)."""
        failed = [name for name in names if self.failed_load(name)]
        for name in failed:
            self.clear_failed(name)
        for name in names:
            with contextlib.suppress(Exception):  # never loaded, or gone already
                self.unload_beside(name)
        self.remove_folders(names)

    def failed_load(self, name: str) -> bool:
        """Whether ``name``'s last load failed (UNAVAILABLE for another reason than an unload)."""
        kwargs = {"as_json": True} if self.protocol == "grpc" else {}
        index = self.client.get_model_repository_index(headers=self.headers, **kwargs)
        entries = index.get("models", []) if isinstance(index, dict) else index
        for entry in entries:
            if entry["name"] == name:
                return entry.get("state") == "UNAVAILABLE" and entry.get("reason") != "unloaded"
        return False

    def clear_failed(self, name: str) -> None:
        """Triton 2.51 with strict readiness (its default; phoenix-serve turns it off) keeps
        its server readiness false after a model's load failed, even once the model is
        unloaded and its folder gone, until a load of that name succeeds: a stand-in (a
        Python model that computes nothing) is loaded under the name, then unloaded
        (docs/rollout.md, "A version that fails to load")."""
        folder = self.repository / name
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(STAND_IN_CONFIG.format(name=name))
        (folder / "1" / "model.py").write_text(STAND_IN_MODEL)
        self.load(name, None)

    def leftovers(self, keep: Sequence[str]) -> list[str]:
        """``__next`` models an interrupted rollout left (loaded or not), but ``keep``."""
        return sorted(
            m
            for m in {*self.states(), *(p.name for p in self.repository.glob(f"*{NEXT_SUFFIX}"))}
            if m.endswith(NEXT_SUFFIX) and m not in keep
        )

    def retire_leftovers(self, keep: Sequence[str], log: Callable[..., None]) -> None:
        """Unload and remove the leftovers of an interrupted rollout (none that ``keep``
        names: what recommend calls now)."""
        for name in self.leftovers(keep):
            self.discard([name])
            log("removed leftover", model=name)

    def unload_beside(self, name: str) -> None:
        """Unload a model ``load_beside`` loaded and wait until Triton has finished
        (RolloutError when it has not after DRAIN_TIMEOUT_S); ``remove_folders`` then."""
        self.unload(name)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while (state := self.state(name)) not in ("UNAVAILABLE", ""):
            if time.monotonic() > deadline:
                raise RolloutError(
                    f"{name} is still {state} {DRAIN_TIMEOUT_S:g} s after its unload"
                )
            time.sleep(0.1)

    def remove_folders(self, names: Sequence[str]) -> None:
        """The folders of unloaded ``__next`` models. Only once every unload has finished: a
        folder removed while another thread reads the repository index fails that read
        (Triton: "failed to stat file", seen with the unloads in parallel)."""
        for name in names:
            shutil.rmtree(self.repository / name, ignore_errors=True)

    def infer(self, model: str, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return infer(self.client, self.protocol, model, arrays)

    def drain(self, model: str, quiet_s: float = DRAIN_QUIET_S, timeout_s=DRAIN_TIMEOUT_S):
        """Wait until ``model``'s inference count has not moved for ``quiet_s``; returns the
        seconds waited (RolloutError after ``timeout_s``)."""
        started = time.monotonic()
        count, still_since = inference_count(self.client, self.protocol, model), started
        while time.monotonic() - still_since < quiet_s:
            if time.monotonic() - started > timeout_s:
                raise RolloutError(f"{model} still answers requests after {timeout_s:g} s")
            time.sleep(0.1)
            now = inference_count(self.client, self.protocol, model)
            if now != count:
                count, still_since = now, time.monotonic()
        return time.monotonic() - started
