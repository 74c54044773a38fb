# ruff: noqa: E501  (COMMANDS quotes the docs' command lines whole)
"""Every command the README and the docs tell a user to run, and the test that runs it.

The commands are read from the docs themselves: each line of a shell code block (```sh), the
lines of an unmarked code block that start with a command (make, python, phoenix-*, curl,
...), and every inline `make ...`. COMMANDS says, for each, how it is tested:

- Ran: a test runs it as a subprocess as a user types it (the server's free ports for the
  docs' 8000-8003, a temporary folder for a path it writes, fewer users or steps where it
  is long: the note says what differs);
- Help: it takes minutes to hours (a benchmark, a training run): a test runs its `--help`;
- InProcess: a test calls its main() with these arguments in the test process;
- NotHere: it cannot run on this machine (no Docker, no Kubernetes cluster, no GPU, the suite
  itself); the note says what checks it instead.

A command added to the docs without a line here fails this test, as does a line here whose
command left the docs or whose test does not exist or does not name the command's program.
Every documented `make` command must also be one make accepts (`make -n`).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/*.md", "docs/design/*.md", "loadtest/README.md"]
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
COMMAND_WORD = re.compile(
    r"make|python3?|\.venv/bin/\S+|phoenix-[a-z-]+|kubectl|docker|curl|bash|locust|cat|export"
    r"|kafka-console-consumer|producer|[A-Z_]+=\S+"
)
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.M | re.S)
SCRIPTS = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]


@dataclass(frozen=True)
class Ran:
    tests: tuple[str, ...]
    note: str = ""


@dataclass(frozen=True)
class Help:
    tests: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class InProcess:
    tests: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class NotHere:
    note: str


# ---- the tests, by what they run --------------------------------------------------------
INTEGRATION, SLOW, UNIT = "tests/integration/", "tests/slow/", "tests/unit/"
MAKE_DEMO = (INTEGRATION + "test_clients.py::test_the_readme_shows_what_make_demo_prints",)
DEMO_NO_POLICY = (
    INTEGRATION + "test_clients.py::test_demo_starts_its_own_server_prints_the_feed_and_stops_it",
)
SERVE = INTEGRATION + "test_make_serve.py::"
MAKE_SERVE = (SERVE + "test_make_serve_serves_the_trained_demo_towers_on_the_ports_given",)
CURL = (SERVE + "test_the_curl_probes_of_the_serving_guide",)
POLICY = (SERVE + "test_the_feed_policy_commands_show_and_change_the_running_parameters",)
RELOAD_BY_HAND = (SERVE + "test_the_corpus_reload_by_hand_keeps_serving",)
LOOP = (
    INTEGRATION
    + "test_loop_command.py::test_make_loop_in_a_short_mode_runs_every_step_and_reports",
)
LONG = (UNIT + "test_long_commands.py::test_a_long_commands_help",)
GPU_CHECK = (UNIT + "test_long_commands.py::test_the_gpu_sections_check_runs_as_typed",)
LOADTEST = (INTEGRATION + "test_locust.py::test_make_loadtest_against_a_running_server",)
OWN_SERVER_LOADTEST = (INTEGRATION + "test_locust.py::test_make_loadtest_starts_its_own_server",)
LOCUST = (SERVE + "test_plain_locust_on_the_locustfile",)
REACTING = (INTEGRATION + "test_reacting_users.py::test_world_users_react_and_fill_their_state",)
ROLLOUT = INTEGRATION + "test_rollout_command.py::"
ROLLOUT_HTTP_GRPC = (ROLLOUT + "test_a_rollout_over_http_then_a_rollback_over_grpc",)
STORE = SLOW + "test_store_commands.py::"
BUILD_STORE = (STORE + "test_a_store_built_fed_and_compacted_as_typed",)
COMPILE = (INTEGRATION + "test_compile_command.py::test_compile_of_a_complete_store_only_loads",)
GPU_SMOKE = (INTEGRATION + "test_gpu_bench_smoke.py::test_every_step_succeeds",)
RETRAIN = (
    SLOW + "test_served_retrain_run.py::test_served_logs_train_the_next_version_and_gate_it",
)
MAKEFILE_HELP = (UNIT + "test_makefile.py::test_help_says_the_demo_serves_the_shipped_towers",)
MIGRATE = (
    INTEGRATION + "test_user_state.py::test_the_migration_command_moves_the_old_served_posts",
)
PAYLOAD = (
    SLOW + "test_gpu_payload_build.py::test_built_payload_is_under_the_limit_with_every_member",
)
MANIFESTS = "deploy/k8s is rendered with kubectl kustomize and validated offline against the "
MANIFESTS += "Kubernetes schemas (tests/unit/test_deploy_manifests.py); no cluster here"
NO_DOCKER = "no Docker here: tests/unit/test_deploy_image.py checks the Dockerfile, and "
NO_DOCKER += "tests/integration/test_deploy_serve.py runs the image's command on this machine"
SUITE = (
    "the suite itself: .ci/run runs `make test` (which runs `make setup` first) in a fresh clone"
)
GPU = "needs a GPU machine (docs/gpu.md); `bash bench/gpu/run.sh --cpu` runs the same steps here"
BENCH = "a benchmark of minutes: what it measured, and how, is in its doc"
XREX = "needs a checkout of X's x-algorithm"
CHECK_REFERENCE = (UNIT + "test_check_reference.py::test_command_passes_on_x_small_references",)
XAI_CHECKPOINT = (UNIT + "test_xai_checkpoint.py::test_the_command_lists_a_good_checkpoint",)
STORE_RESTART = (
    INTEGRATION
    + "test_store_restart.py::test_history_follows_and_served_posts_survive_a_kill_9_of_serve_and_its_store",
)
PAGED = (
    INTEGRATION
    + "test_locust.py::test_paged_users_page_through_feeds_and_the_ranker_finds_their_prefixes",
)
PRODUCTION_ARTIFACTS = INTEGRATION + "test_production_artifacts_command.py::"
NANO_ARTIFACTS = (PRODUCTION_ARTIFACTS + "test_the_nano_preset_has_xs_nano_geometry",)
CHECKPOINT_ARTIFACTS = (
    PRODUCTION_ARTIFACTS + "test_a_checkpoints_ranker_ranks_as_its_weights_loaded_any_other_way",
)
PRODUCTION_SERVE = (INTEGRATION + "test_production_serving.py::test_phoenix_rank_check_passes",)
CLEAN = "removes build outputs; tests/unit/test_makefile.py checks what serve keeps in STORE_DIR"

COMMANDS: dict[str, Ran | Help | InProcess | NotHere] = {
    # README.md, docs/serving.md: the suite's type checker
    "make typecheck": NotHere(SUITE + ": `make test` runs `make typecheck` before pytest"),
    "make clean": NotHere(CLEAN),
    "make distclean": NotHere(CLEAN + "; it removes .venv, which the suite runs in"),
    # docs/production.md
    "make check-reference REFERENCE=DIR": Ran(
        CHECK_REFERENCE, "the phoenix-check-reference it runs, DIR: tests/data/production"
    ),
    "make check-reference": Ran(CHECK_REFERENCE, "the command it runs, over tests/data/production"),
    "phoenix-check-reference DIR --forward full": Ran(
        CHECK_REFERENCE,
        "the engine's forward; the one-pass forward equals it "
        "(tests/unit/test_production_model.py::test_engine_equals_full_forward_in_float32)",
    ),
    "phoenix-check-reference DIR --attention exact --json figures.json": Ran(
        CHECK_REFERENCE, "--json as typed; the exact keys are the training-kernel set's"
    ),
    ".venv/bin/python -m phoenix.checkpoint.xai /checkpoints/home_direct_packed_nano": Ran(
        XAI_CHECKPOINT, "the tests' checkpoint, tests/data/xai_checkpoint"
    ),
    "phoenix-artifacts --ranker production --preset nano --out build/production-nano": Ran(
        NANO_ARTIFACTS, "--out: a temporary folder"
    ),
    "phoenix-artifacts --ranker production --preset tiny --out build/production-tiny": Ran(
        PRODUCTION_SERVE,
        "the served artifacts: --seed 0 --corpus-size 200, --out in build/test-cache",
    ),
    "phoenix-artifacts --ranker production --preset nano --out DIR --ranker-checkpoint /checkpoints/home_direct_packed_nano --ranker-override history_seq_len=1022 --ranker-override candidate_seq_len=64": Ran(
        CHECKPOINT_ARTIFACTS,
        "the tests' checkpoint (tests/data/xai_checkpoint, written by X's trainer code), "
        "history 126, 8 candidates and hash tables that fit its 128-row table",
    ),
    "make serve ARTIFACTS=build/production-nano": Ran(
        PRODUCTION_SERVE,
        "the tiny preset's artifacts; free ports, STORE_DIR and --build-dir in a temporary folder",
    ),
    "phoenix-rank --artifacts build/production-nano --check": Ran(
        PRODUCTION_SERVE,
        "the tiny preset (--url: the server's port); nano's 27 GFLOP a request: make "
        "bench-production serves nano",
    ),
    "make bench-production": Help(LONG, BENCH),
    # docs/user-state.md: the store serve starts
    "phoenix-events apply events.jsonl": Ran(STORE_RESTART, "the store found from serving.json"),
    "PYTHONPATH=$PWD .venv/bin/python -m bench.bench_store_persistence --rounds 5": Help(
        LONG, "the store's fsync policies side by side; " + BENCH
    ),
    # docs/performance.md, loadtest/README.md: the prefix cache
    "make bench-prefix-cache": Help(LONG, BENCH),
    "make bench-prefix-cache BENCH_ARGS=--quick": Help(LONG, BENCH),
    "make bench-prefix-cache BENCH_ARGS=--skip-paged": Help(LONG, BENCH),
    "make bench-prefix-cache BENCH_ARGS=--skip-production": Help(LONG, BENCH),
    ".venv/bin/locust -f loadtest/paged.py --headless -u 32 -r 32 -t 60s --host http://127.0.0.1:8000 --artifacts artifacts/demo": Ran(
        PAGED, "3 users for 5 s against the shared tiny server"
    ),
    # README.md, docs/serving.md
    "make demo": Ran(MAKE_DEMO, "its log and admin key in a temporary folder (DEMO_ARGS)"),
    "make demo DEMO_ARGS=--no-policy": Ran(DEMO_NO_POLICY, "on the tiny artifacts, ports given"),
    "make test": NotHere(SUITE),
    "make setup": NotHere(SUITE),
    "make setup DEVICE=gpu": NotHere(GPU),
    "make serve DEVICE=gpu": NotHere(GPU),
    "make serve": Ran(MAKE_SERVE, "its four port variables set to free ports"),
    "make help": Ran(MAKEFILE_HELP),
    "make configs": InProcess(
        (UNIT + "test_configs.py::test_check_reports_a_stale_config_and_make_configs_mends_it",),
        "its generators' main(); every generated file is compared with what they write",
    ),
    "make test-unit": NotHere(SUITE),
    "make test-durations": NotHere(SUITE + "; tests/unit/test_record_durations.py its parser"),
    "make artifacts": Ran(
        OWN_SERVER_LOADTEST, "make loadtest's first step, ARTIFACTS the tiny ones"
    ),
    "make serve ARTIFACTS=/path/to/checkpoint": Ran(MAKE_SERVE, "the same command, its default"),
    "make serve ARTIFACTS=artifacts/big HTTP_PORT=9000": Ran(MAKE_SERVE, "the same command"),
    "make serve ARTIFACTS=artifacts/trained-demo": Ran(MAKE_SERVE, "what it serves by default"),
    "python -m phoenix.ops.compile --artifacts DIR": Ran(COMPILE, "DIR: the tiny artifacts"),
    "python -m phoenix.ops.compile --artifacts DIR --force": InProcess(
        (UNIT + "test_compile.py::test_a_second_run_is_up_to_date_and_force_loads_everything",),
        "--force loads or compiles every program: minutes on the mini preset",
    ),
    "curl -s 127.0.0.1:8000/v2/health/ready -o /dev/null -w '%{http_code}\\n'": Ran(CURL),
    "curl -s 127.0.0.1:8000/v2/models/<model>/config": Ran(CURL, "<model>: ranker"),
    "curl -s 127.0.0.1:8002/metrics | grep -E '^(nv_inference|phoenix_)'": Ran(CURL),
    "export LD_LIBRARY_PATH=$(.venv/bin/python -c 'import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], \"lib\"))')": NotHere(
        "the set-up of perf_analyzer by hand, below; bench/bench_serving.py does the same"
    ),
    ".venv/bin/perf_analyzer -m <model> -u 127.0.0.1:8000 --concurrency-range 1:8": NotHere(
        "a measurement by hand, windows of seconds per concurrency; bench/gpu/run.sh --cpu's "
        "serving step runs perf_analyzer with the same library path (test_gpu_bench_smoke.py)"
    ),
    # docs/deploy.md
    "docker build -f deploy/image/Dockerfile --target cpu -t registry.example.com/phoenix-serve:0.1.0-cpu .": NotHere(
        NO_DOCKER
    ),
    "docker build -f deploy/image/Dockerfile --target gpu -t registry.example.com/phoenix-serve:0.1.0-gpu .": NotHere(
        NO_DOCKER
    ),
    "docker push registry.example.com/phoenix-serve:0.1.0-cpu": NotHere(NO_DOCKER),
    "docker run --rm --shm-size=1g -p 8000-8003:8000-8003 -v $PWD/artifacts/demo:/models/artifacts:ro registry.example.com/phoenix-serve:0.1.0-cpu": NotHere(
        NO_DOCKER
    ),
    "curl -s localhost:8003/ready": Ran(MAKE_SERVE, "against make serve's supervisor"),
    "kubectl create namespace phoenix": NotHere(MANIFESTS),
    "kubectl -n phoenix create secret generic phoenix-admin-key --from-literal=key=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')": NotHere(
        MANIFESTS
    ),
    "kubectl -n phoenix create secret generic phoenix-redis --from-literal=url='redis+cluster://:PASSWORD@redis-cluster.redis.svc:6379'": NotHere(
        MANIFESTS
    ),
    "kubectl -n phoenix apply -k deploy/k8s/overlays/cpu": NotHere(MANIFESTS),
    "kubectl -n phoenix rollout status deploy/phoenix-serve --timeout=20m": NotHere(MANIFESTS),
    "kubectl -n phoenix port-forward svc/phoenix-serve-http 8000 &": NotHere(MANIFESTS),
    "curl -s localhost:8000/v2/models/recommend/config | head": Ran(CURL, "against make serve"),
    "make soak": Help(LONG, "10 minutes at half capacity; " + BENCH),
    "make bench-replicas": Help(LONG, "two replicas behind nginx, ~10 min; " + BENCH),
    # docs/gpu.md
    "make gpu-payload": InProcess(PAYLOAD, "harness.gpu_payload's main() builds it whole"),
    'make gpu-payload GPU_PAYLOAD_ARGS="--also einops --python-version 3.12 --tree-limit-mib 64"': InProcess(
        PAYLOAD, "the same build, default options"
    ),
    "python3 -m harness.gpu_machine --payload .gpu": Help(LONG, GPU),
    "bash bench/gpu/run.sh": NotHere(GPU),
    "bash bench/gpu/run.sh --steps engine,retrieval": NotHere(GPU),
    "bash bench/gpu/run.sh --cpu": Ran(GPU_SMOKE),
    "python -m harness.gpu_bench.report": InProcess(
        (
            UNIT
            + "test_gpu_report.py::test_check_fails_on_a_changed_figure_and_passes_once_rendered",
        ),
        "it rewrites docs/performance.md: a copy of it is rewritten",
    ),
    "python -m harness.gpu_bench.report --check": Ran(GPU_CHECK),
    # docs/gpu.md, "X's own forward": X's release is the user's checkout, never in this repository
    "python -m harness.xrex_release X_PHOENIX_DIR": Help(
        LONG, XREX + "; tests/unit/test_xrex_harness.py packs a release-shaped tree through it"
    ),
    "python -m bench.bench_xrex --payload build/xrex --x-python X_PYTHON --small --batches 1,4": Help(
        LONG, XREX + " and a Python with X's dependencies; docs/gpu.md gives what it measured"
    ),
    # docs/loop.md
    "make loop": Ran(
        LOOP,
        "LOOP_ARGS: docs/loop.md's shortened command; v1 loads the programs of the suite's "
        "trained tiny artifacts ($PHOENIX_PROGRAM_STORE)",
    ),
    'make loop LOOP_ARGS="--world-seed 1"': Ran(LOOP, "the short LOOP_ARGS instead"),
    'make loop LOOP_ARGS="--minutes 3 --users 32"': Ran(LOOP, "the short LOOP_ARGS instead"),
    "python -m phoenix.loop --help": Ran(LONG),
    "python -m phoenix.loop --world-seed 1 --work build/loop-seed1 --out build/loop-runs/world-seed1": Ran(
        LOOP, "through make loop, short"
    ),
    "python -m phoenix.loop --world-seed 2 --work build/loop-seed2 --out build/loop-runs/world-seed2": Ran(
        LOOP, "through make loop, short"
    ),
    "python -m phoenix.loop": Ran(LOOP, "through make loop, short"),
    "python -m phoenix.loop --preset tiny --minutes 0.3 --users 4 --v1-retrieval-steps 20 --v1-ranker-steps 20 --v2-retrieval-steps 10 --v2-ranker-steps 10 --shadow-seconds 3 --settle-seconds 3 --work build/loop-tiny --out build/loop-tiny-out": Ran(
        LOOP, "through make loop, its --work and --out temporary"
    ),
    # docs/performance.md
    "make bench-serving": Help(LONG, BENCH),
    "make bench-serving BENCH_ARGS=--quick": Help(LONG, "its quick mode still takes ~3 minutes"),
    ".venv/bin/python bench/bench_serving.py --help": Ran(LONG),
    "make bench-recommend-host": Help(LONG, BENCH),
    "make bench-engine": Help(LONG, BENCH),
    "make bench-service-host": Help(LONG, BENCH),
    "make bench-startup": Help(LONG, BENCH),
    "make bench-retrieval": Help(LONG, "1 M and 10 M posts; " + BENCH),
    "make bench-store-serving": Help(LONG, BENCH),
    'make bench-retrieval BENCH_ARGS="--keep --work build/bench-store-serving/artifacts --out bench/results/retrieval-xeon-avx512.json"': Help(
        LONG, BENCH
    ),
    "make bench-retrieval BENCH_ARGS=--keep": Help(LONG, BENCH),
    'make bench-store-serving BENCH_ARGS="--out bench/results/retrieval-serving-xeon-avx512.json"': Help(
        LONG, BENCH
    ),
    # docs/policy.md
    ".venv/bin/python -m clients.feed_policy": Ran(POLICY, "--url: make serve's port"),
    ".venv/bin/python -m clients.feed_policy --set author_diversity_decay=0.7 --set author_diversity_floor=0.2": Ran(
        POLICY, "--url: make serve's port"
    ),
    ".venv/bin/python -m clients.feed_policy --weight report=-200 --weight reply=20": Ran(
        POLICY, "--url: make serve's port"
    ),
    # docs/reliability.md
    "make test-reliability": NotHere(SUITE + ": make test runs these tests"),
    "make test-reliability-long": NotHere(SUITE + ": the long versions of tests make test runs"),
    "make bench-reliability": Help(LONG, "20 SIGTERMs under load; " + BENCH),
    "curl -s localhost:8000/v2/models/retriever/config > cfg.json": Ran(RELOAD_BY_HAND),
    "python - <<'EOF'": Ran(RELOAD_BY_HAND, "the heredoc as written, its port put in"),
    # docs/retrieval.md
    "phoenix-build-corpus --from-generator 1000000 --in-process --store artifacts/trained-demo/store --artifacts artifacts/trained-demo": Ran(
        BUILD_STORE, "2,000 posts, into a temporary store"
    ),
    "phoenix-serve --artifacts artifacts/trained-demo --corpus store": InProcess(
        (
            INTEGRATION
            + "test_corpus_store_serving.py::test_the_store_answers_as_the_corpus_file_does",
        ),
        "a server over a store (the harness's, serve's options); --corpus: tests/unit/test_serve_signals.py",
    ),
    "phoenix-build-corpus posts.csv --in-process --artifacts artifacts/v2 --store artifacts/v2/store": Ran(
        BUILD_STORE, "a posts.csv of its own, a temporary store"
    ),
    "phoenix-serve --artifacts artifacts/v2 --corpus store": InProcess(
        (
            INTEGRATION
            + "test_corpus_store_serving.py::test_the_store_answers_as_the_corpus_file_does",
        ),
        "as above",
    ),
    "phoenix-build-corpus --from-generator 10000000 --in-process --window 48h --store artifacts/trained-demo/store --artifacts artifacts/trained-demo": Ran(
        BUILD_STORE, "2,000 posts, a temporary store"
    ),
    "phoenix-build-corpus posts.csv --store artifacts/demo/store --reload": InProcess(
        (INTEGRATION + "test_clients.py::test_build_corpus_reload_switches_the_retriever",),
        "build_corpus.main with --reload against a server of the test's own",
    ),
    "phoenix-ingest posts.jsonl --store artifacts/trained-demo/store --create --artifacts artifacts/trained-demo": Ran(
        BUILD_STORE, "a temporary store"
    ),
    "phoenix-ingest events.jsonl --follow --store artifacts/trained-demo/store --artifacts artifacts/trained-demo": InProcess(
        (
            UNIT
            + "test_ingest.py::test_follow_reads_a_growing_file_until_signalled_and_flushes_what_it_holds",
        ),
        "--follow runs until signalled",
    ),
    "producer | phoenix-ingest - --store artifacts/trained-demo/store --embed served": InProcess(
        (UNIT + "test_ingest.py::test_the_loop_flushes_by_count_by_time_and_at_the_end",),
        "stdin and a server's tower: the ingest loop in process",
    ),
    "phoenix-compact --store artifacts/trained-demo/store --window 48h": Ran(BUILD_STORE),
    "phoenix-compact --store artifacts/trained-demo/store --every 300": InProcess(
        (UNIT + "test_compact.py::test_every_repeats_until_stopped",),
        "--every runs until signalled",
    ),
    "kafka-console-consumer --bootstrap-server kafka:9092 --topic post-events --group phoenix-ingest | phoenix-ingest - --follow --store /artifacts/store --embed served": NotHere(
        "no Kafka here; phoenix-ingest reading stdin: the line above"
    ),
    # docs/rollout.md
    "phoenix-serve --artifacts artifacts/v1": Ran(
        (
            ROLLOUT
            + "test_a_failed_gate_a_missing_corpus_and_the_served_label_are_refused_before_any_load",
        ),
        "python -m phoenix.ops.serve on the tiny artifacts",
    ),
    "phoenix-compile --artifacts artifacts/v2": Ran(COMPILE, "the tiny artifacts"),
    "phoenix-rollout artifacts/v2 --shadow-seconds 30": Ran(ROLLOUT_HTTP_GRPC, "a 2 s shadow"),
    "phoenix-rollout --rollback": Ran(ROLLOUT_HTTP_GRPC, "over gRPC"),
    "phoenix-rollout artifacts/v2 --url 127.0.0.1:8001 --protocol grpc": Ran(
        (ROLLOUT + "test_a_rollout_killed_part_way_is_rolled_back_from_its_report",),
    ),
    ".venv/bin/python -m pytest tests/integration/test_rollout_command.py -q -s": NotHere(SUITE),
    ".venv/bin/python -m pytest tests/unit/test_rollout.py tests/unit/test_supervisor.py -q": NotHere(
        SUITE
    ),
    # docs/training.md
    "python -m phoenix.training --help": Ran(LONG),
    "python -m phoenix.training pipeline --preset demo --out artifacts/trained-demo": InProcess(
        (
            SLOW
            + "test_training_pipeline.py::test_training_lowers_the_loss_and_beats_random_weights",
        ),
        "the pipeline on the tiny preset; the demo preset's own run: tests/slow/test_shipped_demo.py",
    ),
    "make train TRAIN_PRESET=mini": Help(LONG, "trains for minutes; the pipeline: the line above"),
    "make train": Help(LONG, "trains for minutes"),
    "make train TRAIN_PRESET=demo": Help(LONG, "trains for minutes"),
    "make bench-training": Help(LONG, BENCH),
    "python -m phoenix.training served-logs --redis redis://127.0.0.1:6379/0 --artifacts artifacts/trained-demo --out build/served-demo --top-n 10": InProcess(
        RETRAIN, "main() on the tiny preset's served logs"
    ),
    "python -m phoenix.training pipeline --logs build/served-demo --init artifacts/trained-demo --out build/trained-demo-v2": InProcess(
        RETRAIN, "main() warm from the tiny preset"
    ),
    "cat build/trained-demo-v2/gate.json": InProcess(RETRAIN, "the test reads gate.json"),
    # docs/user-state.md
    ".venv/bin/python -m phoenix.user_state.served migrate redis://HOST:6379/0": InProcess(
        MIGRATE, "main(['migrate', URL])"
    ),
    'make bench-user-state BENCH_ARGS="--artifacts artifacts/trained-demo --rounds 4"': Help(
        LONG, BENCH
    ),
    "PYTHONPATH=$PWD .venv/bin/python -m bench.user_state_memory --users 8 --out bench/results/user_state_memory.json": Help(
        LONG, BENCH
    ),
    # docs/design/corpus-index.md: the measurements of the index's design
    "python -m bench.compare_ann --posts 1000000 --designs sq8:200,pq64x4fs:1000 --threads 1,2 --out bench/results/compare_ann_1m.json": Help(
        LONG, BENCH
    ),
    "python -m bench.compare_ann --posts 10000000 --threads 2 --designs sq8:200,pq64x4fs:1000,pq64x4fs:2000,pq64x4fs:3000 --out bench/results/compare_ann_10m.json": Help(
        LONG, BENCH
    ),
    "python -m bench.compare_ann --posts 1000000 --threads 1,2 --passes 2 --designs pq64x4fs:1000,pq64x4fs+spill:1000:0.5,pq64x4fs+spill:1000:0.35,pq64x4fs+spill:1000:0.25,pq64x4fs+spill:600:0.35 --out bench/results/compare_ann_spill_1m.json": Help(
        LONG, BENCH
    ),
    "python -m bench.compare_ann --posts 10000000 --threads 1,2 --passes 1 --designs pq64x4fs:2000,pq64x4fs+spill:2000:0.35,pq64x4fs+spill:1200:0.35,pq64x4fs+spill:1200:0.5 --out bench/results/compare_ann_spill_10m.json": Help(
        LONG, BENCH
    ),
    # loadtest/README.md
    "make loadtest": Ran(OWN_SERVER_LOADTEST, "ARTIFACTS: the tiny ones; 2 users, 6 s"),
    "make loadtest LOADTEST_USERS=16 LOADTEST_TIME=2m ARTIFACTS=artifacts/other": Ran(
        OWN_SERVER_LOADTEST, "the same variables, 2 users for 6 s, the tiny artifacts"
    ),  # fmt: skip
    "make loadtest HOST=10.0.0.5 HTTP_PORT=8000 GRPC_PORT=8001 ARTIFACTS=artifacts/demo": Ran(
        LOADTEST, "against the suite's server on this machine, the tiny artifacts"
    ),  # fmt: skip
    ".venv/bin/locust -f loadtest/locustfile.py --host http://10.0.0.5:8000 --grpc-url 10.0.0.5:8001 --artifacts artifacts/demo": Ran(
        LOCUST, "headless for 6 s, against make serve (a server with a store)"
    ),
    ".venv/bin/locust -f loadtest/reacting.py --headless -u 8 -r 8 -t 60s --grpc-url 127.0.0.1:8001 --redis-url redis://127.0.0.1:6379/0 --artifacts artifacts/trained-demo --version-label trained-demo": Ran(
        REACTING, "python -m locust, a few users for seconds"
    ),
}


# ---- reading the docs --------------------------------------------------------------------


def doc_files() -> list[Path]:
    return [path for pattern in DOCS for path in sorted(REPO_ROOT.glob(pattern))]


def without_comment(line: str) -> str:
    """The line up to a shell comment (a # after a blank, outside quotes)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def block_commands(language: str, body: str) -> list[str]:
    """The commands of one code block: continued lines joined, comments and heredoc bodies
    left out; in an unmarked block only lines that start with a command word."""
    commands, pending, heredoc = [], "", None
    for line in body.splitlines():
        if heredoc is not None:
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        text = without_comment(line).rstrip()
        if text.endswith("\\"):
            pending += text[:-1].strip() + " "
            continue
        command, pending = " ".join((pending + text).split()), ""
        if command:
            commands.append(command)
            if opened := re.search(r"<<-?'?(\w+)'?", command):
                heredoc = opened[1]
    if language in SHELL_BLOCKS:
        return commands
    return [c for c in commands if COMMAND_WORD.fullmatch(c.split()[0])]


def documented_commands() -> dict[str, list[str]]:
    """Every documented command -> the docs that give it."""
    found: dict[str, list[str]] = {}
    for path in doc_files():
        text = path.read_text()
        name = path.relative_to(REPO_ROOT).as_posix()
        for block in FENCE.finditer(text):
            if block[1] in SHELL_BLOCKS or block[1] == "":
                for command in block_commands(block[1], block[2]):
                    found.setdefault(command, []).append(name)
        for inline in re.finditer(r"`(make [^`]+)`", FENCE.sub("", text)):
            found.setdefault(" ".join(inline[1].split()), []).append(name)
    return found


def programs(command: str) -> set[str]:
    """What a test that runs ``command`` must name: its make target, installed script (or
    the module behind it), module, script file or URL path."""
    words = [w for w in command.split() if not re.fullmatch(r"[A-Z_]+=\S*", w)]
    first = words[0]
    if first == "make":
        return {words[1]}
    if first.startswith("phoenix-"):
        return {first, SCRIPTS[first].partition(":")[0]}
    if first == "curl":
        return {re.sub(r"^[\w.]+:\d+", "", next(w for w in words if ":80" in w))}
    if first in ("bash", "cat") or first.endswith("locust"):
        return {Path(next(w for w in words[1:] if "/" in w)).name}
    if re.fullmatch(r"(\.venv/bin/)?python3?", first):
        if words[1] == "-m":
            return {words[2]}
        return {"python -" if words[1] == "-" else Path(words[1]).name}
    return {first}


# ---- the tests ---------------------------------------------------------------------------


def test_every_documented_command_has_a_line_and_every_line_a_documented_command():
    documented = documented_commands()
    missing = {c: where for c, where in documented.items() if c not in COMMANDS}
    assert not missing, "documented commands without a line in COMMANDS:\n" + "\n".join(
        f"  {c!r}  ({', '.join(where)})" for c, where in missing.items()
    )
    stale = sorted(set(COMMANDS) - set(documented))
    assert not stale, f"COMMANDS lines no doc gives any more: {stale}"


def test_every_named_test_exists_and_names_the_commands_program():
    """A test that claims a command defines itself in its file, and the file names the
    command's program (its make target, script, module or URL path)."""
    problems = []
    for command, coverage in COMMANDS.items():
        for test in getattr(coverage, "tests", ()):
            path, _, name = test.partition("::")
            source = (REPO_ROOT / path).read_text() if (REPO_ROOT / path).is_file() else ""
            tree = ast.walk(ast.parse(source))
            defined = {node.name for node in tree if isinstance(node, ast.FunctionDef)}
            if name not in defined:
                problems.append(f"{test}: no such test (for {command!r})")
            elif isinstance(coverage, Ran | Help) and not any(
                program in source for program in programs(command)
            ):
                problems.append(f"{test} names none of {programs(command)} (for {command!r})")
    assert not problems, "\n".join(problems)


def test_the_reader_finds_commands_as_a_user_would_type_them():
    body = (
        'make loop LOOP_ARGS="--minutes 3"   # a comment\n'
        "python -m phoenix.loop --preset tiny \\\n    --users 4\n"
        "python - <<'EOF'\nprint('not a command')\nEOF\n"
    )
    assert block_commands("sh", body) == [
        'make loop LOOP_ARGS="--minutes 3"',
        "python -m phoenix.loop --preset tiny --users 4",
        "python - <<'EOF'",
    ]
    listing = "store/\n  manifest.json   generation\nphoenix-compact --store S --window 48h\n"
    assert block_commands("", listing) == ["phoenix-compact --store S --window 48h"]
    assert programs("curl -s localhost:8003/ready") == {"/ready"}
    assert programs("phoenix-ingest - --store S") == {"phoenix-ingest", "clients.ingest"}


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on PATH")
def test_every_documented_make_command_is_one_make_accepts():
    """`make -n` of each (nothing runs): a target that exists, variables and options make
    takes."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    refused = []
    for command in sorted(c for c in documented_commands() if c.startswith("make ")):
        done = subprocess.run(["make", "-n", "--no-print-directory", *shlex.split(command)[1:]],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        if done.returncode != 0:
            refused.append(f"{command}: {done.stderr.strip()[-300:]}")
    assert not refused, "\n".join(refused)
