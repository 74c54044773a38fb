"""The steps of the loop, in order (``run_loop``; the package's doc says what each does).

A loop that runs as designed ends with its report whatever v2's verdicts are: a v2 that fails
its offline gate is not rolled out (v1 keeps serving and the second phase serves v1 again), a
v2 that loses online is reported as losing. A step that breaks (a server that does not start,
a rollout that fails part way, an export with nothing to export) raises ``LoopError`` or the
step's own error, naming the step and its log.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.loop.options import LoopError, LoopOptions, Progress
from phoenix.loop.processes import (
    ReactingUsers,
    Serving,
    forget_served,
    load_simulated_users,
    simulated_user_ids,
    start_reacting_users,
    start_serving,
)
from phoenix.loop.report import (
    FIRST,
    assemble_report,
    gate_text,
    second_label,
    write_outputs,
)
from phoenix.util.processes import stop_process

# ----------------------------------------------------------------------------------------
# v1 and v2
# ----------------------------------------------------------------------------------------


def train_v1(options: LoopOptions, log: Progress) -> Path:
    """The preset trained with few steps: a version 1 with room to improve."""
    from phoenix.training.pipeline import run_pipeline
    from phoenix.training.presets import PRESETS

    preset = dataclasses.replace(
        PRESETS[options.preset],
        retrieval_steps=options.v1_retrieval_steps,
        ranker_steps=options.v1_ranker_steps,
    )
    out = options.work / "v1"
    run_pipeline(options.preset, out, seed=options.seed, logs_dir=options.work / "logs",
                 evaluate=False, log=log, preset=preset)  # fmt: skip
    return out


def train_v2(options: LoopOptions, redis_url: str, v1: Path, log: Progress):
    """Served logs exported, version 2 trained warm from v1, gate.json; (v2, export, gate)."""
    from phoenix.ops.compile import ensure_programs
    from phoenix.training.retrain import retrain
    from phoenix.training.served_export import export_served_logs

    logs, v2 = options.work / "served-logs", options.work / "v2"
    export = export_served_logs(redis_url, v1, logs, top_n=options.top_n, log=log)
    log(export.text(logs))
    gate = retrain(logs, v1, v2, retrieval_steps=options.v2_retrieval_steps,
                   ranker_steps=options.v2_ranker_steps, log=log)  # fmt: skip
    summary = {k: v for k, v in dataclasses.asdict(export).items() if k != "split"}
    log(f"gate: {gate_text(gate)}")
    reuse_programs(v1, v2, log)
    log("checking v2's programs before its rollout (serve did v1's before it started)")
    ensure_programs(v2, "cpu")
    return v2, summary, gate


def reuse_programs(v1: Path, v2: Path, log: Progress) -> None:
    """v1's compiled programs copied to v2 when it has none: the program store is keyed by the
    shapes, the code and the machine, not the weights (a store of another key is rebuilt),
    so v2 starts without the minutes of compiling v1 took."""
    from phoenix.engine.programs import STORE_DIR

    source, target = v1 / STORE_DIR, v2 / STORE_DIR
    if source.is_dir() and not target.exists():
        shutil.copytree(source, target)
        log(f"copied {source} to {target} (the same shapes: v2 reuses v1's programs)")


# ----------------------------------------------------------------------------------------
# The rollout: the one place that calls phoenix.ops.rollout
# ----------------------------------------------------------------------------------------


def rollout_decision(gate: Mapping, force: bool) -> tuple[bool, str]:
    """(roll v2 out?, why): a v2 that failed its gate is not rolled out unless forced. The
    refusal is an outcome of the loop, not an error: v1 keeps serving."""
    if gate["passed"]:
        return True, "its offline gate passed"
    if force:
        return True, "its offline gate failed, rolled out anyway (--force)"
    return False, "its offline gate failed"


def roll_out(serving: Serving, new_dir: Path, user_ids: np.ndarray, options: LoopOptions,
             say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Roll the server onto ``new_dir`` (gate checked, shadowed on the simulated users' feed
    requests for ``options.shadow_seconds``, switched, the old version unloaded); returns the
    rollout's report (timeline, shadow figures, previous configs)."""
    import tritonclient.http as httpclient

    from phoenix.ops import rollout
    from phoenix.ops.model_control import LOAD_TIMEOUT_S

    key = serving.admin_key()
    timeouts = {"connection_timeout": LOAD_TIMEOUT_S, "network_timeout": LOAD_TIMEOUT_S}
    client = httpclient.InferenceServerClient(serving.http_url, **timeouts)
    try:
        server = rollout.Server(client, "http", key, serving.served_repository())
        gate = rollout.check_gate(new_dir, options.force, say)
        plan = rollout.forward_plan(server, new_dir)
        requests: list[dict[str, np.ndarray]] = [
            {"user_id": np.array([[u]], np.int64), "top_k": np.array([[options.top_k]], np.int32)}
            for u in user_ids
        ]
        shadow = requests if options.shadow_seconds > 0 else ()
        # written first, as phoenix-rollout does: a rollout that fails part way can be rolled
        # back from it (phoenix-rollout --rollback --report build/loop/rollout.json)
        path = options.work / "rollout.json"
        started = {"state": "started", "previous_configs": plan.previous}
        rollout.write_report({**started, **rollout.plan_summary(plan)}, path)
        report = rollout.roll(server, plan, shadow, options.shadow_seconds, say)
        report["gate"] = gate
        rollout.write_report({"state": "done", **report}, path)
        return report
    except rollout.RolloutError as error:
        raise LoopError(f"rollout of {new_dir}: {error}") from None
    finally:
        client.close()


def rollout_under_load(options: LoopOptions, serving: Serving, redis_url: str, v1: Path,
                       v2: Path, user_ids: np.ndarray, metrics_path: Path,
                       running: contextlib.ExitStack, log: Progress) -> dict[str, Any]:  # fmt: skip
    """Reacting users (label ``rollout``) from ``settle_seconds`` before the rollout to as
    long after it; the rollout's report and the window's Locust counts."""
    users = start_reacting_users(options, serving, redis_url, v1, "rollout", metrics_path, 3600)
    # stopped on the way out whatever happens; a rollout that breaks is reported as it broke
    # (counting the users in a `finally` hid its error behind their missing statistics)
    running.callback(stop_process, users.process, 60)
    users.wait_started()  # the settle time counts from the users' start, not Locust's
    time.sleep(options.settle_seconds)
    report = roll_out(serving, v2, user_ids, options, log)
    time.sleep(options.settle_seconds)
    counts = users.stop()
    log(f"rollout window: {counts['requests']} requests, {counts['failures']} failed")
    return {"report": report, "locust": counts}


# ----------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------


def run_phase(users: ReactingUsers, seconds: float, log: Progress) -> dict[str, Any]:
    """Wait for a timed Locust run; its counts."""
    counts = users.wait(seconds + 120)
    log(f"users on {users.label}: {counts['requests']} requests, {counts['failures']} failed "
        f"(Locust log {users.log_path})")  # fmt: skip
    return counts


def run_loop(options: LoopOptions, log: Optional[Progress] = None) -> dict[str, Any]:
    """The whole loop (the package's doc); returns the report, written under ``options.out``."""
    from phoenix.user_state.server import RedisServer

    log = log or Progress()
    options.work.mkdir(parents=True, exist_ok=True)
    metrics_path = options.work / "online-metrics.json"
    metrics_path.unlink(missing_ok=True)  # this run's versions only
    seconds = 60.0 * options.minutes
    phases: dict[str, Any] = {}
    with contextlib.ExitStack() as running:
        with log.step("v1", f"train the {options.preset} preset with "
                      f"{options.v1_retrieval_steps}+{options.v1_ranker_steps} steps"):  # fmt: skip
            v1 = train_v1(options, log)
        with log.step("serve v1", "redis-server, serve, the simulated users' state"):
            redis = running.enter_context(RedisServer())
            serving = start_serving(v1, redis.url, options.work / "serve", options.serve_timeout_s,
                                    log)  # fmt: skip
            running.callback(stop_process, serving.process, 60)
            user_ids = simulated_user_ids(v1, options)
            phases["loaded"] = load_simulated_users(redis.url, v1, user_ids, options.history_keep)
            log(f"loaded {phases['loaded']}")
        with log.step("users on v1", f"{options.users} reacting users for {seconds:g} s"):
            users = start_reacting_users(options, serving, redis.url, v1, FIRST, metrics_path,
                                         seconds)  # fmt: skip
            running.callback(stop_process, users.process, 60)
            phases[FIRST] = run_phase(users, seconds, log)
        with log.step(
            "v2", "export the served logs, train v2 from v1, the offline gate, v2's programs"
        ):
            v2, export, gate = train_v2(options, redis.url, v1, log)
        roll, why = rollout_decision(gate, options.force)
        if roll:
            with log.step("rollout", "reacting users through shadow, switch and unload"):
                rollout = rollout_under_load(options, serving, redis.url, v1, v2, user_ids,
                                             metrics_path, running, log)  # fmt: skip
        else:
            log(f"rollout: v2 is not rolled out: {why} ({gate_text(gate)}); v1 keeps serving, "
                "and the second phase serves v1 again (an A/A comparison)")  # fmt: skip
            rollout = {"report": None, "locust": None}
        rollout.update(state="done" if roll else "refused", reason=why)
        phases["rollout"] = rollout["locust"]
        label = second_label(roll)
        with log.step(f"users on {label}", f"{options.users} reacting users for {seconds:g} s"):
            cleared = forget_served(redis.url, user_ids)
            log(f"served marks of {cleared} users removed: {label} starts where v1 started")
            users = start_reacting_users(options, serving, redis.url, v2 if roll else v1, label,
                                         metrics_path, seconds)  # fmt: skip
            running.callback(stop_process, users.process, 60)
            phases[label] = run_phase(users, seconds, log)
    metrics = json.loads(metrics_path.read_text())
    report = assemble_report(options, metrics, gate=gate, rollout=rollout, export=export,
                             steps=log.steps, phases=phases)  # fmt: skip
    write_outputs(report, metrics, options.out, log)
    return report
