#!/usr/bin/env bash
# Issue 18, fourth GPU call, after the second review's fixes (final code): the whole suite (MPS off) and the Python GPU
# tests. (The sharing comparison is from call2.sh; the pipeline runs again here, MPS on)
#
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked|failed" $R/gpu-tests.log | head -20
echo "cuda_vmm scenarios: $(grep -cE '^test cuda_vmm::.* ok$' $R/gpu-tests.log) ok"
grep -E "uid 65534|refused:|fds: received" $R/gpu-tests.log | head -12
save
export PYTHONPATH=$PWD/$B/py/site
GPURING_PIPELINE=$B/bin/pipeline timeout 120 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
source scripts/mps.sh; mps_start
timeout 40 $B/bin/pipeline --memory cuda --sharing vmm --consumers 3 --seconds 5 > $R/pipeline-vmm-mps-on.log 2>&1
echo "pipeline vmm (MPS on) exit $?"; tail -4 $R/pipeline-vmm-mps-on.log
mps_stop
save
