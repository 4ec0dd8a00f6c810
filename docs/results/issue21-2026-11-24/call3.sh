#!/usr/bin/env bash
# GPU call 3 for issue 21, on two GPUs: the whole suite again after the fixes call 2 asked for
# (the two-GPU tests run one at a time, so that the process's sync counter counts one test;
# conformance's slow-holder bound). The library and the bench are call 2's: only test binaries
# changed, so the bench table and the Python run of call 2 stand.
set -uo pipefail
tar xJf target/gpu-bundle.tar.xz -C target 2>/dev/null ||
  python3 -c "import tarfile; tarfile.open('target/gpu-bundle.tar.xz').extractall('target')"
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
n=$(nvidia-smi -L | wc -l); echo "GPUs: $n"
if [ "$n" -ge 2 ]; then skip=(); else skip=(--skip two_gpus_); fi
echo "run-tests ${skip[*]:-(no skip)}"
timeout 500 $B/run-tests "${skip[@]}" > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
grep -E "consumer on device|one process|reader on GPU|victim killed|producer killed|reader ended|policy SameUid|slow Queue" $R/gpu-tests.log | head -40
save
