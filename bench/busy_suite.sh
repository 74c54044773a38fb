#!/usr/bin/env bash
# `make test` RUNS times in a row while HOGS busy loops keep the cores busy: the suite must
# hold on a loaded machine (docs/reliability.md, "The suite on a busy machine"). Prints one line a run and writes
# bench/results/busy-suite.json. Usage: bash bench/busy_suite.sh [RUNS] [HOGS]
set -u
runs=${1:-3}
hogs=${2:-2}
cd "$(dirname "$0")/.."
mkdir -p bench/results build
pids=()
for _ in $(seq "$hogs"); do python3 -c 'while True: pass' & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
rows=()
for run in $(seq "$runs"); do
  log=build/busy-suite-$run.log
  start=$(date +%s)
  make test >"$log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  summary=$(grep -E 'passed|failed' "$log" | tail -1)
  echo "run $run: exit $rc after ${seconds}s, load $load: $summary"
  rows+=("{\"run\": $run, \"exit\": $rc, \"seconds\": $seconds, \"load\": \"$load\", \"summary\": \"${summary//\"/}\"}")
done
printf '{"hogs": %s, "cores": %s, "runs": [%s]}\n' "$hogs" "$(nproc)" "$(IFS=,; echo "${rows[*]}")" \
  >bench/results/busy-suite.json
