#!/usr/bin/env bash
# GPU call 2 for issue 23 (after the review fixes; call 1 ran the code before them) (and the last GPU check of issue 22's code, since the ring gained
# Producer::declare_lost): the whole suite with the CUDA bridge test (MPS off), the bridge bench
# over loopback in host and CUDA memory, and the Python GPU tests.
set -uo pipefail
# The bundle travels compressed (its zenoh binaries put it past the 64 MiB a call carries).
tar xJf target/gpu-bundle.tar.xz -C target 2>/dev/null ||
  python3 -c "import tarfile; tarfile.open('target/gpu-bundle.tar.xz').extractall('target')"
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
grep -E "far CUDA consumer|a_lossless_cuda_chain" $R/gpu-tests.log | head -5
save
timeout 150 $B/bin/bridge_bench --cuda > $R/bridge-bench.txt 2>&1; echo "bridge bench exit $?"
cat $R/bridge-bench.txt | tail -8; save
PYTHONPATH=$PWD/$B/py/site GPURING_PIPELINE=$B/bin/pipeline timeout 100 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
