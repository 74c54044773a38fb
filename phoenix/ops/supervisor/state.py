"""Each served model's state (healthy, dead, reloading, failed, given up, unloaded by an
operator), the reloads, and what /ready answers (docs/reliability.md, "The supervisor")."""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from phoenix.ops.supervisor.admin import TritonAdmin, TritonAPIError
from phoenix.stub.registry import StubProcess, list_stubs

logger = logging.getLogger("phoenix.supervisor")

POLL_S = 0.25
LOAD_TIMEOUT_S = 600.0
# /ready asks Triton's repository index, which answers only once a model being loaded is
# loaded: a probe during a reload (seconds) timed out in a test client's 2 s. It waits at most
# this long, then answers 503 with what the supervisor knows itself (the model it reloads).
READINESS_TRITON_TIMEOUT_S = 1.0
MAX_BACKOFF_S = 60.0
DEFAULT_MAX_FAILED_RELOADS = 6  # 1 + 2 + 4 + 8 + 16 + 32 s of back-off, then give up
HEALTHY, DEAD, RELOADING, FAILED = "healthy", "dead", "reloading", "failed"
GAVE_UP, UNLOADED = "gave_up", "unloaded"
OPERATOR_UNLOAD_REASON = "unloaded"  # only a key holder can unload: an operator meant it
RESTART_PARAMETER = "phoenix_supervisor_restart"
# A model loaded beside its namesake for a while (phoenix.ops.rollout's N+1 copies): watched
# and healed while loaded, forgotten once unloaded, since its unload is planned, not an outage;
# a reason for /ready only while a served ensemble calls it (``served_models``).
NEXT_SUFFIX = "__next"
REASONS = {
    DEAD: "is dead (its stub died or its load failed); reloading",
    RELOADING: "is reloading",
    FAILED: "failed to reload; retrying",
    GAVE_UP: "failed to reload too often; load it by hand",
    UNLOADED: "was unloaded by an operator",
}


def iso_time(epoch_s: float) -> str:
    """A wall-clock time as operators read it: ISO 8601, UTC, milliseconds."""
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds")


def is_transient(model: str) -> bool:
    """A rollout's copy loaded beside its namesake (``NEXT_SUFFIX``)."""
    return model.endswith(NEXT_SUFFIX)


def has_stubs(config: Mapping) -> bool:
    """Python-backend models run in stubs; ensembles and other backends do not."""
    return config.get("backend") == "python"


def expected_instances(config: Mapping) -> set[str]:
    """Instance names Triton gives a model's instances: '<group name>_<index>'."""
    names: set[str] = set()
    for index, group in enumerate(config.get("instance_group") or []):
        group_name = group.get("name") or f"{config['name']}_{index}"
        names.update(f"{group_name}_{i}" for i in range(int(group.get("count", 1))))
    return names


def composing_models(config: Mapping) -> set[str]:
    """The models an ensemble's steps call (empty for other models)."""
    steps = (config.get("ensemble_scheduling") or {}).get("step") or []
    return {step["model_name"] for step in steps if step.get("model_name")}


def unhealthy(model: str, state: str, detail: str) -> str:
    """/ready's reason for a model the supervisor does not hold healthy."""
    text = f"model {model} {REASONS[state]}"
    return f"{text}: {detail}" if detail else text


def with_restart_marker(config: Mapping, marker: str) -> dict:
    """A copy of `config` with the restart marker set to `marker`: only a changed config makes a
    load start a new copy of the model (and new stubs)."""
    override = copy.deepcopy(dict(config))
    parameters = override.get("parameters") or {}
    override["parameters"] = {**parameters, RESTART_PARAMETER: {"string_value": marker}}
    return override


def served_models(models: Mapping[str, tuple[str, str, set[str]]]) -> set[str]:
    """The models requests reach, of ``models`` ({model: (state, detail, composing)}): every
    model clients call by name, and what a served ensemble's steps call, transitively (a
    rollout's ``__next`` copy only while ``recommend`` calls it, between its two switches)."""
    served = {model for model in models if not is_transient(model)}
    unvisited = sorted(served)
    while unvisited:
        for step in models.get(unvisited.pop(), ("", "", set()))[2] - served:
            served.add(step)
            unvisited.append(step)
    return served


def readiness_reasons(
    models: Mapping[str, tuple[str, str, set[str]]],
    index: Mapping[str, tuple[str, str]],
    watched: set[str],
) -> list[str]:
    """Why the served models (``served_models``) cannot all answer now, from what the
    supervisor holds (``models``: {model: (state, detail, composing)}, ``watched``: the models
    its last process watch checked) and Triton's repository ``index`` ({model: (state,
    reason)}); [] when they can. A model loaded or unloaded beside the served ones (a
    rollout's ``__next`` copy no ensemble calls) is no reason: requests never reach it."""
    served = served_models(models)
    ready = {m for m, (state, _) in index.items() if state == "READY"}
    reasons = [
        f"model {m} is not watched by the supervisor yet"
        for m in sorted(ready - watched)
        if not is_transient(m)
    ]
    down = set()
    for model in sorted(served):
        state, detail, _ = models.get(model, (HEALTHY, "", set()))
        triton_state, reason = index.get(model, ("", "missing from the repository index"))
        if state != HEALTHY:
            reasons.append(unhealthy(model, state, detail))
        elif triton_state == "UNAVAILABLE" and reason == OPERATOR_UNLOAD_REASON:
            reasons.append(f"model {model} {REASONS[UNLOADED]}")
        elif triton_state != "READY":
            text = f"model {model} is {triton_state or 'absent'}"
            reasons.append(f"{text}: {reason}" if reason else text)
        else:
            continue
        down.add(model)
    for model, (_, _, composing) in models.items():
        if model in served and model not in down and composing & down:
            reasons.append(f"model {model} needs {', '.join(sorted(composing & down))}")
    return reasons


@dataclass
class ModelState:
    """What the supervisor knows about one served model."""

    config: dict = field(default_factory=dict)
    state: str = HEALTHY
    restarts: int = 0
    failed_reloads: int = 0
    next_attempt: float = 0.0
    backoff_s: float = 1.0
    detail: str = ""

    @property
    def instances(self) -> set[str]:
        return expected_instances(self.config) if has_stubs(self.config) else set()

    @property
    def composing(self) -> set[str]:
        return composing_models(self.config)

    def summary(self) -> dict:
        names = {"instances": sorted(self.instances), "composing": sorted(self.composing)}
        return {"state": self.state, "restarts": self.restarts, "detail": self.detail, **names}


class Supervisor:
    """Watch the models of the tritonserver `server_pid` (a `TritonServer`), reload those that
    died, report honest readiness; `events` is for tests and /status.

    `clock` (monotonic) times back-offs and reloads, so a wall-clock step cannot stretch or cut
    them; `wall_clock` (seconds since the epoch) dates the events an operator reads."""

    def __init__(
        self,
        http_url: str,
        server_pid: int,
        *,
        admin_key: str | None = None,
        max_failed_reloads: int = DEFAULT_MAX_FAILED_RELOADS,
        admin: TritonAdmin | None = None,
        stub_lister: Callable[[int], list[StubProcess]] = list_stubs,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        degraded_by: Sequence[Callable[[], str | None]] = (),
    ):
        self.admin = admin or TritonAdmin(http_url, admin_key)
        # What some requests need besides Triton (the user-state store, for by-id requests):
        # each returns why it is not usable, or None. /ready names the reasons as `degraded`
        # but stays ready: every replica shares the store, so pulling replicas would not bring
        # it back and would refuse the requests that carry their own history too.
        self.degraded_by = tuple(degraded_by)
        self.server_pid = server_pid
        self.max_failed_reloads = max_failed_reloads
        self.list_stubs = stub_lister
        self.clock = clock
        self.wall_clock = wall_clock
        self.models: dict[str, ModelState] = {}
        self.known_pids: dict[int, str] = {}
        self.watched: set[str] = set()  # models whose stubs the last process watch checked
        self.events: list[dict] = []
        self.draining = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self, event: str, model: str = "", **details) -> None:
        entry = {"time": iso_time(self.wall_clock()), "event": event, "model": model, **details}
        with self._lock:
            self.events.append(entry)
            del self.events[:-200]  # bounded: a flapping model must not grow memory
        logger.warning("supervisor: %s %s %s", event, model, details or "")

    def _set_state(self, model: str, state: str, detail: str = "") -> None:
        with self._lock:
            self.models[model].state, self.models[model].detail = state, detail

    def learn_models(self, index: dict | None = None) -> dict:
        """Learn every READY model of `index` (read now when not given) and its config (an
        operator's unloaded model READY again is healthy again); returns the index."""
        index = self.admin.model_index() if index is None else index
        for model in [m for m, (state, _) in index.items() if state == "READY"]:
            config = self.admin.model_config(model)
            with self._lock:
                entry = self.models.setdefault(model, ModelState())
                entry.config = config
                loaded_again = entry.state == UNLOADED
                if loaded_again:
                    entry.state, entry.detail = HEALTHY, ""
            if loaded_again:
                self._record("loaded", model)
        return index

    def dead_by_process_watch(self) -> set[str]:
        """Healthy models with an instance no live stub serves (an operator's reload starts the
        new stub first); a failed model whose stubs all run again is healthy again."""
        stubs = self.list_stubs(self.server_pid)
        live = {stub.instance for stub in stubs}
        self.known_pids, self.watched = {s.pid: s.instance for s in stubs}, set(self.models)
        dead = set()
        with self._lock:
            for model, entry in self.models.items():
                missing = entry.instances - live
                if entry.state == HEALTHY and missing:
                    dead.add(model)
                elif entry.state in (FAILED, GAVE_UP) and entry.instances and not missing:
                    entry.state, entry.detail, entry.failed_reloads = HEALTHY, "", 0
        return dead

    def check_index(self) -> None:
        """Served models no longer READY: an operator's unload is respected, other losses healed;
        a rollout's ``__next`` model unloaded (or gone from the repository) is forgotten."""
        index = self.admin.model_index()
        for model, entry in list(self.models.items()):
            state, reason = index.get(model, ("", "missing from the repository index"))
            if is_transient(model) and state in ("UNAVAILABLE", ""):
                self.forget(model)
                continue
            if state == "READY" or state in ("LOADING", "UNLOADING") or entry.state != HEALTHY:
                continue
            if state == "UNAVAILABLE" and reason == OPERATOR_UNLOAD_REASON:
                self._set_state(model, UNLOADED)
                self._record("unloaded", model)
            else:
                self._set_state(model, DEAD, f"{state or 'absent'}: {reason}"[:300])
                self._record("dead", model, reason=reason[:300])
        ready = {m for m, (state, _) in index.items() if state == "READY"}
        with self._lock:  # loaded since the last round, or by an operator again: learn them
            new = [m for m in ready if getattr(self.models.get(m), "state", UNLOADED) == UNLOADED]
        if new:
            self.learn_models(index)

    def follow_ensembles(self, ready: set[str]) -> None:
        """Each READY ensemble's config read again (at each /ready): a rollout switches
        ``recommend`` onto other steps (its ``__next`` copies, then the names again) and
        readiness must follow the models requests reach. A config not readable now (the
        ensemble being reloaded or unloaded) is kept until the next read."""
        with self._lock:
            ensembles = [m for m, e in self.models.items() if e.composing and m in ready]
        for model in ensembles:
            try:
                config = self.admin.model_config(model, READINESS_TRITON_TIMEOUT_S)
            except TritonAPIError:
                continue
            with self._lock:
                if model in self.models:
                    self.models[model].config = config

    def forget(self, model: str) -> None:
        """Stop watching ``model`` (a planned unload): no /ready reason, no reload."""
        with self._lock:
            self.models.pop(model, None)
        self._record("forgotten", model)

    def heal(self, model: str) -> None:
        """Reload `model` with its current config (an operator's overrides stay), for a stub model
        plus a new restart marker."""
        entry = self.models[model]
        entry.restarts += 1
        self._set_state(model, RELOADING)
        started = self.clock()
        # The config as loaded now; the last one seen when a failed load left none to read.
        with contextlib.suppress(TritonAPIError):
            entry.config = self.admin.model_config(model)
        config = entry.config
        try:
            if has_stubs(config):
                config = with_restart_marker(config, f"{entry.restarts}@{time.time():.3f}")
            self.admin.load_model(model, config, LOAD_TIMEOUT_S)
        except TritonAPIError as error:
            entry.failed_reloads += 1
            entry.next_attempt = self.clock() + entry.backoff_s
            entry.backoff_s = min(entry.backoff_s * 2, MAX_BACKOFF_S)
            gave_up = entry.failed_reloads >= self.max_failed_reloads
            self._set_state(model, GAVE_UP if gave_up else FAILED, str(error)[:300])
            self._record("gave_up" if gave_up else "reload_failed", model, error=str(error)[:300])
            return
        entry.backoff_s, entry.failed_reloads = 1.0, 0
        self._set_state(model, HEALTHY)
        self._record("reloaded", model, seconds=round(self.clock() - started, 3))
        self.learn_models()
        self.dead_by_process_watch()  # learn the new stub's pid

    def poll_once(self) -> None:
        """One round: detect dead stubs and lost models, then reload what is due."""
        now = self.clock()
        self.check_index()
        if dead := self.dead_by_process_watch():
            # Look again: a stub replaced by an operator's reload is not dead, nor one that
            # stopped because an operator unloads its model (not READY any more).
            ready = {m for m, (state, _) in self.learn_models().items() if state == "READY"}
            dead &= ready & self.dead_by_process_watch()
        for model in sorted(dead):
            self._set_state(model, DEAD)
            self._record("dead", model)
        with self._lock:
            due = [
                model
                for model, entry in sorted(self.models.items())
                if entry.state == DEAD or (entry.state == FAILED and now >= entry.next_attempt)
            ]
        for model in due:
            if self._stop.is_set() or self.draining:
                return
            self.heal(model)

    def readiness(self) -> tuple[bool, list[str]]:
        """(ready, reasons not): every served model (``readiness_reasons``) READY, watched and
        healthy, the watch running, Triton answering and ready, the server not draining."""
        reasons = []
        if self.draining:
            reasons.append("draining: the server is shutting down")
        if self._thread is not None and not self.is_running():
            reasons.append("supervisor loop stopped")
        try:
            index = self.admin.model_index(READINESS_TRITON_TIMEOUT_S)
        except TritonAPIError as error:
            index = None
            reasons.append(f"triton does not answer: {error}")
        if index is not None:
            self.follow_ensembles({m for m, (state, _) in index.items() if state == "READY"})
        with self._lock:
            models = {m: (e.state, e.detail, e.composing) for m, e in sorted(self.models.items())}
            watched = set(self.watched)
        if index is None:  # what the supervisor knows itself (e.g. the model it reloads)
            return False, reasons + [
                unhealthy(model, state, detail)
                for model, (state, detail, _) in models.items()
                if state != HEALTHY and model in served_models(models)
            ]
        reasons += readiness_reasons(models, index, watched)
        # Only Triton saying it is not ready counts: it has just answered the index, so a health
        # check that times out is a busy machine (seen at load average 20 during a rollout's
        # loads), not a server that cannot serve.
        if not reasons and self.admin.ready_status(READINESS_TRITON_TIMEOUT_S) not in (200, None):
            reasons.append("triton is not ready")
        return not reasons, reasons

    def degraded(self) -> list[str]:
        """Why some requests cannot be served now (an unreachable store); [] when all can."""
        return [reason for check in self.degraded_by if (reason := check())]

    def drain(self) -> None:
        """From now on /ready answers 503, so load balancers stop sending new requests."""
        self.draining = True
        self._record("draining")

    def status(self) -> dict:
        ready, reasons = self.readiness()
        with self._lock:
            models = {m: e.summary() for m, e in sorted(self.models.items())}
            events = list(self.events[-50:])
        stub_pids = {str(pid): name for pid, name in sorted(self.known_pids.items())}
        return dict(
            ready=ready, reasons=reasons, degraded=self.degraded(), server_pid=self.server_pid,
            stub_pids=stub_pids, models=models, events=events, time=iso_time(self.wall_clock()),
        )  # fmt: skip

    def run(self) -> None:
        last_error = ""
        while not self._stop.is_set():
            try:
                if not self.draining:  # draining unloads every model on purpose: no healing
                    self.poll_once()
                last_error = ""
            except TritonAPIError as error:  # Triton busy or restarting: try again next round
                if str(error) != last_error:  # once, not four times a second
                    logger.warning("supervisor: %s", error)
                last_error = str(error)
            except Exception:  # never let the watch die silently
                logger.exception("supervisor: poll failed")
            self._stop.wait(POLL_S)

    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def prime(self) -> None:
        """Learn the models and their stubs as they are now (all taken as healthy)."""
        self.learn_models()
        self.dead_by_process_watch()

    def start(self) -> Supervisor:
        self.prime()
        self._thread = threading.Thread(target=self.run, name="phoenix-supervisor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
