#!/usr/bin/env bash
# Final GPU call of the stop, after the last CUDA-touching commit (213b1b6: one event query on
# the zero-poll path): the whole suite (MPS off) and the Python GPU tests.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
timeout 330 $B/run-tests > $R/gpu-tests-final.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests-final.log
grep -E "FAILED|panicked" $R/gpu-tests-final.log | head -10
echo "cuda_vmm scenarios: $(grep -cE '^test cuda_vmm::.* ok$' $R/gpu-tests-final.log) ok"
save
export PYTHONPATH=$PWD/$B/py/site
GPURING_PIPELINE=$B/bin/pipeline timeout 120 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu-final.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu-final.log)"; save
