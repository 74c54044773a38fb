"""Roll a running server from the artifacts it serves (version N) to another directory
(version N+1) with no failed request, and back (docs/rollout.md).

The server runs with ``--model-control-mode=explicit``; every step is a load or an unload
through the model repository API (with the admin key when it is restricted):

1. **gate**: ``NEW_DIR/gate.json`` saying ``"passed": false`` refuses the rollout unless forced.
2. **load N+1 beside N**: each step of ``recommend`` that reads artifacts is loaded again under
   the name ``<model>__next``, from a folder written complete into the server's model
   repository (config naming NEW_DIR, model.py and its bytecode) and never touched while loaded:
   an ensemble's steps must be in a repository, and Triton reloads a step whose folder changed
   since its load.
3. **shadow** (optional): N's chain and N+1's (``recommend_chain`` and
   ``recommend_chain__next``) answer the same requests with their side effects off (the chain's
   ``record`` 0: nothing marked served, nothing logged); rank agreement and score deltas are
   reported (``rank_agreement``). N serves the users meanwhile.
4. **switch**: ``recommend`` is loaded with its steps renamed to the ``__next`` models: one
   ensemble load, every step already loaded and warm.
5. **by-name models**: each model users call by name (``ranker``, ``retriever``, ...) is loaded
   again with N+1's config; Triton answers with N until N+1 is ready. ``recommend`` is then
   switched back onto these names (N+1 now), so names never change between rollouts.
6. **drain and unload**: the ``__next`` models are unloaded once their inference counts stop
   moving.

The report (JSON) keeps every config served before the rollout: ``rollback`` loads them again
the same way, so version N answers exactly as before.
"""

from __future__ import annotations

import contextlib
import copy
import json
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.serving.admin_key import admin_headers
from phoenix.serving.client import infer
from phoenix.serving.contracts import ARTIFACT_DIGEST, ARTIFACT_DIR, CORPUS_FILE, RECOMMEND
from phoenix.serving.inprocess import server_model_config
from phoenix.serving.rank_agreement import compare_rankings, summarize
from phoenix.serving.served_artifacts import (
    artifact_digest,
    artifact_version,
    precompile_model_files,
    servable_artifact_dir,
)
from phoenix.serving.supervisor.state import NEXT_SUFFIX

GATE_FILE = "gate.json"
# What a shadow request adds to recommend's: the chain's flag that turns its side effects off.
QUIET = {"record": np.zeros((1, 1), np.int8)}
# Shadowed besides the chain when it is rolled: the ranker alone, on the same candidates.
SHADOW_RANKER = "ranker"
# The model file of a model loaded under another name: the adapter of the same service.
MODEL_FILE = '''"""Triton entry point of {name!r}, loaded by phoenix.serving.rollout."""

from phoenix.serving.triton_adapter import ServiceModel


class TritonPythonModel(ServiceModel):
    service_name = {service!r}
'''
# The stand-in that clears a failed load's mark on Triton's readiness (Server.clear_failed).
STAND_IN_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input {{ name: "unused" data_type: TYPE_INT8 dims: 1 }}
output {{ name: "nothing" data_type: TYPE_INT8 dims: 1 }}
"""
STAND_IN_MODEL = '''"""A stand-in: phoenix.serving.rollout loads it to clear a failed load."""


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


class GateRefused(RolloutError):
    """The new version lost its offline gate (``gate.json``: ``"passed": false``)."""


# ----------------------------------------------------------------------------------------
# The gate
# ----------------------------------------------------------------------------------------


def read_gate(new_dir: Path) -> Optional[dict[str, Any]]:
    """``new_dir/gate.json`` as written by the training side, None when there is none;
    RolloutError naming the file when it is not JSON or its ``passed`` is not true/false."""
    path = Path(new_dir) / GATE_FILE
    if not path.is_file():
        return None
    try:
        gate = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RolloutError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(gate, dict) or not isinstance(gate.get("passed"), bool):
        raise RolloutError(
            f'{path}: expected an object with "passed": true or false, found {gate!r:.200}'
        )
    return gate


def check_gate(new_dir: Path, force: bool, say: Callable[[str], None]) -> Optional[dict]:
    """The gate of ``new_dir`` (None: none); GateRefused when it failed and not ``force``."""
    gate = read_gate(new_dir)
    path = Path(new_dir) / GATE_FILE
    if gate is None:
        say(f"warning: {path} does not exist: no offline gate checked this version")
    elif not gate["passed"]:
        # whatever the gate recorded beside its verdict: the rule and both versions' figures
        figures = json.dumps({k: v for k, v in gate.items() if k != "passed"}, sort_keys=True)
        if not force:
            raise GateRefused(
                f"{path} says the version failed its offline gate ({figures:.500}); "
                "--force rolls it out anyway"
            )
        say(f"warning: {path} says the gate failed ({figures:.500}); forced")
    return gate


# ----------------------------------------------------------------------------------------
# Configs (Triton's JSON form, as GET /v2/models/<m>/config answers)
# ----------------------------------------------------------------------------------------


def parameter(config: Mapping[str, Any], name: str) -> str:
    return config.get("parameters", {}).get(name, {}).get("string_value", "")


def reads_artifacts(config: Mapping[str, Any]) -> bool:
    return ARTIFACT_DIR.name in config.get("parameters", {})


def retargeted(
    config: Mapping[str, Any], artifact_dir: Path, digest: str, name: Optional[str] = None
) -> dict[str, Any]:
    """A copy of a model's ``config`` reading ``artifact_dir`` (stated with its ``digest``),
    under ``name`` when given; its other parameters as they are."""
    new = copy.deepcopy(dict(config))
    parameters = new.setdefault("parameters", {})
    parameters[ARTIFACT_DIR.name] = {"string_value": ARTIFACT_DIR.text(Path(artifact_dir))}
    parameters[ARTIFACT_DIGEST.name] = {"string_value": ARTIFACT_DIGEST.text(digest)}
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
    ``service``'s adapter, its bytecode beside it (so loading writes nothing there)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    name = config["name"]
    folder = Path(repository) / name
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "1").mkdir(parents=True)
    message = json_format.ParseDict(config, model_config_pb2.ModelConfig())
    header = f"# {name}: {service} loaded beside it by phoenix.serving.rollout\n"
    (folder / "config.pbtxt").write_text(header + text_format.MessageToString(message))
    (folder / "1" / "model.py").write_text(MODEL_FILE.format(name=name, service=service))
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


@dataclass
class Timeline:
    """What happened when, in seconds from the start (the report's ``timeline``)."""

    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    events: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, event: str, **detail: Any) -> None:
        at = round(time.monotonic() - self.started, 3)
        self.events.append({"t_s": at, "event": event, **detail})
        extra = " ".join(f"{k}={v}" for k, v in detail.items())
        self.say(f"[{at:7.2f} s] {event}{' ' + extra if extra else ''}")


def say_to_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


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
        """Triton 2.51 keeps its server readiness false after a model's load failed, even once
        the model is unloaded and its folder gone, until a load of that name succeeds: a
        stand-in (a Python model that computes nothing) is loaded under the name, then
        unloaded (docs/rollout.md, "A version that fails to load")."""
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


# ----------------------------------------------------------------------------------------
# The rollout
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the server serves now (``previous``: every config the rollout changes) and what
    it will serve (``target``: the same models' configs afterwards)."""

    previous: dict[str, dict[str, Any]]
    target: dict[str, dict[str, Any]]
    ensemble: str = RECOMMEND.name

    @property
    def models(self) -> list[str]:
        """The models that read artifacts, in the order they are loaded."""
        return [m for m in self.target if m != self.ensemble]

    @property
    def steps(self) -> list[str]:
        """The rolled models that ``recommend`` calls."""
        return [m for m in step_models(self.previous[self.ensemble]) if m in self.target]

    @property
    def shadowed(self) -> list[str]:
        """The models loaded beside for a shadow comparison: the steps, and the ranker alone
        when it is rolled (its rankings compared on the same candidates)."""
        extra = [SHADOW_RANKER] if SHADOW_RANKER in self.models else []
        return list(dict.fromkeys(self.steps + extra))


def served_configs(server: Server) -> dict[str, dict[str, Any]]:
    """The config of ``recommend`` and of every ready model reading artifacts (not the
    leftovers of an interrupted rollout)."""
    models = [m for m in server.ready_models() if NEXT_SUFFIX not in m]
    configs = {m: server.config(m) for m in models}
    if RECOMMEND.name not in configs:
        raise RolloutError(f"the server has no {RECOMMEND.name!r} loaded")
    rolled = {m: c for m, c in configs.items() if reads_artifacts(c)}
    return {RECOMMEND.name: configs[RECOMMEND.name], **rolled}


def forward_plan(server: Server, new_dir: Path) -> Plan:
    """N (what is served) to the artifacts ``new_dir``, every other parameter kept; refused
    before anything is loaded when ``new_dir`` lacks the corpus N serves."""
    new_dir = servable_artifact_dir(new_dir)
    digest = artifact_digest(new_dir)
    previous = served_configs(server)
    check_corpus(previous, new_dir)
    target = {
        m: c if m == RECOMMEND.name else retargeted(c, new_dir, digest) for m, c in previous.items()
    }
    return Plan(previous, target)


def check_corpus(configs: Mapping[str, Mapping[str, Any]], new_dir: Path) -> None:
    """RolloutError unless every corpus the served models read (``corpus_file``, inside the
    artifacts) is in ``new_dir`` too: a corpus is embedded by its version's candidate tower, so
    N's store cannot serve N+1's user tower; N+1 needs its own, under the same name."""
    missing = sorted(
        {
            name
            for config in configs.values()
            if (name := parameter(config, CORPUS_FILE.name)) and not (Path(new_dir) / name).exists()
        }
    )
    if missing:
        readers = sorted(m for m, c in configs.items() if parameter(c, CORPUS_FILE.name))
        raise RolloutError(
            f"the served corpus {', '.join(map(repr, missing))} (read by {', '.join(readers)}) "
            f"is not in {new_dir}: a corpus is embedded by its version's candidate tower, so "
            f"the new version needs its own under that name (phoenix-build-corpus --artifacts "
            f"{new_dir} ...); nothing was loaded"
        )


def rollback_plan(server: Server, report: Mapping[str, Any]) -> Plan:
    """Back to the configs a rollout's ``report`` saved (what was served before it)."""
    saved = report.get("previous_configs")
    if not saved or RECOMMEND.name not in saved:
        raise RolloutError("the report holds no previous_configs to roll back to")
    return Plan(served_configs(server), dict(saved))


def describe(configs: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Which artifacts a set of configs reads (the first model that reads any)."""
    for config in configs.values():
        if reads_artifacts(config):
            directory = parameter(config, ARTIFACT_DIR.name)
            return {"artifact_dir": directory, "version": version_here(directory)}
    return {}


def version_here(directory: str) -> str:
    """The artifacts' version label; "unknown" when this machine cannot read them."""
    try:
        return artifact_version(directory)
    except Exception:  # ArtifactError, config errors: a directory the server has, not us
        return "unknown"


def shadow(
    server: Server,
    plan: Plan,
    requests: Sequence[Mapping[str, np.ndarray]],
    seconds: float,
    log: Timeline,
) -> dict[str, Any]:
    """N and N+1 answer the same ``requests`` (cycled for ``seconds``, each at least once):
    each version's chain, called by name with its side effects off (``QUIET``); the rankings'
    agreement, per request and summed up. With the ranker rolled, both rankers also rank N's
    feed (the same candidates): rankings told apart from retrieval."""
    (chain,) = plan.steps  # recommend calls one model: the chain
    old_model, new_model = chain, chain + NEXT_SUFFIX
    log("shadow", base=old_model, next=new_model)
    feeds, rankers = [], []
    deadline, sent = time.monotonic() + seconds, 0
    while sent < len(requests) or time.monotonic() < deadline:
        request = requests[sent % len(requests)]
        quiet = {**request, **QUIET}
        old, new = server.infer(old_model, quiet), server.infer(new_model, quiet)
        feeds.append(compare_feeds(old, new))
        if SHADOW_RANKER in plan.shadowed and "history_post_ids" in request:
            arrays = ranker_request(request, old)
            old_ranks, new_ranks = (
                server.infer(name, arrays) for name in (SHADOW_RANKER, SHADOW_RANKER + NEXT_SUFFIX)
            )
            rankers.append(compare_feeds(old_ranks, new_ranks))
        sent += 1
    result = {"recommend": summarize(feeds), "ranker": summarize(rankers) if rankers else None}
    log("shadow done", requests=sent, **{
        f"recommend_{k}": round(v, 4) for k, v in result["recommend"].items() if k != "requests"
    })  # fmt: skip
    return result


def compare_feeds(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray]) -> dict:
    """Row 0 of two answers (ranked_post_ids, scores) compared."""
    return compare_rankings(
        old["ranked_post_ids"][0], old["scores"][0], new["ranked_post_ids"][0], new["scores"][0]
    )


RANKER_HISTORY = (
    "user_id",
    "history_post_ids",
    "history_author_ids",
    "history_actions",
    "history_product_surface",
    "history_dwell_seconds",
)


def ranker_request(request: Mapping[str, np.ndarray], feed: Mapping[str, np.ndarray]) -> dict:
    """The ranker's request for the user of ``request`` and the posts of ``feed``."""
    arrays = {name: request[name] for name in RANKER_HISTORY if name in request}
    arrays["candidate_post_ids"] = feed["ranked_post_ids"][:1]
    arrays["candidate_author_ids"] = feed["ranked_author_ids"][:1]
    return arrays


def switch(server: Server, plan: Plan, log: Timeline) -> None:
    """recommend onto the __next steps, the by-name models onto the target, recommend back
    onto the by-name models (now the target)."""
    ensemble = plan.ensemble
    nexts = {m: m + NEXT_SUFFIX for m in plan.steps}
    server.load(ensemble, with_step_models(plan.target[ensemble], nexts))
    log("switched", model=ensemble, steps=",".join(nexts.values()))

    def load(model: str) -> None:
        server.load(model, plan.target[model])
        log("loaded", model=model, artifact_dir=parameter(plan.target[model], ARTIFACT_DIR.name))

    server.each(load, plan.models)
    server.load(ensemble, plan.target[ensemble])
    log("switched", model=ensemble, steps=",".join(step_models(plan.target[ensemble])))


def roll(
    server: Server,
    plan: Plan,
    shadow_requests: Sequence[Mapping[str, np.ndarray]] = (),
    shadow_seconds: float = 0.0,
    say: Callable[[str], None] = say_to_stderr,
) -> dict[str, Any]:
    """Carry out ``plan`` (steps 2 to 6 of the module's doc); returns the report. A failure
    before the switch unloads what it loaded (the server serves N as before)."""
    log = Timeline(say)
    log("start", previous=describe(plan.previous), target=describe(plan.target))
    # an interrupted rollout's __next models, but those recommend calls now (rolled back here)
    server.retire_leftovers(step_models(server.config(plan.ensemble)), log)
    loaded: list[str] = []
    try:

        def load_beside(model: str) -> None:
            log("loaded", model=server.load_beside(model, plan.target[model], loaded))

        server.each(load_beside, plan.shadowed if shadow_requests else plan.steps)
        shadowed = None
        if shadow_requests:
            shadowed = shadow(server, plan, shadow_requests, shadow_seconds, log)
    except BaseException:
        server.discard(list(loaded))
        raise
    try:
        switch(server, plan, log)
    except RolloutError as error:
        done = "; ".join(f"{e['event']} {e.get('model', '')}" for e in log.events[-4:])
        raise RolloutError(
            f"{error}. The switch stopped part way (last: {done}): the server may serve both "
            "versions; roll out again or roll back",
            changed=True,
        ) from None

    def retire(name: str) -> None:
        waited = server.drain(name)
        server.unload_beside(name)
        log("unloaded", model=name, drained_s=round(waited, 2))

    server.each(retire, list(loaded))
    server.remove_folders(list(loaded))
    # what an interrupted rollout left that this one did not load (a rollback from its report)
    server.retire_leftovers(step_models(server.config(plan.ensemble)), log)
    log("done")
    return {
        **plan_summary(plan),
        "shadow": shadowed,
        "timeline": log.events,
        "previous_configs": plan.previous,
    }


def plan_summary(plan: Plan) -> dict[str, Any]:
    """Which artifacts and version the plan goes from and to, and the models it loads."""
    return {
        "previous": describe(plan.previous),
        "target": describe(plan.target),
        "models": plan.models,
    }


def write_report(report: Mapping[str, Any], path: Path) -> None:
    """The report as JSON at ``path``, and the shadow's means as Prometheus gauges beside it
    (``path`` with .prom: a node-exporter textfile collector can publish them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True, default=float) + "\n")
    if report.get("shadow"):
        path.with_suffix(".prom").write_text(shadow_metrics(report))


def shadow_metrics(report: Mapping[str, Any]) -> str:
    """phoenix_rollout_shadow_<measure>{compared, from_version, to_version} gauges."""
    labels = 'from_version="{}",to_version="{}"'.format(
        report["previous"].get("version", ""), report["target"].get("version", "")
    )
    lines = []
    for compared, summary in report["shadow"].items():
        for measure, value in (summary or {}).items():
            name = f"phoenix_rollout_shadow_{measure}"
            lines.append(f'{name}{{compared="{compared}",{labels}}} {float(value):.6g}')
    return "\n".join(sorted(lines)) + "\n"
