#!/usr/bin/env bash
# One command on a GPU machine without a package registry: set it up from the offline payload
# (.gpu, `make gpu-payload`), then run every benchmark step.
usage() {
  cat <<'TEXT'
usage: bash bench/gpu/run.sh [--cpu] [measure.py options...]

On a bare GPU machine (from the checkout's root, the payload carried in .gpu):
  1. python3 -m harness.gpu_machine --payload $GPU_PAYLOAD
                                  wheels, Triton server, perf_analyzer
  2. python3 -m bench.gpu.measure ...   engine, retrieval, startup, serving, recommend
Results: bench/results/gpu/*.json|png, also copied to $GPU_RESULTS_COPY when it names a folder
(one to fetch them from, when the checkout itself is not kept). docs/gpu.md says more; the
further suites and a run within a time limit: bench/gpu/lease.sh.

With --cpu (or DEVICE=cpu) it skips the set-up and runs the same steps here on the CPU with
tiny sizes, using the checkout's .venv (a smoke run; results under build/gpu-bench/).

Environment: GPU_PAYLOAD (default .gpu), PYTHON (default python3; .venv/bin/python with --cpu),
GPU_RESULTS_COPY (optional).
Options after --cpu go to measure.py: e.g. --steps engine,retrieval  (see measure.py --help).
TEXT
}
set -euo pipefail
cd "$(dirname "$0")/../.."
# Python writes the bytecode of what it imports even where the machine says not to, as the
# Makefile does: otherwise every stub of every server start compiles jax and phoenix again.
unset PYTHONDONTWRITEBYTECODE

cpu=0
[[ "${DEVICE:-gpu}" == cpu ]] && cpu=1
args=()
for arg in "$@"; do
  case "$arg" in
    -h|--help) usage; exit 0 ;;
    --cpu) cpu=1 ;;
    *) args+=("$arg") ;;
  esac
done

if (( cpu )); then
  python=${PYTHON:-.venv/bin/python}
  exec "$python" -m bench.gpu.measure --cpu "${args[@]}"
fi

python=${PYTHON:-python3}
"$python" -m harness.gpu_machine --payload "${GPU_PAYLOAD:-.gpu}"
copy=()
[[ -n "${GPU_RESULTS_COPY:-}" ]] && copy=(--copy-to "$GPU_RESULTS_COPY")
exec "$python" -m bench.gpu.measure "${args[@]}" "${copy[@]}"
