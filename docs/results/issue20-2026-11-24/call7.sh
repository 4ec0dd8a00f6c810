#!/usr/bin/env bash
# GPU call 7: call5.sh again on the tidied code (52275d7): the whole suite (MPS off) and the
# Python GPU tests.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
save
PYTHONPATH=$PWD/$B/py/site GPURING_PIPELINE=$B/bin/pipeline timeout 120 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
