# Phoenix Serve: set up, build demo artifacts, serve on Triton, test.  `make help` lists targets.
# Setup steps are file-timestamp targets, so a repeated `make setup` does nothing.

SHELL := /bin/bash
.DEFAULT_GOAL := help
# Python writes the bytecode of what it imports, for this project's commands, even where the
# environment says not to (PYTHONDONTWRITEBYTECODE, set on many CI machines and images):
# otherwise every process compiles jax, numpy and phoenix from source again, each test
# worker and each command a test runs (2 s a process here). It goes to __pycache__ folders,
# which git ignores and `make clean` removes.
unexport PYTHONDONTWRITEBYTECODE
# uv's own switch for compiling every installed module up front (set in some uv-based images)
unexport UV_COMPILE_BYTECODE

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUFF := $(VENV)/bin/ruff
BACKEND_DIR := $(VENV)/triton-backends
STAMPS := build/stamps

# ARTIFACTS given (command line or environment) or not: `make serve` serves it, else the
# trained demo towers (SERVED_ARTIFACTS below). The default is what `make artifacts` builds
# and the benchmarks measure: the untrained mini preset.
ARTIFACTS_GIVEN := $(filter command line environment override,$(origin ARTIFACTS))
ARTIFACTS ?= artifacts/demo
DEMO_ARTIFACTS ?= artifacts/trained-demo
# What `make serve` serves (and what `make loadtest` against a running server assumes it
# serves): ARTIFACTS where given, else the towers `make demo` serves, which ship in the
# repository and which the README's examples call.
SERVED_ARTIFACTS = $(if $(ARTIFACTS_GIVEN),$(ARTIFACTS),$(DEMO_ARTIFACTS))
DEVICE ?= cpu
HOST ?= 127.0.0.1
HTTP_PORT ?= 8000
GRPC_PORT ?= 8001
METRICS_PORT ?= 8002
SUPERVISOR_PORT ?= 8003
# The user-state store `make serve` starts (recommend by user id reads it; phoenix-events finds
# it through build/serve/serving.json): its data stays in STORE_DIR across restarts (empty
# STORE_DIR: a throwaway store), on 127.0.0.1:STORE_PORT. REDIS=URL names a running store
# instead (so does $PHOENIX_USER_STATE_URL, which serve reads itself). docs/user-state.md.
STORE_DIR ?= build/serve/user-state
STORE_PORT ?= 8004
REDIS ?=
# more phoenix-serve options for `make serve`, e.g. SERVE_ARGS="--store-fsync always"
SERVE_ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` and `make test-unit` (0: one process, as before). In
# one process the suite kept the 2 cores 63% busy (measured); two workers use the rest. Tests
# marked `serial` (time bounds) run alone first.
TEST_WORKERS ?= 2
# e.g. DEMO_ARGS=--no-policy: the ranker's own ranking beside the feed
DEMO_ARGS ?=

# The backend stub links the system libpython of the venv's Python; perf_analyzer needs libb64;
# nginx is the L7 proxy of `make bench-replicas` (Debian's build has the gRPC proxy module);
# redis-server keeps user state (phoenix/user_state; its tests start real servers and a
# cluster), redis-tools gives the redis-cli that creates the test cluster.
PY_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')
SYSTEM_PACKAGES ?= libpython$(PY_VERSION) libb64-0d nginx redis-server redis-tools
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

SYSTEM_STAMP := $(STAMPS)/system-packages
# One stamp per DEVICE: `make setup DEVICE=gpu` after a CPU set-up adds the CUDA wheels.
REQUIREMENTS_STAMP := $(VENV)/.requirements-installed-$(DEVICE)
BACKEND_STAMP := $(BACKEND_DIR)/.phoenix-backend-dir
INSTALL_STAMP := $(VENV)/.phoenix-installed
SERVE_PORTS = --host $(HOST) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT) \
	--metrics-port $(METRICS_PORT) --supervisor-port $(SUPERVISOR_PORT)
SERVE_STORE = $(if $(REDIS),--redis '$(REDIS)',$(if $(PHOENIX_USER_STATE_URL),,$(if \
	$(STORE_DIR),--store-dir '$(STORE_DIR)',--ephemeral-store) --store-port $(STORE_PORT)))
# $(call given,VARIABLE): non-empty when VARIABLE was set on the command line or in the
# environment, not by this file's default
given = $(filter command line environment override,$(origin $(1)))
# `make demo`: the ports given, the others free ones (the demo runs no supervisor)
DEMO_PORTS = $(strip $(if $(call given,HTTP_PORT),--http-port $(HTTP_PORT)) \
	$(if $(call given,GRPC_PORT),--grpc-port $(GRPC_PORT)) \
	$(if $(call given,METRICS_PORT),--metrics-port $(METRICS_PORT)))

.PHONY: help setup artifacts configs serve demo test test-durations test-unit typecheck lint format \
	clean distclean

help:  ## list the targets
	@echo "Targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'
	@echo "Variables: ARTIFACTS=$(ARTIFACTS) (make serve: $(SERVED_ARTIFACTS)) DEVICE=cpu|gpu"
	@echo "           HOST=$(HOST) HTTP_PORT=$(HTTP_PORT) GRPC_PORT=$(GRPC_PORT)" \
		"METRICS_PORT=$(METRICS_PORT) SUPERVISOR_PORT=$(SUPERVISOR_PORT)"
	@echo "           TEST_WORKERS=$(TEST_WORKERS) PYTEST_ARGS=... (make demo: the *_PORT" \
		"given, free ones for the others)"
	@echo "           STORE_DIR=$(STORE_DIR) (the user-state store's data; empty: throwaway)"
	@echo "           STORE_PORT=$(STORE_PORT) REDIS=URL (a running store instead) SERVE_ARGS=..."

setup: $(BACKEND_STAMP) $(INSTALL_STAMP)  ## system libraries, .venv with requirements + this project (editable), backend folder

# The list itself is a stamp, rewritten only when it changes: a checkout that adds a package
# installs it on the next `make setup` (the venv does not depend on it, so it is not rebuilt).
$(STAMPS)/system-packages.list: FORCE
	$(call write_stamp,$(SYSTEM_PACKAGES))

$(SYSTEM_STAMP): $(STAMPS)/system-packages.list
	@mkdir -p $(@D)
	@if dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1; then \
		echo "system packages already installed: $(SYSTEM_PACKAGES)"; \
	elif command -v apt-get >/dev/null; then \
		$(SUDO) apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y --no-install-recommends $(SYSTEM_PACKAGES); \
	else \
		echo "no apt-get here: install $(SYSTEM_PACKAGES) yourself" >&2; \
	fi
	@touch $@

# Order-only: a newer stamp must not rebuild the venv.
$(PY): | $(SYSTEM_STAMP)
	$(PYTHON) -m venv $(VENV)

# The venv gets uv first (requirements-setup.txt pins it; a new pin reaches an existing venv):
# it installs the same pinned wheels as pip, unpacking them in parallel (a fresh venv's
# requirements in 4 s here, pip's 28 s). Without it (no uv wheel) every install below is pip's.
UV := $(VENV)/bin/uv
INSTALLER_STAMP := $(VENV)/.installer-installed
$(INSTALLER_STAMP): requirements-setup.txt | $(PY)
	$(PY) -m pip install --quiet --no-compile -r requirements-setup.txt \
		|| echo "uv not installed: pip installs the requirements" >&2
	@touch $@

# $(call venv_install,ARGS): `uv pip install ARGS` into the venv, or pip's where uv is missing or
# fails (an index that only pip's own configuration names, which uv does not read).
venv_install = if [ -x $(UV) ] && $(UV) pip install --python $(PY) $(1); then :; \
	else $(PY) -m pip install --no-compile $(1); fi

# DEVICE=gpu adds JAX's CUDA wheels (requirements-gpu.txt). constraints.txt pins every
# transitive package, so the installer never backtracks and two set-ups get the same versions.
# No bytecode at install (uv's default, pip's --no-compile): Python writes the bytecode of what
# is imported on first import (see PYTHONDONTWRITEBYTECODE above); compiling every module of
# every wheel up front cost a fresh set-up 14 s to 18 s for modules never imported.
GPU_REQUIREMENTS := $(if $(filter gpu,$(DEVICE)),-r requirements-gpu.txt)
$(REQUIREMENTS_STAMP): requirements.txt requirements-dev.txt requirements-server.txt \
		constraints.txt $(INSTALLER_STAMP)
	$(call venv_install,-c constraints.txt -r requirements.txt -r requirements-dev.txt \
		$(GPU_REQUIREMENTS))
	$(call venv_install,--no-deps -r requirements-server.txt)
	@touch $@

# perf_analyzer comes only in the tritonclient 2.51.0 wheel; the venv's tritonclient is newer
# (numpy 2), so the binary alone is taken out of that wheel.
PERF_ANALYZER := $(VENV)/bin/perf_analyzer
PERF_ANALYZER_WHEEL := tritonclient==2.51.0
$(PERF_ANALYZER): | $(REQUIREMENTS_STAMP)
	$(PY) -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
		-d build/wheels $(PERF_ANALYZER_WHEEL)
	$(PY) -m harness.perf_analyzer --extract build/wheels --to $@

# The project itself, editable: `phoenix`, `clients` and `bench` import from this checkout
# and the console scripts (phoenix-serve, ...) land in .venv/bin.
$(INSTALL_STAMP): pyproject.toml $(REQUIREMENTS_STAMP)
	$(call venv_install,--no-deps -e .)
	@touch $@

$(BACKEND_STAMP): $(REQUIREMENTS_STAMP) $(PERF_ANALYZER) phoenix/ops/triton_install.py
	$(PY) -m phoenix.ops.triton_install --build-backend-dir $(BACKEND_DIR)
	@touch $@

# $(ARTIFACTS)/config.json: its rule is under "artifact directories" at the end
artifacts: $(ARTIFACTS)/config.json  ## demo artifacts (mini preset) in ARTIFACTS unless present, and their compiled programs
	$(PY) -m phoenix.ops.compile --artifacts $(ARTIFACTS) --device $(DEVICE)

# serve builds missing programs itself (phoenix.ops.compile), before Triton starts
serve: setup $(SERVED_ARTIFACTS)/config.json  ## run Triton and the user-state store in the foreground: the trained demo towers unless ARTIFACTS (DEVICE, HOST, *_PORT, STORE_DIR, REDIS)
	$(PY) -m phoenix.ops.serve --artifacts $(SERVED_ARTIFACTS) --device $(DEVICE) $(SERVE_PORTS) $(SERVE_STORE) $(SERVE_ARGS)

# The demo picks free ports unless HTTP_PORT, GRPC_PORT or METRICS_PORT is given, so it also
# works beside a running `make serve`, and says which it uses. It serves the towers trained on
# synthetic logs that ship in artifacts/trained-demo (see "training" below).
demo: setup $(DEMO_ARTIFACTS)/config.json  ## serve the shipped trained demo towers, recommend, stop
	$(PY) -m clients.demo --artifacts $(DEMO_ARTIFACTS) --device $(DEVICE) --host $(HOST) $(DEMO_PORTS) $(DEMO_ARGS)

configs: setup  ## write the model_repository configs, the typed request classes, docs/deploy.md's stub table and the model reference (docs/reference.md, README's table) from the contracts and profiles
	$(PY) -m phoenix.ops.configs
	$(PY) -m phoenix.ops.request_code
	$(PY) -m phoenix.ops.profile_docs
	$(PY) -m phoenix.ops.reference_docs

# `make typecheck`'s commands (said below it). `test` runs them through this variable, not
# `$(MAKE) typecheck`: make runs a recipe line that names $(MAKE) even under `make -n`, and that
# line of `test` also starts the fixture builds and pytest.
TYPECHECK = echo "$(PY) -m mypy"; $(PY) -m mypy || exit 1; \
	for model in model_repository/*/1/model.py; do \
		echo "$(PY) -m mypy $$model"; $(PY) -m mypy --no-error-summary $$model || exit 1; \
	done

# Two runs. First the tests marked `serial` (they assert time bounds) with nothing else at
# normal priority; they keep about one of the two cores busy, so the suite's shared builds
# (tests/fixture_builds.py: artifacts, training, programs) are made beside them, all but the
# tiny artifacts the serial tests wait for at nice 19, on what they leave idle (their log:
# build/test-fixture-builds.log; a build that fails there is made again by the test that needs
# it; made ones are found in a moment). Then every other test on TEST_WORKERS workers, a test
# file per worker (module fixtures start once), in tier order (PHOENIX_TEST_LONGEST_FIRST=1:
# the longest files of tests/durations.json first, --no-loadscope-reorder keeping the order
# the workers collected in; tests/conftest.py says why it is not the default). The two
# workers keep both cores busy (1.85 of 2 on average over the parallel run, sampled every 2 s):
# a third finds no idle core.
# Exit 5 is pytest's "no test selected": a PYTEST_ARGS filter may leave one run empty.
# PYTEST_ARGS must not hold -m (it would replace the runs' own).
test: setup  ## ruff check, mypy (typecheck), the `serial` tests alone (the shared builds beside both), then the rest of the suite on TEST_WORKERS workers
	$(RUFF) check .
	@mkdir -p build
	@$(PY) -m tests.fixture_builds > build/test-fixture-builds.log 2>&1 & builds=$$!; \
	trap 'kill $$builds 2>/dev/null; exit 130' INT; trap 'kill $$builds 2>/dev/null; exit 143' TERM; \
	echo "make typecheck  (beside it and the serial tests: $(PY) -m tests.fixture_builds)"; \
	( $(TYPECHECK) ) || { kill $$builds 2>/dev/null; exit 1; }; \
	echo "$(PY) -m pytest tests -q -m serial $(PYTEST_ARGS)"; \
	$(PY) -m pytest tests -q -m serial $(PYTEST_ARGS); serial=$$?; \
	if wait $$builds; then tail -n 4 build/test-fixture-builds.log; \
	else echo "warning: a shared build failed (build/test-fixture-builds.log); the tests that need it build it again"; fi; \
	[ $$serial -eq 0 ] || [ $$serial -eq 5 ]
	$(PY) -m pytest tests -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		-m "not serial" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]

# make test, then tests/durations.json rewritten from its durations (commit it when the
# suite's long files change)
test-durations: setup  ## make test with pytest's durations, then tests/durations.json from them
	set -o pipefail; $(MAKE) --no-print-directory test \
		PYTEST_ARGS="--durations=0 --durations-min=1.0" | tee build/test-durations.log
	$(PY) -m tests.record_durations build/test-durations.log

# The quick tier while editing (about 2.5 min on 2 cores, two workers); `make test` runs it too.
test-unit: setup  ## the unit tests only (tests/unit): in process, no server, no training
	$(PY) -m pytest tests/unit -q -n $(TEST_WORKERS) $(PYTEST_ARGS)

# mypy as pyproject.toml's [tool.mypy] sets it (its default checks, and the bodies of functions
# without annotations too) over phoenix, clients, bench, harness and loadtest; then each
# model_repository/*/1/model.py on its own (all eight are module `model`: one run can hold one).
# Its cache (.mypy_cache) makes a second run quick; `make clean` removes it.
typecheck: setup  ## mypy over the product (the level: docs/serving.md, "Tests")
	@$(TYPECHECK)

lint: setup  ## ruff check and ruff format --check
	$(RUFF) check .
	$(RUFF) format --check .

format: setup  ## ruff format and ruff check --fix
	$(RUFF) format .
	$(RUFF) check --fix .

# clean keeps the user-state store's data (STORE_DIR, under build/ by default); distclean not.
STORE_KEPT = $(patsubst ./%,%,$(STORE_DIR:%/=%))
clean:  ## remove build outputs and caches (keeps .venv, artifacts and the store's data in STORE_DIR)
	if [ -d build ]; then find build -mindepth 1 -depth ! -path '$(STORE_KEPT)' \
		! -path '$(STORE_KEPT)/*' ! -type d -delete; \
		find build -mindepth 1 -depth -type d -empty -delete; fi
	rm -rf .pytest_cache .ruff_cache .mypy_cache .hypothesis
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean  ## also remove .venv, the built artifacts (the shipped trained demo stays) and build/ with the store's data
	rm -rf $(VENV) artifacts/trained-demo/compiled build
	find artifacts -mindepth 1 -maxdepth 1 ! -name trained-demo -exec rm -rf {} +

# ---- X's production ranker against reference data written with X's code (docs/production.md)
REFERENCE ?=
CHECK_REFERENCE_ARGS ?=

.PHONY: check-reference
check-reference: setup  ## production ranker vs X's outputs in REFERENCE=DIR (CHECK_REFERENCE_ARGS=--forward full); exit 0 within the tolerances
	@if [ -z "$(REFERENCE)" ]; then echo "usage: make check-reference REFERENCE=DIR" >&2; exit 2; fi
	$(PY) -m phoenix.ops.check_reference $(REFERENCE) $(CHECK_REFERENCE_ARGS)

# ---- load test and serving benchmark ----------------------------------------------------------
LOADTEST_USERS ?= 8
LOADTEST_TIME ?= 30s
BENCH_ARGS ?=
# HOST or HTTP_PORT given on the command line (HTTP_PORT also from the environment): load-test
# that running server; otherwise the load test starts its own on free loopback ports.
# Against a running server: the artifacts `make serve` serves unless ARTIFACTS says otherwise.
LOADTEST_ARTIFACTS = $(if $(LOADTEST_TARGET),$(SERVED_ARTIFACTS),$(ARTIFACTS))
LOADTEST_TARGET = $(if $(filter command line,$(origin HOST))$(filter command line environment,\
	$(origin HTTP_PORT)),--host $(HOST) --http-port $(HTTP_PORT) --grpc-port $(GRPC_PORT))

.PHONY: loadtest bench-serving bench-engine bench-startup bench-retrieval bench-store-serving \
	bench-user-state bench-service-host bench-recommend-host bench-prefix-cache bench-production

bench-engine: setup  ## engine vs the original runner and the same under jax.jit -> bench/results/
	$(PY) -m bench.bench_engine $(BENCH_ARGS)

loadtest: setup artifacts  ## Locust, HTTP + gRPC users, reports in loadtest/results/; fails on errors
	$(PY) loadtest/locustfile.py --artifacts $(LOADTEST_ARTIFACTS) --users $(LOADTEST_USERS) \
		--run-time $(LOADTEST_TIME) $(LOADTEST_TARGET)

bench-startup: setup artifacts  ## ranker buckets' start cost vs padding, serve ready time, heal time -> bench/results/startup.*
	$(PY) -m bench.bench_startup --artifacts $(ARTIFACTS) $(BENCH_ARGS)

bench-serving: setup artifacts  ## served vs in-process throughput/latency (BENCH_ARGS=--quick)
	$(PY) bench/bench_serving.py --artifacts $(ARTIFACTS) $(BENCH_ARGS)

bench-retrieval: setup  ## corpus stores of 1 M and 10 M trained-tower posts: recall, q/s, build, memory -> bench/results/retrieval.*
	$(PY) -m bench.bench_retrieval $(BENCH_ARGS)

bench-store-serving: setup  ## recommend over 100 k vs 10 M stores under Locust; freshness, deletion, window -> bench/results/
	$(PY) -m bench.bench_store_serving $(BENCH_ARGS)

bench-user-state: setup artifacts  ## recommend by id vs with history, freshness under Locust, Redis killed -> bench/results/user_state_load.json
	$(PY) -m bench.bench_user_state $(BENCH_ARGS)

bench-service-host: setup  ## host work a served ranker request (checks, batch, split), 1/8/64 a batch -> bench/results/service-host.json
	$(PY) -m bench.bench_service_host --out bench/results/service-host.json $(BENCH_ARGS)

bench-recommend-host: setup  ## served recommend vs the same chain in process, by id and with history over Redis, CPU of every process -> bench/results/recommend-host.*
	$(PY) -m bench.bench_recommend_host $(BENCH_ARGS)

bench-production: setup  ## X's production ranker served vs in process at nano 1,022 x 64 (build/production-nano, made if absent), FLOP/s vs the matmul rate -> bench/results/production-serving.json
	$(PY) -m bench.bench_production $(BENCH_ARGS)

bench-prefix-cache: setup  ## the ranker's prefix cache: hits vs misses at history 1,022 x 64, memory per user, Locust's paged users cache on vs off -> bench/results/prefix-cache.json
	$(PY) -m bench.bench_prefix_cache $(BENCH_ARGS)

# ---- reliability: faults, overload, fuzz and soak (docs/reliability.md) --------------------
RELIABILITY_TESTS := tests/integration/test_faults.py tests/integration/test_overload.py \
	tests/integration/test_fuzz.py
SOAK_ARGS ?=
RELIABILITY_RUNS ?= 20

.PHONY: test-reliability test-reliability-long soak bench-reliability

test-reliability: setup  ## fault, overload and fuzz tests (the short versions in `make test`)
	$(PY) -m pytest -s -q $(RELIABILITY_TESTS) $(PYTEST_ARGS)

test-reliability-long: setup  ## long versions: every stub killed, 2 workloads x 2 protocols, 10x fuzz
	PHOENIX_LONG_TESTS=1 $(PY) -m pytest -s -q $(RELIABILITY_TESTS) $(PYTEST_ARGS)

soak: setup artifacts  ## 10 min at half capacity: failures, latency, RSS -> bench/results/soak.*
	$(PY) bench/soak.py --artifacts $(ARTIFACTS) $(SOAK_ARGS)

# Two serve replicas behind nginx (deploy/k8s's balancing): HTTP and gRPC shares, a replica
# stopped under load with a plain proxy and drained (docs/deploy.md). Heavy: ~10 min.
REPLICAS_ARGS ?=
.PHONY: bench-replicas
bench-replicas: setup artifacts  ## two replicas behind nginx: balance + a stop under load -> bench/results/replicas.json
	$(PY) -m bench.bench_replicas --artifacts $(ARTIFACTS) $(REPLICAS_ARGS)

bench-reliability: setup artifacts  ## SIGTERM under Locust load RELIABILITY_RUNS times -> bench/results/reliability-exit.json
	$(PY) -m bench.bench_reliability --runs $(RELIABILITY_RUNS) --artifacts $(ARTIFACTS)

# ---- measuring on a GPU machine without a registry (bench/gpu/, docs/gpu.md)
GPU_PAYLOAD ?= .gpu
GPU_BENCH_ARGS ?=
GPU_PAYLOAD_ARGS ?=

.PHONY: gpu-payload gpu-bench-cpu

gpu-payload: setup  ## payload for a bare GPU machine in GPU_PAYLOAD (.gpu): server, wheels (GPU_PAYLOAD_ARGS, docs/gpu.md)
	$(PY) -m harness.gpu_payload --out $(GPU_PAYLOAD) $(GPU_PAYLOAD_ARGS)

gpu-bench-cpu: setup  ## the GPU benchmark's steps here on the CPU, tiny and quick (GPU_BENCH_ARGS)
	$(PY) -m bench.gpu.measure --cpu $(GPU_BENCH_ARGS)

# ---- training on synthetic engagement logs (docs/training.md) --------------------------------
# Each artifact directory is trained again only when its preset or seed changes: the stamp
# file is rewritten only then, and config.json appears only once training has succeeded.
TRAIN_PRESET ?= mini
TRAIN_SEED ?= 0
TRAINED ?= artifacts/trained-$(TRAIN_PRESET)
DEMO_SEED ?= 0
TRAIN_RESULTS := bench/results/training-$(TRAIN_PRESET)

.PHONY: train bench-training FORCE
FORCE:
# $(call write_stamp,TEXT): rewrite the target stamp only when TEXT differs from its content
write_stamp = @mkdir -p $(@D); echo "$(1)" | cmp -s - $@ || echo "$(1)" > $@

# $(call trained_rules,DIR,PRESET,SEED,EXTRA ARGS): DIR/config.json, trained by the pipeline
define trained_rules
$(STAMPS)/train-$(subst /,_,$(1)).args: FORCE
	$$(call write_stamp,preset=$(2) seed=$(3))

$(1)/config.json: $(STAMPS)/train-$(subst /,_,$(1)).args | $(BACKEND_STAMP)
	$(PY) -m phoenix.training pipeline --preset $(2) --seed $(3) --out $(1) $(4)
endef

# ---- artifact directories: one rule each ----
# TRAINED, DEMO_ARTIFACTS and ARTIFACTS may name one directory (`make serve
# ARTIFACTS=artifacts/trained-demo`); two rules for one config.json would make make warn and
# keep the last, so each directory gets the rule of the first role it plays, in this order:
# 1. TRAINED: what `make train` trains (figures under bench/results).
$(eval $(call trained_rules,$(TRAINED),$(TRAIN_PRESET),$(TRAIN_SEED),\
	--results $(TRAIN_RESULTS).json --plot $(TRAIN_RESULTS).png))
# $(call is_one_of,DIR,DIRS): non-empty when DIR is one of DIRS, however each is spelt
is_one_of = $(filter $(abspath $(1)),$(abspath $(2)))
# 2. The demo's towers: in the repository (artifacts/trained-demo, 9.6 MB), so `make demo`
# serves them at once; another DEMO_ARTIFACTS directory is trained when it has no config.json.
ifeq ($(call is_one_of,$(DEMO_ARTIFACTS),$(TRAINED)),)
$(DEMO_ARTIFACTS)/config.json: | $(BACKEND_STAMP)
	$(PY) -m phoenix.training pipeline --preset demo --seed $(DEMO_SEED) --out $(DEMO_ARTIFACTS)
endif
# 3. ARTIFACTS otherwise: generated untrained (mini preset) when it has no config.json.
ifeq ($(call is_one_of,$(ARTIFACTS),$(TRAINED) $(DEMO_ARTIFACTS)),)
$(ARTIFACTS)/config.json: | $(BACKEND_STAMP)
	$(PY) -m phoenix.artifacts --preset mini --out $(ARTIFACTS)
endif

train: setup $(TRAINED)/config.json  ## train both towers on synthetic logs (TRAIN_PRESET=mini|demo|tiny; GPU if JAX has one)
	$(PY) -m phoenix.training report $(TRAINED)/training.json

bench-training: setup  ## training throughput (examples/s) -> bench/results/training.json
	$(PY) -m bench.bench_training $(BENCH_ARGS)

# ---- the whole loop (docs/loop.md) -------------------------------------------------------------
# v1 (few steps) served -> reacting users -> served logs -> v2 + gate -> rollout under load ->
# reacting users -> v1 vs v2 online. About 9 min on 2 cores; e.g. LOOP_ARGS="--minutes 3".
# Exit 0 whatever v2's verdict (a gate refusal is reported, not an error); 1 if a step broke.
LOOP_ARGS ?=

.PHONY: loop
loop: setup  ## the whole loop: v1 served, users react, v2 trained + gated, rolled out under load -> bench/results/loop/
	$(PY) -m phoenix.loop $(LOOP_ARGS)
