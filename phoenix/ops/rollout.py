"""Roll a running server from the artifacts it serves (version N) to another directory
(version N+1) with no failed request, and back (docs/rollout.md).

The server runs with ``--model-control-mode=explicit``; every step is a load or an unload
through the model repository API (with the admin key when it is restricted):

1. **gate**: ``NEW_DIR/gate.json`` saying ``"passed": false`` refuses the rollout unless forced,
   and so does a NEW_DIR whose version label is the served one's (``check_new_version``).
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

import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.checkpoint import load_config
from phoenix.checkpoint.identity import artifact_version, servable_artifact_dir
from phoenix.client.rank_agreement import compare_rankings, summarize
from phoenix.ops.model_control import (
    RolloutError,
    Server,
    parameter,
    reads_artifacts,
    retargeted,
    step_models,
    with_step_models,
)
from phoenix.ops.served_repository import stated_artifacts
from phoenix.ops.supervisor.state import NEXT_SUFFIX
from phoenix.schema.contracts import ARTIFACT_DIR, ARTIFACT_VERSION, CORPUS_FILE
from phoenix.schema.recommend import RECOMMEND

GATE_FILE = "gate.json"
# What a shadow request adds to recommend's: the chain's flag that turns its side effects off.
QUIET = {"record": np.zeros((1, 1), np.int8)}
# Shadowed besides the chain when it is rolled: the ranker alone, on the same candidates.
SHADOW_RANKER = "ranker"


class GateRefused(RolloutError):
    """The new version lost its offline gate (``gate.json``: ``"passed": false``)."""


class SameVersion(RolloutError):
    """The new artifacts carry the version label of the served ones."""


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


def forward_plan(
    server: Server, new_dir: Path, force: bool = False, say: Callable[[str], None] = say_to_stderr
) -> Plan:
    """N (what is served) to the artifacts ``new_dir``, every other parameter kept; refused
    before anything is loaded when ``new_dir`` lacks the corpus N serves, or carries N's
    version label (unless ``force``: ``check_new_version``)."""
    new_dir = servable_artifact_dir(new_dir)
    stated = stated_artifacts(new_dir)
    previous = served_configs(server)
    check_corpus(previous, new_dir)
    check_new_version(describe(previous), new_dir, stated[ARTIFACT_VERSION.name], force, say)
    target = {m: c if m == RECOMMEND.name else retargeted(c, stated) for m, c in previous.items()}
    return Plan(previous, target)


def check_new_version(
    served: Mapping[str, str], new_dir: Path, label: str, force: bool, say: Callable[[str], None]
) -> None:
    """SameVersion when the artifacts ``new_dir`` (version ``label``) carry the version label
    of the ``served`` ones (``describe``), unless ``force`` (then a warning): the metrics, the
    report and a rollback tell versions apart by their labels alone."""
    if label != served.get("version"):
        return
    if load_config(new_dir).version is None:  # a label made of the content: the same content
        why = "the same content as the served artifacts (a copy): nothing would change"
    else:
        why = (
            'the same "version" in config.json: the metrics, the rollout report and a '
            "rollback could not tell the two apart; give the new one a label of its own"
        )
    text = f"{new_dir} is version {label}, the version served ({served.get('artifact_dir')}): {why}"
    if not force:
        raise SameVersion(f"{text}; --force rolls it out anyway; nothing was loaded")
    say(f"warning: {text}; forced")


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
    """Which artifacts a set of configs reads (the first model that reads any): their
    directory and version label (as the config states it, else read here)."""
    for config in configs.values():
        if reads_artifacts(config):
            directory = parameter(config, ARTIFACT_DIR.name)
            version = parameter(config, ARTIFACT_VERSION.name) or version_here(directory)
            return {"artifact_dir": directory, "version": version}
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
    recommend = summarize(feeds)
    result = {"recommend": recommend, "ranker": summarize(rankers) if rankers else None}
    log("shadow done", requests=sent, **{
        f"recommend_{k}": round(v, 4) for k, v in recommend.items() if k != "requests"
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
