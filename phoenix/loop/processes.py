"""The processes of the loop: serve (with its tritonserver) over a redis-server, the reacting
Locust users (``loadtest/reacting.py``) and what they read and write in the store: the
simulated users' state loaded from the world, their served marks removed between phases,
Locust's counts from its stats file. Each process is started so that it dies with the loop
(``phoenix.util.processes``)."""

from __future__ import annotations

import csv
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from phoenix.loop.options import LoopError, LoopOptions, Progress
from phoenix.util.processes import (
    dying_with_us,
    http_get_status,
    pick_free_ports,
    read_log_tail,
    stop_process,
)

REACTING_LOCUSTFILE = Path("loadtest/reacting.py")


def locust_counts(stats_csv: Path) -> dict[str, Any]:
    """Requests and failures per request name from Locust's ``--csv`` stats file (its
    ``Aggregated`` row is the total); LoopError naming the file when it is missing."""
    try:
        with Path(stats_csv).open(newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError as error:
        raise LoopError(f"{stats_csv}: Locust's stats are missing ({error.strerror})") from None
    counts: dict[str, Any] = {"requests": 0, "failures": 0, "by_name": {}}
    for row in rows:
        requests, failures = int(row["Request Count"]), int(row["Failure Count"])
        if row["Name"] == "Aggregated":
            counts.update(requests=requests, failures=failures)
        else:
            counts["by_name"][f"{row['Type']} {row['Name']}"] = {
                "requests": requests,
                "failures": failures,
            }
    return counts


@dataclass
class Serving:
    """A running ``phoenix.ops.serve`` and where to reach it."""

    process: subprocess.Popen
    http_url: str
    grpc_url: str
    ready_url: str
    log_path: Path
    build_dir: Path
    repository: Path

    def served_repository(self) -> Path:
        """The repository tritonserver serves: the copy serve wrote into its build folder
        (``TritonServer.served_repository``), where the rollout writes its models' folders."""
        stem = f"tritonserver-{self.process.pid}.repository-"
        found = [p for p in self.build_dir.glob(stem + "*") if p.is_dir()]
        if len(found) != 1:
            raise LoopError(f"{self.build_dir}: expected one {stem}* folder, found {len(found)}")
        return found[0]

    def admin_key(self) -> str:
        """The key serve wrote into its build folder (the rollout's loads need it)."""
        from phoenix.ops.admin_key import server_admin_key

        key, _ = server_admin_key(self.build_dir)
        return key


def start_serving(artifacts: Path, redis_url: str, build_dir: Path, timeout_s: float,
                  log: Progress) -> Serving:  # fmt: skip
    """``python -m phoenix.ops.serve`` over ``artifacts`` reading the store at
    ``redis_url``, on free loopback ports; returns once its /ready says 200."""
    from phoenix.ops.serve import DEFAULT_MODEL_REPOSITORY

    http, grpc, metrics, supervisor = pick_free_ports(4)
    build_dir.mkdir(parents=True, exist_ok=True)
    log_path = build_dir / "serve.log"
    repository = DEFAULT_MODEL_REPOSITORY.resolve()
    command = [
        sys.executable, "-m", "phoenix.ops.serve", "--artifacts", str(artifacts),
        "--redis", redis_url, "--http-port", str(http), "--grpc-port", str(grpc),
        "--metrics-port", str(metrics), "--supervisor-port", str(supervisor),
        "--build-dir", str(build_dir), "--model-repository", str(repository),
    ]  # fmt: skip
    with log_path.open("wb") as output:  # serve kills itself when we die (stop_with_parent)
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    ready_url = f"http://127.0.0.1:{supervisor}/ready"
    serving = Serving(process, f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", ready_url, log_path,
                      build_dir, repository)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while http_get_status(serving.ready_url) != 200:
        if process.poll() is not None:
            raise LoopError(f"serve exited ({process.returncode}) before it was ready; its log "
                            f"{log_path}:\n{read_log_tail(log_path, 30)}")  # fmt: skip
        if time.monotonic() > deadline:
            stop_process(process, 30)
            raise LoopError(f"serve was not ready after {timeout_s:g} s; see {log_path}")
        time.sleep(1.0)
    log(f"serving {artifacts} (HTTP {serving.http_url}, gRPC {serving.grpc_url}; log {log_path})")
    return serving


@dataclass
class ReactingUsers:
    """One run of reacting Locust users (``loadtest/reacting.py``) under a version label."""

    label: str
    process: subprocess.Popen
    csv_prefix: Path
    log_path: Path

    def stats(self) -> dict[str, Any]:
        return locust_counts(Path(f"{self.csv_prefix}_stats.csv"))

    def stop(self) -> dict[str, Any]:
        """SIGTERM (Locust quits cleanly: the metrics and the stats are written)."""
        stop_process(self.process, 60)
        return self.stats()

    def wait_started(self, timeout_s: float = 120.0) -> None:
        """Until Locust is past its start-up (its stats history file, opened just before the
        users spawn, exists) or has exited: on a busy machine its start takes seconds, and a
        stop before it ends leaves no statistics to count."""
        history = Path(f"{self.csv_prefix}_stats_history.csv")
        deadline = time.monotonic() + timeout_s
        while not history.exists() and self.process.poll() is None:
            if time.monotonic() > deadline:
                raise LoopError(f"Locust ({self.label}) did not start within {timeout_s:g} s; "
                                f"its log {self.log_path}")  # fmt: skip
            time.sleep(0.2)

    def wait(self, timeout_s: float) -> dict[str, Any]:
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return self.stop()
        return self.stats()


def start_reacting_users(
    options: LoopOptions,
    serving: Serving,
    redis_url: str,
    artifacts: Path,
    label: str,
    metrics_path: Path,
    run_time_s: float,
) -> ReactingUsers:
    """Locust, headless, ``options.users`` world users spawned at once, for ``run_time_s``."""
    folder = options.work / "locust"
    folder.mkdir(parents=True, exist_ok=True)
    csv_prefix, log_path = folder / label, folder / f"{label}.log"
    command = [
        sys.executable, "-m", "locust", "-f", str(REACTING_LOCUSTFILE), "--headless",
        "-u", str(options.users), "-r", str(options.users), "-t", f"{int(run_time_s)}s",
        "--stop-timeout", "5", "--csv", str(csv_prefix), "--only-summary",
        "--grpc-url", serving.grpc_url, "--redis-url", redis_url, "--artifacts", str(artifacts),
        "--version-label", label, "--world-seed", str(options.world_seed),
        "--simulated-users", str(options.users), "--top-n", str(options.top_n),
        "--top-k", str(options.top_k), "--metrics-out", str(metrics_path),
    ]  # fmt: skip
    with log_path.open("wb") as output:
        process = subprocess.Popen(dying_with_us(command), stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=subprocess.STDOUT)  # fmt: skip
    return ReactingUsers(label, process, csv_prefix, log_path)


def simulated_user_ids(artifacts: Path, options: LoopOptions) -> np.ndarray:
    """The world users the reacting Locust users are (the ids reacting.py draws)."""
    from phoenix.world.simulate import draw_user_ids
    from phoenix.world.trained import trained_world

    return draw_user_ids(trained_world(artifacts), options.users, options.world_seed)


def load_simulated_users(redis_url: str, artifacts: Path, user_ids: np.ndarray,
                         keep: int) -> dict[str, Any]:  # fmt: skip
    """The simulated users' follows and newest ``keep`` engagements, and the authors' posts,
    into the store (``phoenix-events load-world`` for just these users)."""
    from phoenix.user_state import UserStateStore, connect
    from phoenix.world.users import WorldUsers, load_users

    world = WorldUsers.from_artifacts(artifacts, keep=keep)
    indices = [world.index_of(int(u)) for u in user_ids]
    loaded = load_users(UserStateStore(connect(redis_url)), world, indices)
    return {"users": loaded.users, "engagements": loaded.applied.engagements,
            "follows": loaded.applied.follows, "seconds": round(loaded.seconds, 1)}  # fmt: skip


def forget_served(redis_url: str, user_ids: np.ndarray) -> int:
    """Unmark every post served to ``user_ids``: the retriever excludes served posts for two
    days, so users who run through a version's phase have used up the best of the corpus and
    the next version would be measured on the leftovers. Each measured phase starts from
    nothing served; the users' engagement histories stay. Returns the keys removed."""
    from phoenix.user_state import connect
    from phoenix.user_state.keys import SERVED, user_key

    client = connect(redis_url)
    return int(sum(client.delete(user_key(int(u), SERVED)) for u in user_ids))
