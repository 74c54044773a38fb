"""The whole loop in one command (issue 28, item 6; docs/loop.md): a version 1 with room to
improve is served to simulated world users, their engagements train version 2, which is gated
offline and rolled out under load, and the users' online metrics of both versions are compared.

Steps (each announced on stdout with the clock time and the seconds since the start):

1. **v1**: the preset (demo) trained with few steps (``--v1-retrieval-steps``,
   ``--v1-ranker-steps``): an undertrained model that has room to improve;
2. **serve v1**: a redis-server child, ``phoenix.serving.serve --redis`` over it, the simulated
   users' state loaded from the world (their newest ``--history-keep`` engagements, leaving room
   under the store's history cap for what they do next);
3. **users on v1**: reacting Locust users (``loadtest/reacting.py``) for ``--minutes``,
   metrics labelled ``v1``;
4. **v2**: the served logs exported (``served_export``), version 2 trained warm from v1
   (``retrain``) with its offline gate (``gate.json``);
5. **rollout under load**: reacting users (label ``rollout``) run through the rollout (shadow,
   switch, unload; ``phoenix.serving.rollout``); their failed requests are counted;
6. **users on v2**: ``--minutes`` more, label ``v2``, the posts marked served to the users
   unmarked first (``forget_served``), so that v2 does not serve the leftovers of v1's phase;
7. **report**: v1 against v2 with 95% Wilson intervals, the failed requests of the rollout
   window, the rollout timeline and the gate, as JSON, a PNG and a markdown table.

Everything started here (redis-server, serve and its tritonserver, Locust) dies with this
process (``phoenix.processes``), also when it is killed.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from phoenix.config import ACTION_NAMES, NEGATIVE_ACTIONS
from phoenix.processes import (
    dying_with_us,
    http_get_status,
    pick_free_ports,
    read_log_tail,
    stop_process,
)

REACTING_LOCUSTFILE = Path("loadtest/reacting.py")
LABELS = ("v1", "rollout", "v2")
SCHEMA = 1


class LoopError(RuntimeError):
    """A step of the loop that failed (the message names the step and where its log is)."""


@dataclass(frozen=True)
class LoopOptions:
    """What one run of the loop does; the defaults are ``make loop``'s."""

    out: Path = Path("bench/results/loop")
    work: Path = Path("build/loop")
    preset: str = "demo"
    seed: int = 0
    v1_retrieval_steps: int = 100
    v1_ranker_steps: int = 200
    v2_retrieval_steps: Optional[int] = None  # None: retrain's default (a quarter of the preset's)
    v2_ranker_steps: Optional[int] = None
    minutes: float = 2.0
    users: int = 16
    world_seed: int = 0
    history_keep: int = 64
    top_n: int = 10
    top_k: int = 10  # = top_n: only the posts a user views are marked served
    shadow_seconds: float = 10.0
    settle_seconds: float = 5.0  # reacting users before and after the rollout
    force: bool = False
    serve_timeout_s: float = 600.0

    def __post_init__(self):
        if not self.minutes > 0:
            raise ValueError(f"--minutes must be > 0, got {self.minutes}")
        if self.users < 1:
            raise ValueError(f"--users must be >= 1, got {self.users}")
        if not 1 <= self.top_n <= self.top_k:
            raise ValueError(f"need 1 <= --top-n <= --top-k, got {self.top_n} and {self.top_k}")
        if self.v1_retrieval_steps < 1 or self.v1_ranker_steps < 1:
            raise ValueError("--v1-retrieval-steps and --v1-ranker-steps must be >= 1")
        if self.shadow_seconds < 0 or self.settle_seconds < 0:
            raise ValueError("--shadow-seconds and --settle-seconds must be >= 0")


# ----------------------------------------------------------------------------------------
# Progress: timestamped lines, and how long each step took
# ----------------------------------------------------------------------------------------


class Progress:
    """Prints ``[HH:MM:SS +SECONDS s] text`` lines; ``step`` records each step's times."""

    def __init__(self, write: Callable[[str], None] = print):
        self.write = write
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.steps: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def __call__(self, text: str) -> None:
        stamp = time.strftime("%H:%M:%S")
        self.write(f"[{stamp} +{self.elapsed():6.1f} s] {text}")

    @contextlib.contextmanager
    def step(self, name: str, what: str) -> Iterator[None]:
        start = self.elapsed()
        self(f"{name}: {what}")
        yield
        seconds = self.elapsed() - start
        self.steps.append({"step": name, "what": what, "start_s": round(start, 1),
                           "seconds": round(seconds, 1)})  # fmt: skip
        self(f"{name}: done in {seconds:.1f} s")


# ----------------------------------------------------------------------------------------
# The pure parts: Locust's counts, the v1/v2 comparison, the report
# ----------------------------------------------------------------------------------------


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


def interval_verdict(before: Mapping, after: Mapping, higher_is_better: bool) -> str:
    """``better``/``worse`` when the two 95% intervals do not overlap (in the direction that is
    good or bad), ``overlap`` when they do, ``n/a`` when a side has no rate."""
    if before is None or after is None or before.get("rate") is None or after.get("rate") is None:
        return "n/a"
    if after["low"] > before["high"]:
        return "better" if higher_is_better else "worse"
    if after["high"] < before["low"]:
        return "worse" if higher_is_better else "better"
    return "overlap"


def rate_row(metric: str, before: Optional[Mapping], after: Optional[Mapping], direction: str):
    """One compared rate: both sides with their intervals, the difference and the verdict
    (``direction``: higher, lower or none: a share that is neither good nor bad)."""
    verdict = (
        "n/a" if direction == "none" else interval_verdict(before, after, direction == "higher")
    )
    difference = None
    if before and after and before.get("rate") is not None and after.get("rate") is not None:
        difference = after["rate"] - before["rate"]
    return {"metric": metric, "better_when": direction, "v1": before, "v2": after,
            "difference": difference, "verdict": verdict}  # fmt: skip


def positive_actions() -> list[str]:
    return [name for name in ACTION_NAMES if name not in NEGATIVE_ACTIONS]


def compare_versions(v1: Mapping, v2: Mapping) -> dict[str, Any]:
    """v1's and v2's totals (``OnlineMetrics`` summaries) compared: a row per action rate (the
    actions either version saw), the negative-action rate, the in-network share and latency;
    ``beats``: v2 better than v1 outside the intervals on at least one positive action, worse
    on none, and its negative-action rate not worse."""
    rows = []
    for name in ACTION_NAMES:
        before, after = v1["engagements"][name], v2["engagements"][name]
        if before["count"] or after["count"]:
            direction = "lower" if name in NEGATIVE_ACTIONS else "higher"
            rows.append(rate_row(f"engagements.{name}", before, after, direction))
    rows.append(rate_row("negative_rate", v1["negative_rate"], v2["negative_rate"], "lower"))
    rows.append(rate_row("in_network_share", v1["in_network_share"], v2["in_network_share"],
                         "none"))  # fmt: skip
    positive = {f"engagements.{name}" for name in positive_actions()}
    better = [r["metric"] for r in rows if r["metric"] in positive and r["verdict"] == "better"]
    worse = [r["metric"] for r in rows if r["verdict"] == "worse"]
    return {
        "rows": rows,
        "latency_ms": {"v1": v1["latency_ms"], "v2": v2["latency_ms"]},
        "impressions": {"v1": v1["impressions"], "v2": v2["impressions"]},
        "requests": {"v1": v1["requests"], "v2": v2["requests"]},
        "better_outside_interval": better,
        "worse_outside_interval": worse,
        "beats": bool(better) and not worse,
        "rule": "v2 beats v1: better outside the 95% intervals on at least one positive "
        "action's engagements per impression, and worse outside them on nothing (negative "
        "actions and the negative-action rate count lower-better)",
    }


def totals_between(buckets: Sequence[Mapping], start_s: float, end_s: float) -> dict:
    """A version's totals over its buckets starting in [start_s, end_s), in the shape of an
    ``OnlineMetrics`` total (rates with Wilson intervals; no latency, no in-network share)."""
    from phoenix.training.online_metrics import wilson

    chosen = [b for b in buckets if start_s <= b["start_s"] < end_s]
    impressions = sum(b["impressions"] for b in chosen)

    def count(pick) -> int:
        return sum(pick(b)["count"] for b in chosen)

    return {
        "impressions": impressions,
        "requests": sum(b["requests"] for b in chosen),
        "engagements": {
            name: wilson(count(lambda b, n=name: b["engagements"][n]), impressions)
            for name in ACTION_NAMES
        },
        "negative_rate": wilson(count(lambda b: b["negative_rate"]), impressions),
        "in_network_share": None,
        "latency_ms": None,
    }


def compare_halves(metrics: Mapping, phase_s: float) -> dict[str, Any]:
    """v1 against v2 over the first and the second half of their phases: a served post is
    excluded for days, so a version that serves each user's best posts first wins the first
    half and may serve leftovers in the second."""
    versions, half = metrics["versions"], phase_s / 2
    result: dict[str, Any] = {"half_s": half}
    for name, (start, end) in (("first", (0.0, half)), ("second", (half, float("inf")))):
        v1, v2 = (totals_between(versions[k]["buckets"], start, end) for k in ("v1", "v2"))
        compared = compare_versions(v1, v2)
        result[name] = {k: compared[k] for k in ("rows", "impressions", "better_outside_interval",
                                                 "worse_outside_interval", "beats")}  # fmt: skip
    return result


def rollout_window(locust: Mapping, metrics: Optional[Mapping]) -> dict[str, Any]:
    """The failed requests of the reacting users who ran through the rollout: Locust's count
    (feeds and engagement writes) and the feeds the online metrics recorded."""
    feeds = (metrics or {}).get("total", {})
    return {
        "locust_requests": locust["requests"],
        "locust_failures": locust["failures"],
        "by_name": locust["by_name"],
        "feed_requests": feeds.get("requests"),
        "feed_failures": feeds.get("failures"),
    }


def gate_figures(gate: Mapping) -> dict[str, Any]:
    """gate.json's verdict and headline figures (both sides' ndcg@20, recall and AUCs)."""
    keep = ("ndcg@20", "recall@100", "recall@200", "auc", "log_loss")

    def pick(side: Mapping) -> dict:
        return {k: side[k] for k in keep if k in side}

    return {
        "passed": gate["passed"],
        "rule": gate.get("rule"),
        "held_out": gate.get("held_out"),
        "candidate": pick(gate.get("candidate", {})),
        "baseline": pick(gate.get("baseline", {})),
    }


def assemble_report(
    options: LoopOptions,
    metrics: Mapping,
    rollout_locust: Mapping,
    rollout_report: Mapping,
    gate: Mapping,
    export: Mapping,
    steps: Sequence[Mapping],
    phases: Mapping,
) -> dict[str, Any]:
    """The loop's report (loop.json): settings, the v1/v2 comparison, the rollout window's
    failures, the rollout's timeline and shadow figures, the gate, the export, the steps."""
    versions = metrics["versions"]
    for label in ("v1", "v2"):
        if label not in versions:
            raise LoopError(f"the online metrics hold no version {label!r}: did its users run?")
    settings = {k: str(v) if isinstance(v, Path) else v
                for k, v in dataclasses.asdict(options).items()}  # fmt: skip
    return {
        "schema": SCHEMA,
        "what": "one run of the loop (python -m phoenix.training loop; docs/loop.md)",
        "settings": settings,
        "comparison": compare_versions(versions["v1"]["total"], versions["v2"]["total"]),
        "comparison_by_half": compare_halves(metrics, 60.0 * options.minutes),
        "rollout_window": rollout_window(rollout_locust, versions.get("rollout")),
        "rollout": {k: v for k, v in rollout_report.items() if k != "previous_configs"},
        "gate": gate_figures(gate),
        "export": dict(export),
        "phases": dict(phases),
        "steps": list(steps),
        "interval": metrics.get("interval"),
    }


def _rate_text(rate: Optional[Mapping]) -> str:
    if not rate or rate.get("rate") is None:
        return "n/a"
    return f"{rate['rate']:.4f} [{rate['low']:.4f}, {rate['high']:.4f}]"


def markdown_report(report: Mapping) -> str:
    """The comparison, the rollout window and the gate as markdown tables."""
    comparison = report["comparison"]
    lines = [
        f"v1: {comparison['impressions']['v1']:,} impressions of {comparison['requests']['v1']:,}"
        f" feeds; v2: {comparison['impressions']['v2']:,} of {comparison['requests']['v2']:,}",
        "",
        "| metric | v1 (95% interval) | v2 (95% interval) | v2 - v1 | verdict |",
        "|---|---|---|---|---|",
    ]
    for row in comparison["rows"]:
        diff = "n/a" if row["difference"] is None else f"{row['difference']:+.4f}"
        lines.append(f"| {row['metric']} | {_rate_text(row['v1'])} | {_rate_text(row['v2'])} | "
                     f"{diff} | {row['verdict']} |")  # fmt: skip
    for q in ("p50", "p90", "p99"):
        v1, v2 = (comparison["latency_ms"][k] or {} for k in ("v1", "v2"))
        if q in v1 and q in v2:
            lines.append(f"| latency {q} (ms) | {v1[q]:.1f} | {v2[q]:.1f} | "
                         f"{v2[q] - v1[q]:+.1f} | |")  # fmt: skip
    verdict = "yes" if comparison["beats"] else "no"
    lines += ["", f"v2 beats v1 outside the 95% intervals: **{verdict}** "
              f"(better: {', '.join(comparison['better_outside_interval']) or 'none'}; "
              f"worse: {', '.join(comparison['worse_outside_interval']) or 'none'})"]  # fmt: skip
    for half in ("first", "second"):
        if half in report.get("comparison_by_half", {}):
            part = report["comparison_by_half"][half]
            lines.append(f"- {half} half of each phase ({part['impressions']['v1']:,} and "
                         f"{part['impressions']['v2']:,} impressions): v2 better on "
                         f"{', '.join(part['better_outside_interval']) or 'none'}; worse on "
                         f"{', '.join(part['worse_outside_interval']) or 'none'}")  # fmt: skip
    window = report["rollout_window"]
    lines += ["", f"Rollout under load: {window['locust_failures']} failed of "
              f"{window['locust_requests']} Locust requests (feeds: {window['feed_failures']} "
              f"of {window['feed_requests']})", "", "| t (s) | event |", "|---|---|"]  # fmt: skip
    for event in report["rollout"].get("timeline", []):
        detail = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("t_s", "event"))
        lines.append(f"| {event['t_s']:.2f} | {event['event']} {detail} |")
    gate = report["gate"]
    lines += ["", f"Offline gate: {'passed' if gate['passed'] else 'FAILED'} ({gate['rule']})"]
    for metric in ("ndcg@20", "recall@100", "recall@200"):
        if metric in gate["candidate"] and metric in gate["baseline"]:
            lines.append(f"- {metric}: v1 {gate['baseline'][metric]:.4f} -> v2 "
                         f"{gate['candidate'][metric]:.4f}")  # fmt: skip
    return "\n".join(lines)


def plot_report(report: Mapping, path: Path) -> Path:
    """A PNG: the action rates of v1 and v2 with their 95% intervals, the negative-action rate
    and in-network share, and the feeds' latency percentiles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comparison = report["comparison"]
    rows = [r for r in comparison["rows"] if all((r[k] or {}).get("rate") is not None
                                                  for k in ("v1", "v2"))]  # fmt: skip
    actions = [r for r in rows if r["metric"].startswith("engagements.")]
    others = [r for r in rows if not r["metric"].startswith("engagements.")]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [4, 1.3, 1.3]})
    for panel, chosen in ((axes[0], actions), (axes[1], others)):
        x = np.arange(len(chosen))
        for offset, label in ((-0.2, "v1"), (0.2, "v2")):
            rates = np.array([r[label]["rate"] for r in chosen])
            # the interval holds the rate; clipped, as rounding may leave it a hair outside
            low = np.maximum(0, rates - np.array([r[label]["low"] for r in chosen]))
            high = np.maximum(0, np.array([r[label]["high"] for r in chosen]) - rates)
            panel.bar(x + offset, rates, 0.4, yerr=[low, high], capsize=3, label=label)
        panel.set_xticks(x, [r["metric"].removeprefix("engagements.") for r in chosen],
                         rotation=45, ha="right")  # fmt: skip
        panel.legend()
    axes[0].set_title("engagements per impression (95% Wilson intervals)")
    axes[1].set_title("negative-action rate, in-network share")
    quantiles = ("p50", "p90", "p99")
    x = np.arange(len(quantiles))
    for offset, label in ((-0.2, "v1"), (0.2, "v2")):
        latency = comparison["latency_ms"][label] or {}
        axes[2].bar(x + offset, [latency.get(q, np.nan) for q in quantiles], 0.4, label=label)
    axes[2].set_xticks(x, quantiles)
    axes[2].set_title("feed latency (ms)")
    axes[2].legend()
    window = report["rollout_window"]
    fig.suptitle(f"v1 vs v2 online ({report['settings']['minutes']:g} min each); rollout under "
                 f"load: {window['locust_failures']} failed of {window['locust_requests']} "
                 "requests")  # fmt: skip
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------
# The processes: redis-server, serve, Locust
# ----------------------------------------------------------------------------------------


@dataclass
class Serving:
    """A running ``phoenix.serving.serve`` and where to reach it."""

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
        from phoenix.serving.admin_key import server_admin_key

        key, _ = server_admin_key(self.build_dir)
        return key


def start_serving(artifacts: Path, redis_url: str, build_dir: Path, timeout_s: float,
                  log: Progress) -> Serving:  # fmt: skip
    """``python -m phoenix.serving.serve`` over ``artifacts`` reading the store at
    ``redis_url``, on free loopback ports; returns once its /ready says 200."""
    from phoenix.serving.serve import DEFAULT_MODEL_REPOSITORY

    http, grpc, metrics, supervisor = pick_free_ports(4)
    build_dir.mkdir(parents=True, exist_ok=True)
    log_path = build_dir / "serve.log"
    repository = DEFAULT_MODEL_REPOSITORY.resolve()
    command = [
        sys.executable, "-m", "phoenix.serving.serve", "--artifacts", str(artifacts),
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
    from phoenix.training.pipeline import trained_world
    from phoenix.training.simulate import draw_user_ids

    return draw_user_ids(trained_world(artifacts), options.users, options.world_seed)


def load_simulated_users(redis_url: str, artifacts: Path, user_ids: np.ndarray,
                         keep: int) -> dict[str, Any]:  # fmt: skip
    """The simulated users' follows and newest ``keep`` engagements, and the authors' posts,
    into the store (``phoenix-events load-world`` for just these users)."""
    from phoenix.user_state import UserStateStore, connect
    from phoenix.user_state.world import WorldUsers, load_users

    world = WorldUsers.from_artifacts(artifacts, keep=keep)
    indices = [world.index_of(int(u)) for u in user_ids]
    loaded = load_users(UserStateStore(connect(redis_url)), world, indices)
    return {"users": loaded.users, "engagements": loaded.applied.engagements,
            "follows": loaded.applied.follows, "seconds": round(loaded.seconds, 1)}  # fmt: skip


def forget_served(redis_url: str, user_ids: Sequence[int]) -> int:
    """Unmark every post served to ``user_ids``: the retriever excludes served posts for two
    days, so users who run through a version's phase have used up the best of the corpus and
    the next version would be measured on the leftovers. Each measured phase starts from
    nothing served; the users' engagement histories stay. Returns the keys removed."""
    from phoenix.user_state import connect
    from phoenix.user_state.keys import SERVED, user_key

    client = connect(redis_url)
    return int(sum(client.delete(user_key(int(u), SERVED)) for u in user_ids))


# ----------------------------------------------------------------------------------------
# The rollout: the one place that calls phoenix.serving.rollout
# ----------------------------------------------------------------------------------------


def roll_out(serving: Serving, new_dir: Path, user_ids: Sequence[int], options: LoopOptions,
             say: Callable[[str], None]) -> dict[str, Any]:  # fmt: skip
    """Roll the server onto ``new_dir`` (gate checked, shadowed on the simulated users' feed
    requests for ``options.shadow_seconds``, switched, the old version unloaded); returns the
    rollout's report (timeline, shadow figures, previous configs)."""
    import tritonclient.http as httpclient

    from phoenix.serving import rollout

    key = serving.admin_key()
    timeouts = {
        "connection_timeout": rollout.LOAD_TIMEOUT_S,
        "network_timeout": rollout.LOAD_TIMEOUT_S,
    }
    client = httpclient.InferenceServerClient(serving.http_url, **timeouts)
    try:
        server = rollout.Server(client, "http", key, serving.served_repository())
        gate = rollout.check_gate(new_dir, options.force, say)
        plan = rollout.forward_plan(server, new_dir)
        requests = [
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


# ----------------------------------------------------------------------------------------
# The loop
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
    from phoenix.serving.compile import ensure_programs
    from phoenix.training.retrain import retrain
    from phoenix.training.served_export import export_served_logs

    logs, v2 = options.work / "served-logs", options.work / "v2"
    export = export_served_logs(redis_url, v1, logs, top_n=options.top_n, log=log)
    log(export.text(logs))
    gate = retrain(logs, v1, v2, retrieval_steps=options.v2_retrieval_steps,
                   ranker_steps=options.v2_ranker_steps, log=log)  # fmt: skip
    summary = {k: v for k, v in dataclasses.asdict(export).items() if k != "split"}
    log(f"gate: {'passed' if gate['passed'] else 'FAILED'} ({gate['rule']})")
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


def run_phase(users: ReactingUsers, seconds: float, log: Progress) -> dict[str, Any]:
    """Wait for a timed Locust run; its counts."""
    counts = users.wait(seconds + 120)
    log(f"users on {users.label}: {counts['requests']} requests, {counts['failures']} failed "
        f"(Locust log {users.log_path})")  # fmt: skip
    return counts


def run_loop(options: LoopOptions, log: Optional[Progress] = None) -> dict[str, Any]:
    """The whole loop (the module's doc); returns the report, written under ``options.out``."""
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
            users = start_reacting_users(options, serving, redis.url, v1, "v1", metrics_path,
                                         seconds)  # fmt: skip
            running.callback(stop_process, users.process, 60)
            phases["v1"] = run_phase(users, seconds, log)
        with log.step(
            "v2", "export the served logs, train v2 from v1, the offline gate, v2's programs"
        ):
            v2, export, gate = train_v2(options, redis.url, v1, log)
        with log.step("rollout", "reacting users through shadow, switch and unload"):
            users = start_reacting_users(options, serving, redis.url, v1, "rollout",
                                         metrics_path, 3600)  # fmt: skip
            running.callback(stop_process, users.process, 60)
            try:
                time.sleep(options.settle_seconds)
                rollout_report = roll_out(serving, v2, user_ids, options, log)
                time.sleep(options.settle_seconds)
            finally:
                phases["rollout"] = users.stop()
            log(f"rollout window: {phases['rollout']['requests']} requests, "
                f"{phases['rollout']['failures']} failed")  # fmt: skip
        with log.step("users on v2", f"{options.users} reacting users for {seconds:g} s"):
            cleared = forget_served(redis.url, user_ids)
            log(f"served marks of {cleared} users removed: v2 starts where v1 started")
            users = start_reacting_users(options, serving, redis.url, v2, "v2", metrics_path,
                                         seconds)  # fmt: skip
            running.callback(stop_process, users.process, 60)
            phases["v2"] = run_phase(users, seconds, log)
    metrics = json.loads(metrics_path.read_text())
    report = assemble_report(options, metrics, phases["rollout"], rollout_report, gate, export,
                             log.steps, phases)  # fmt: skip
    write_outputs(report, metrics, options.out, log)
    return report


def strict_json(value: Any) -> Any:
    """``value`` with NaN and infinities as null (a shadow of empty feeds measures no rank
    correlation): loop.json stays standard JSON."""
    if isinstance(value, Mapping):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float | np.floating):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def in_repository_terms(value: Any) -> Any:
    """``value`` with this checkout's absolute path left out of its strings (the rollout's
    timeline names artifact directories): results read the same in every checkout."""
    root = f"{Path(__file__).resolve().parents[2]}/"
    if isinstance(value, str):
        return value.replace(root, "")
    if isinstance(value, Mapping):
        return {k: in_repository_terms(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [in_repository_terms(v) for v in value]
    return value


def write_outputs(report: Mapping, metrics: Mapping, out: Path, log: Progress) -> None:
    """loop.json, loop.png, loop.md and the online metrics over time (JSON and PNG) in out."""
    from phoenix.training.online_metrics import plot

    out.mkdir(parents=True, exist_ok=True)
    report = in_repository_terms(report)
    (out / "loop.json").write_text(json.dumps(strict_json(report), indent=1) + "\n")
    (out / "online-metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    plot(metrics, out / "online-metrics.png")
    plot_report(report, out / "loop.png")
    table = markdown_report(report)
    (out / "loop.md").write_text(table + "\n")
    print(table, flush=True)
    log(f"wrote {out}/loop.json, loop.png, loop.md, online-metrics.json and online-metrics.png")


# ----------------------------------------------------------------------------------------
# Command line (python -m phoenix.training loop)
# ----------------------------------------------------------------------------------------


def add_arguments(parser) -> None:
    """The loop's options on ``parser`` (defaults from LoopOptions)."""
    d = LoopOptions()
    add = parser.add_argument

    def add_defaulted(flag: str, kind: type, text: str) -> None:
        """``flag`` defaulting to LoopOptions' field of the same name, which its help shows."""
        default = getattr(d, flag.removeprefix("--").replace("-", "_"))
        add(flag, type=kind, default=default, help=f"{text} (default: %(default)s)")

    add_defaulted("--minutes", float, "reacting users on v1, then on v2")
    add_defaulted("--users", int, "reacting Locust users, each a world user")
    add_defaulted("--out", Path, "report folder: loop.json, loop.png, loop.md, online-metrics.*")
    add_defaulted("--work", Path, "artifacts v1 and v2, logs, server and Locust logs")
    add(
        "--preset",
        choices=("tiny", "demo"),
        default=d.preset,
        help="training preset of v1 (default: %(default)s)",
    )
    add_defaulted("--seed", int, "training seed")
    add_defaulted(
        "--v1-retrieval-steps", int, "v1's retrieval steps: few, so v1 has room to improve"
    )
    add_defaulted("--v1-ranker-steps", int, "v1's ranker steps")
    add(
        "--v2-retrieval-steps",
        type=int,
        default=None,
        help="v2's retrieval steps on the served logs (default: a quarter of the preset's)",
    )
    add(
        "--v2-ranker-steps",
        type=int,
        default=None,
        help="v2's ranker steps (default: a quarter of the preset's)",
    )
    add_defaulted("--world-seed", int, "seed of the simulated users and their reactions")
    add_defaulted("--history-keep", int, "engagements per simulated user loaded into the store")
    add_defaulted("--top-n", int, "posts a user views")
    add_defaulted("--top-k", int, "posts a feed asks for")
    add_defaulted(
        "--shadow-seconds", float, "v2 shadow-scores the users' requests this long; 0: no shadow"
    )
    add_defaulted("--settle-seconds", float, "reacting users before and after the rollout")
    add("--force", action="store_true", help="roll v2 out even when its offline gate failed")


def options_from_args(args) -> LoopOptions:
    fields = {f.name for f in dataclasses.fields(LoopOptions)}
    return LoopOptions(**{k: v for k, v in vars(args).items() if k in fields})


def main_from_args(args) -> int:
    """``python -m phoenix.training loop``: exit 0 with the report written, 2 on bad options,
    1 when a step failed (the message names it)."""
    try:
        options = options_from_args(args)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from phoenix.checkpoint import ArtifactError
    from phoenix.serving.compile import CompileError
    from phoenix.training.retrain import RetrainError
    from phoenix.training.served_export import ExportError

    try:
        run_loop(options)
    except (LoopError, RetrainError, ExportError, ArtifactError, CompileError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0
