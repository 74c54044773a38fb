#!/usr/bin/env bash
# One device call of a time-limited GPU lease: bench/gpu/run.sh's steps, each under its own time
# limit inside SECONDS, then the experiments; what they wrote is packed into $OUT/lease.tar.gz.
usage() {
  cat <<'TEXT'
usage: bash bench/gpu/lease.sh SECONDS [STEP...]

Runs, in order, the STEPs (default: all) that have not run yet on this machine, each limited to
its own cap and to what is left of SECONDS; a step that would get under 30 s is skipped.
Calling it again on the same warm machine goes on where the last call stopped.

  setup      harness.gpu_machine from the payload in .gpu (make gpu-payload)
  engine retrieval startup serving recommend
             bench.gpu.measure --steps STEP, results in RESULTS
  engine-large
             bench.gpu.engine_points --configs large (the engine step's second half)
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
             and a JAX profiler trace (its perfetto file copied to $OUT)
  profile    ranker-64 served at concurrency 64 (batching on, HTTP) with every stub profiling
             its executions (PHOENIX_STUB_PROFILE, phoenix/stub/profile.py): summaries
             in build/gpu-bench/stub-profiles/; needs the serving step's artifacts
  profile-recommend
             the same for `recommend` at concurrency 64: every model of the ensemble's
             executions, requests per execution and profiled time, in
             build/gpu-bench/stub-profiles-recommend/ (which stage bounds the ensemble's rate)
  topk topk-raft topk-diag
             bench.gpu.topk_variants: every variant, without and with XLA's RAFT select_k;
             the engine's variants alone, with their device programs timed apart;
             results in bench/results/gpu/experiments/
Environment: RESULTS (default bench/results/gpu/<today's date>; never first-run or after-fix,
the before/after table's baselines), PYTHON, GPU_PAYLOAD.
Logs and step status: build/gpu-bench/lease/. Everything is packed into $OUT/lease.tar.gz
(or build/gpu-bench/lease.tar.gz where OUT is unset).
TEXT
}
set -uo pipefail
cd "$(dirname "$0")/../.."
[[ $# -ge 1 && "$1" =~ ^[0-9]+$ ]] || { usage; exit 2; }
budget=$1
shift
steps=("$@")
[[ ${#steps[@]} -gt 0 ]] || steps=(setup engine retrieval startup serving topk topk-raft)

state=build/gpu-bench/lease
results=${RESULTS:-bench/results/gpu/$(date +%F)}
case "$results" in  # the before/after table's baselines are kept as they were measured
  */first-run|*/first-run/|*/after-fix|*/after-fix/)
    echo "RESULTS=$results would overwrite a kept baseline: name another folder"; exit 2 ;;
esac
experiments=bench/results/gpu/experiments
mkdir -p "$state" "$results" "$experiments"
export PYTHONUNBUFFERED=1
# Kept for packing: a step killed at its limit gets 10 s more (timeout -k), packing about 5.
reserve=30
python=${PYTHON:-python3}
# Caps in seconds, from the H100 run of 2026-11-23 (engine ~2 min, empty-cache start 124-173 s).
declare -A cap=([setup]=120 [engine]=220 [retrieval]=90 [startup]=280 [serving]=300
  [topk]=120 [topk-raft]=90 [engine-large]=100 [topk-diag]=90 [profile]=120
  [profile-recommend]=150 [serving-instances]=200 [serving-instances-4]=200 [recommend]=200
  [service-host]=90 [recommend-chain4]=150 [engine-diag]=90)
measure=("$python" -m bench.gpu.measure --results "$results" --no-docs --steps)
# bench_serving run by hand gets what measure.py gives its steps: no JAX preallocation (the
# in-process timing shares the GPU with the stubs), the GPU platform, the shared program store.
served=(env XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=cuda
  "PHOENIX_PROGRAM_STORE=$PWD/build/gpu-bench/programs-gpu" "$python" -m bench.bench_serving
  --device gpu --artifacts build/gpu-bench/artifacts-mini --protocols http)
# WORKLOAD served at concurrency 64 with every stub profiling its executions into
# build/gpu-bench/stub-profiles<SUFFIX>; bench_serving's figures in experiments/OUT.json.
profiled() {  # WORKLOAD SUFFIX OUT
  echo "env PHOENIX_STUB_PROFILE=$PWD/build/gpu-bench/stub-profiles$2 ${served[*]}
    --workloads $1 --concurrency 64 --batching on --window-requests 200
    --out $experiments/$3.json --build-dir build/gpu-bench/profiled$2
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
  [topk]="$python -m bench.gpu.topk_variants --profile gpu --out $experiments/topk.json"
  [topk-raft]="$python -m bench.gpu.topk_variants --profile gpu --raft --out $experiments/topk-raft.json"
  [engine-large]="$python -m bench.gpu.engine_points --profile gpu --configs large --out $results/engine-large.json"
  [profile]="$(profiled ranker-64 "" profiled-serving)"
  [profile-recommend]="$(profiled recommend -recommend profiled-recommend)"
  [serving-instances]="$(instances 8)"
  [serving-instances-4]="$(instances 4)"
  [service-host]="env JAX_PLATFORMS=cuda $python -m bench.bench_service_host --out $results/service-host.json"
  [recommend-chain4]="${served[*]/artifacts-mini/artifacts-mini-corpus1000000} --instances recommend_chain=4
    --workloads recommend --batching on --concurrency 16,64,256 --window-requests 100
    --out $results/recommend-chain4.json --build-dir build/gpu-bench/chain4
    --docs build/gpu-bench/chain4-table.md"
  [engine-diag]="$python -m bench.gpu.engine_diag --profile gpu --out $results/engine-diag.json
    --trace build/gpu-bench/trace"
  [topk-diag]="$python -m bench.gpu.topk_variants --profile gpu --only binned,engine,engine-1tile,engine-1tile-noexcl --out $experiments/topk-diag.json"
)

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
  # shellcheck disable=SC2086  (the command is a word list)
  timeout -k 10 "$limit" ${command[$name]} >"$state/$name.log" 2>&1
  rc=$?
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

pack=${OUT:-build/gpu-bench}/lease.tar.gz
find bench/results/gpu build/gpu-bench/lease build/gpu-bench -maxdepth 2 -type f \
  \( -name '*.json' -o -name '*.png' -o -name '*.log' -o -name '*.txt' -o -name '*.status' \
  -o -name '*.md' \) -size -8M 2>/dev/null | sort -u >"$state/packed.txt"
# No path of that machine (phoenix/util/machine_paths.py): the results are kept in the repository.
grep -v '\.png$' "$state/packed.txt" | xargs -r -d '\n' "$python" -m phoenix.util.machine_paths
# The engine trace beside the pack, where it fits a returned file (16 MiB)
trace=$(find build/gpu-bench/trace -name 'perfetto_trace.json.gz' -size -15M 2>/dev/null | head -1)
[[ -n $trace && -n ${OUT:-} ]] && cp "$trace" "$OUT/engine-trace.json.gz"
tar czf "$pack" -T "$state/packed.txt" && echo "packed $(wc -l <"$state/packed.txt") files: $pack ($((SECONDS)) s)"
