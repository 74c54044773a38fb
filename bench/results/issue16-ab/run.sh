#!/bin/bash
# old and new serving benchmark, alternating, same artifacts.
# usage (from this checkout's root): bash bench/results/issue16-ab/run.sh OLD_CHECKOUT
# OLD_CHECKOUT: a checkout of the baseline commit, beside this one.
set -xeu
old=${1:?usage: run.sh OLD_CHECKOUT}
new=$PWD
python=$new/.venv/bin/python
art=$new/artifacts/demo
mkdir -p /tmp/ab
for run in 1 2; do
  (cd "$old" && PYTHONPATH="$old" "$python" bench/bench_serving.py --quick --artifacts "$art" --out /tmp/ab/old-$run.json --build-dir /tmp/ab/build-old) > /tmp/ab/old-$run.log 2>&1
  (cd "$new" && "$python" bench/bench_serving.py --quick --artifacts "$art" --out /tmp/ab/new-$run.json --build-dir /tmp/ab/build-new) > /tmp/ab/new-$run.log 2>&1
done
echo done
