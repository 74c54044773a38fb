#!/bin/bash
# old and new serving benchmark, alternating, same artifacts
set -x
ART=/work/main/artifacts/demo
mkdir -p /tmp/ab
for run in 1 2; do
  (cd /work/old && PYTHONPATH=/work/old /work/main/.venv/bin/python bench/bench_serving.py --quick --artifacts $ART --out /tmp/ab/old-$run.json --build-dir /tmp/ab/build-old) > /tmp/ab/old-$run.log 2>&1
  (cd /work/main && /work/main/.venv/bin/python bench/bench_serving.py --quick --artifacts $ART --out /tmp/ab/new-$run.json --build-dir /tmp/ab/build-new) > /tmp/ab/new-$run.log 2>&1
done
echo done
