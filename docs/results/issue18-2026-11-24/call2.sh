#!/usr/bin/env bash
# Issue 18 (VMM sharing), second GPU call, after the review fixes: the whole suite (MPS off), the Python GPU tests, the
# pipeline in VMM sharing (MPS off, then on), and the paced sharing comparison (MPS on).
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
id -u
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked|failed" $R/gpu-tests.log | head -20
echo "cuda_vmm scenarios: $(grep -cE '^test cuda_vmm::.* ok$' $R/gpu-tests.log) ok"
grep -E "uid 65534|fds before|refused:" $R/gpu-tests.log | head -8
save
export PYTHONPATH=$PWD/$B/py/site
GPURING_PIPELINE=$B/bin/pipeline timeout 120 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
source scripts/mps.sh; mps_start
timeout 40 $B/bin/pipeline --memory cuda --sharing vmm --consumers 3 --seconds 5 > $R/pipeline-vmm-mps-on.log 2>&1
echo "pipeline vmm (MPS on) exit $?"; tail -4 $R/pipeline-vmm-mps-on.log
save
for run in 1 2; do
  timeout 100 $B/bin/gpu_bench --compare-sharing --consumers 1,4 --sizes 64K,8M --label mps-on-run$run --md $R/sharing-mps-on-$run.md > $R/sharing-mps-on-$run.log 2>&1
  echo "sharing bench run $run exit $?"; grep '^| [0-9]' $R/sharing-mps-on-$run.md
done
mps_stop
save
