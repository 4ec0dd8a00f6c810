#!/usr/bin/env bash
# The GPU checks of the batcher, from the repository root with the bundle carried as
# target/gpu-bundle.tar.xz: the suite (scripts/gpu-containers.sh tests), the fence tests run
# alone, then benches/batch/resnet.py and its roofline run, MPS on. (The final-code run left
# out the fence and roofline lines.)
cd "$(dirname "$0")/../../.."
bash scripts/gpu-containers.sh tests > $OUT/containers.log 2>&1
B=target/gpu-bundle
timeout 150 $B/tests/gpu_ring --include-ignored --test-threads=1 fence > /tmp/serial.log 2>&1
echo "exit $?" >> /tmp/serial.log; grep -E "^test |test result|unfenced" /tmp/serial.log > $OUT/gpu_ring_serial.log
grep -E "gpu_batch|gpu_batches" -A3 /tmp/r/gpu-tests.log > $OUT/gpu_batch.log 2>&1
. scripts/mps.sh; mps_start
export PYTHONPATH=$PWD/$B/py/site
timeout 120 python3 benches/batch/resnet.py --gpuring $B/bin/gpuring --seconds 20 --json $OUT/resnet.json > $OUT/resnet.log 2>&1
echo "resnet exit $?" >> $OUT/resnet.log
timeout 100 python3 benches/batch/resnet.py --gpuring $B/bin/gpuring --width 1920 --height 1080 --roofline --seconds 10 --json $OUT/roofline.json > $OUT/roofline.log 2>&1
echo "roofline exit $?" >> $OUT/roofline.log
mps_stop
ls $OUT
