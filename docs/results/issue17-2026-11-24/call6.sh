#!/usr/bin/env bash
# Issue 17, after the tidy commit: the GPU suite (MPS off) and the Python GPU tests.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 300 $B/run-tests > $R/gpu-tests-tidy.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests-tidy.log
grep -E "FAILED|panicked" $R/gpu-tests-tidy.log | head -10; save
export PYTHONPATH=$PWD/$B/py/site
GPURING_PIPELINE=$B/bin/pipeline timeout 100 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu-tidy.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu-tidy.log)"; save
