#!/usr/bin/env bash
# bench/gpu/run.sh's steps and further ones within a time limit, for a GPU machine held for a
# limited time: each step under its own limit, the results packed into one archive.
usage() {
  cat <<'TEXT'
usage: bash bench/gpu/lease.sh SECONDS [STEP...]

Runs, in order, the STEPs (default: setup reference production xrex prefix-cache engine
recommend serving) that have not run yet on this machine, each limited to its own cap and to what is
left of SECONDS; a step that would get under 30 s is skipped. Running it again on the same
machine goes on where the last run stopped (build/gpu-bench/lease/STEP.status marks a step done).

  setup      harness.gpu_machine from the payload in .gpu (make gpu-payload)
  engine retrieval startup serving recommend production prefix-cache reference xrex
             bench.gpu.measure --steps STEP, results in RESULTS (xrex: skipped unless the
             payload was built with --xrex X_PHOENIX_DIR)
  engine-large
             bench.gpu.engine_points --configs large (the engine step's second half), in
             RESULTS/engine-large.json
  serving-instances
             ranker-64 and ranker-512 served with 8 ranker instances (the profile has 2) at
             concurrency 16, 64, 256, batching on and off: does host work per request bound
             the served rate? Results in RESULTS/serving-ranker8.json; needs the serving
             step's artifacts
  serving-instances-4
             the same with 4 ranker instances, in RESULTS/serving-ranker4.json
  service-host
             bench.bench_service_host: host work a ranker request at 1, 8 and 64 a batch
             (the device call's answer cached), in RESULTS/service-host.json
  recommend-chain4
             recommend as the recommend step serves it, with 4 instances of recommend_chain
             (the profile has 2), in RESULTS/recommend-chain4.json; needs the recommend
             step's artifacts
  engine-diag
             bench.gpu.engine_diag: the engine's programs with inputs on the device against
             the calls from host arrays, at 1 x 64 and 1 x 1024, in RESULTS/engine-diag.json,
             and a JAX profiler trace (its perfetto file packed beside the archive)
  profile    ranker-64 served at concurrency 64 (batching on, HTTP) with every stub profiling
             its executions (PHOENIX_STUB_PROFILE, phoenix/stub/profile.py): summaries and
             the run's figures in build/gpu-bench/stub-profiles/; needs the serving step's
             artifacts
  profile-recommend
             the same for `recommend` at concurrency 64, in
             build/gpu-bench/stub-profiles-recommend/
  topk topk-raft topk-diag
             bench.gpu.topk_variants: every variant, without and with XLA's RAFT select_k;
             the engine's variants alone, with their device programs timed apart; in
             RESULTS/topk.json, topk-raft.json, topk-diag.json
The JSON a step writes with bench_serving.py or bench_service_host.py gets the command and the
machine added (harness/gpu_bench/stamp.py). Environment: RESULTS (default bench/results/gpu: the kept
results, replaced), PYTHON, GPU_PAYLOAD, PACK_DIR (default build/gpu-bench).
Logs and step status: build/gpu-bench/lease/. The results, logs and stub profiles are packed
into PACK_DIR/gpu-results.tar.gz, paths of this machine written portably.
TEXT
}
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ ]] || { usage; exit 2; }
budget=$1
shift
steps=("$@")
# The figures never measured on a GPU first, then the standing targets measured again.
[[ ${#steps[@]} -gt 0 ]] || steps=(setup reference production xrex prefix-cache engine recommend serving)

state=build/gpu-bench/lease
results=${RESULTS:-bench/results/gpu}
pack_dir=${PACK_DIR:-build/gpu-bench}
mkdir -p "$state" "$results" "$pack_dir"
export PYTHONUNBUFFERED=1
# Python writes the bytecode of what it imports even where the machine says not to, as the
# Makefile does: otherwise every stub of every server start compiles jax and phoenix again.
unset PYTHONDONTWRITEBYTECODE
# Kept for packing: a step killed at its limit gets 10 s more (timeout -k), packing about 5.
reserve=30
python=${PYTHON:-python3}
# Each step's own limit in seconds, from runs on an H100 and an H200 (on the H200 the engine
# step's mini points took the whole 220 s: run engine-large for the large config); reference,
# production, prefix-cache and xrex: estimates from their compiles, not yet run on a GPU.
declare -A cap=([setup]=120 [engine]=220 [retrieval]=90 [startup]=280 [serving]=300
  [topk]=120 [topk-raft]=90 [engine-large]=100 [topk-diag]=90 [profile]=120
  [profile-recommend]=150 [serving-instances]=200 [serving-instances-4]=200 [recommend]=200
  [service-host]=90 [recommend-chain4]=150 [engine-diag]=90 [production]=300 [prefix-cache]=240
  [reference]=90 [xrex]=240)
measure=("$python" -m bench.gpu.measure --results "$results" --no-docs --steps)
# bench_serving run by hand gets what measure.py gives its steps: no JAX preallocation (the
# in-process timing shares the GPU with the stubs), the GPU platform, the shared program store.
served=(env XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=cuda
  "PHOENIX_PROGRAM_STORE=$PWD/build/gpu-bench/programs-gpu" "$python" -m bench.bench_serving
  --device gpu --artifacts build/gpu-bench/artifacts-mini --protocols http)
# WORKLOAD served at concurrency 64 with every stub profiling its executions into
# build/gpu-bench/stub-profiles<SUFFIX>, bench_serving's figures beside them (under cProfile:
# slower than unprofiled, so not a result).
profiled() {  # WORKLOAD SUFFIX
  echo "env PHOENIX_STUB_PROFILE=$PWD/build/gpu-bench/stub-profiles$2 ${served[*]}
    --workloads $1 --concurrency 64 --batching on --window-requests 200
    --out build/gpu-bench/stub-profiles$2/served.json --build-dir build/gpu-bench/profiled$2
    --docs build/gpu-bench/profiled$2-table.md"
}
# ranker-64 and ranker-512 served with N ranker instances, batching on and off.
instances() {  # N
  echo "${served[*]} --instances ranker=$1 --workloads ranker-64,ranker-512
    --concurrency 16,64,256 --window-requests 100 --out $results/serving-ranker$1.json
    --build-dir build/gpu-bench/ranker$1 --docs build/gpu-bench/ranker$1-table.md"
}
declare -A command=(
  [setup]="$python -m harness.gpu_machine --payload ${GPU_PAYLOAD:-.gpu}"
  [engine]="${measure[*]} engine"
  [retrieval]="${measure[*]} retrieval"
  [startup]="${measure[*]} startup"
  [serving]="${measure[*]} serving"
  [recommend]="${measure[*]} recommend"
  [production]="${measure[*]} production"
  [prefix-cache]="${measure[*]} prefix-cache"
  [reference]="${measure[*]} reference"
  [xrex]="${measure[*]} xrex"
  [topk]="$python -m bench.gpu.topk_variants --profile gpu --out $results/topk.json"
  [topk-raft]="$python -m bench.gpu.topk_variants --profile gpu --raft --out $results/topk-raft.json"
  [engine-large]="$python -m bench.gpu.engine_points --profile gpu --configs large --out $results/engine-large.json"
  [profile]="$(profiled ranker-64 "")"
  [profile-recommend]="$(profiled recommend -recommend)"
  [serving-instances]="$(instances 8)"
  [serving-instances-4]="$(instances 4)"
  [service-host]="env JAX_PLATFORMS=cuda $python -m bench.bench_service_host --out $results/service-host.json"
  [recommend-chain4]="${served[*]/artifacts-mini/artifacts-mini-corpus1000000} --instances recommend_chain=4
    --workloads recommend --batching on --concurrency 16,64,256 --window-requests 100
    --out $results/recommend-chain4.json --build-dir build/gpu-bench/chain4
    --docs build/gpu-bench/chain4-table.md"
  [engine-diag]="$python -m bench.gpu.engine_diag --profile gpu --out $results/engine-diag.json
    --trace build/gpu-bench/trace"
  [topk-diag]="$python -m bench.gpu.topk_variants --profile gpu --only binned,engine,engine-1tile,engine-1tile-noexcl --out $results/topk-diag.json"
)
# The steps that run bench_serving.py or bench_service_host.py by hand: their JSON gets the
# command and the machine added (measure.py does so for its own steps).
declare -A stamped=([serving-instances]=$results/serving-ranker8.json
  [serving-instances-4]=$results/serving-ranker4.json [service-host]=$results/service-host.json
  [recommend-chain4]=$results/recommend-chain4.json)

machine() {
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm \
    --format=csv,noheader 2>&1
  echo "cores $(nproc); $("$python" -c 'import jax, numpy; print("jax", jax.__version__, jax.devices(), "numpy", numpy.__version__)' 2>&1 | tail -1)"
}

run_step() {
  local name=$1 left limit started rc
  if [[ -f $state/$name.status ]]; then
    echo "== $name: ran before ($(cat "$state/$name.status"))"
    return
  fi
  left=$((budget - SECONDS - reserve))
  limit=${cap[$name]}
  ((left < limit)) && limit=$left
  if ((limit < 30)); then
    echo "== $name: skipped, ${left} s left"
    return
  fi
  echo "== $name (limit ${limit} s): ${command[$name]}"
  started=$SECONDS
  touch "$state/$name.started"
  # shellcheck disable=SC2086  (the command is a word list)
  timeout -k 10 "$limit" ${command[$name]} >"$state/$name.log" 2>&1
  rc=$?
  local out=${stamped[$name]:-}
  if [[ -n $out && $out -nt $state/$name.started ]]; then
    # shellcheck disable=SC2086  (one line of the command's words)
    "$python" -m harness.gpu_bench.stamp "$out" --command "$(echo ${command[$name]})" >>"$state/$name.log" 2>&1
  fi
  if ((rc == 124 || rc == 137)); then
    # The step's servers run in their own sessions and outlive it: stop them before the next
    # step needs the GPU's memory and the ports (the machine runs nothing else of ours).
    pkill -KILL -x tritonserver && echo "   stopped the tritonservers the step left"
  fi
  echo "exit $rc after $((SECONDS - started)) s (limit $limit s)" >"$state/$name.status"
  echo "   $(cat "$state/$name.status")"
  grep -v '^\s*$' "$state/$name.log" | tail -n "${TAIL_LINES:-12}" | cut -c1-220
}

for step in "${steps[@]}"; do  # every name checked before any step runs
  [[ -n ${cap[$step]:-} ]] || { echo "unknown step $step"; usage; exit 2; }
done
machine | tee "$state/machine.txt"
for step in "${steps[@]}"; do
  run_step "$step"
  if [[ $step == setup && $(cat "$state/setup.status" 2>/dev/null) != "exit 0 "* ]]; then
    echo "== setup failed: no step runs without it"
    rm -f "$state/setup.status"  # a later call tries again
    break
  fi
done

pack=$pack_dir/gpu-results.tar.gz
find "$results" build/gpu-bench/lease build/gpu-bench -maxdepth 2 -type f \
  \( -name '*.json' -o -name '*.png' -o -name '*.log' -o -name '*.txt' -o -name '*.status' \
  -o -name '*.md' \) -size -8M 2>/dev/null | sort -u >"$state/packed.txt"
# No path of that machine (phoenix/util/machine_paths.py): the results are kept in the repository.
grep -v '\.png$' "$state/packed.txt" | xargs -r -d '\n' "$python" -m phoenix.util.machine_paths
# The engine trace beside the archive (a perfetto file: ui.perfetto.dev reads it)
trace=$(find build/gpu-bench/trace -name 'perfetto_trace.json.gz' 2>/dev/null | head -1)
[[ -n $trace ]] && cp "$trace" "$pack_dir/engine-trace.json.gz"
tar czf "$pack" -T "$state/packed.txt" && echo "packed $(wc -l <"$state/packed.txt") files: $pack ($((SECONDS)) s)"
