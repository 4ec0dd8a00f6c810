#!/usr/bin/env bash
# Device call: the bundled GPU suite and the Python GPU tests on the final code.
cd "$(dirname "$0")/../../.."
tar xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
export PYTHONPATH=$PWD/$B/py/site
mkdir -p $B/aside; mv $B/tests/gpu_namespaces $B/tests/docker $B/aside/ 2>/dev/null
timeout 330 $B/run-tests --skip two_gpus_ > $OUT/gpu-tests.log 2>&1; echo "run-tests exit $?" >> $OUT/gpu-tests.log
GPURING_PIPELINE=$B/bin/pipeline timeout 150 python3 -m pytest -ra -p no:cacheprovider python/tests > $OUT/pytest-gpu.log 2>&1
echo "pytest exit $?" >> $OUT/pytest-gpu.log
tail -2 $OUT/gpu-tests.log; tail -2 $OUT/pytest-gpu.log
