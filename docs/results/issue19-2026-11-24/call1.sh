#!/usr/bin/env bash
# Issue 19 (operating gpuring), GPU call: the C examples in CUDA memory, then MPS off and on:
# `gpuring doctor`, the video example; a curl of /metrics next to a running pipeline; then the
# whole GPU suite (MPS off).
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
export PYTHONPATH=$PWD/$B/py/site
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc)")")/include
for ex in producer consumer; do
  cc -std=gnu11 -O1 -DGPURING_EXAMPLE_CUDA -Icapi/include -I"$CUDA_INC" capi/examples/$ex.c \
     -o /tmp/c-$ex -L$B/capi -lgpuring_c -lcuda -Wl,-rpath,$PWD/$B/capi || echo "cc $ex failed"
done
( /tmp/c-consumer c-cuda > $R/c-consumer-1.log 2>&1 & /tmp/c-consumer c-cuda > $R/c-consumer-2.log 2>&1 &
  timeout 60 /tmp/c-producer c-cuda 2 10000 cuda > $R/c-producer.log 2>&1; wait )
echo "C examples, CUDA memory:"; cat $R/c-producer.log $R/c-consumer-*.log; save
timeout 120 $B/bin/gpuring doctor > $R/doctor-mps-off.txt 2>&1; echo "doctor (MPS off) exit $?"
cat $R/doctor-mps-off.txt; save
timeout 100 python3 examples/python/video_inference.py --consumers 2 --seconds 10 > $R/video-mps-off.log 2>&1
echo "video (MPS off) exit $?"; grep -E "^(consumer|producer|video)" $R/video-mps-off.log; save
timeout 30 $B/bin/pipeline --memory cuda --consumers 2 --seconds 8 --name metrics-demo > $R/pipeline-metrics.log 2>&1 &
PIPE=$!
sleep 3
$B/bin/gpuring exporter --listen 127.0.0.1:9464 metrics-demo > $R/exporter.log 2>&1 &
EXP=$!
sleep 1
curl -s -i http://127.0.0.1:9464/metrics > $R/metrics.txt; echo "curl exit $?"
kill $EXP; wait $PIPE
head -60 $R/metrics.txt; save
source scripts/mps.sh; mps_start
timeout 120 $B/bin/gpuring doctor > $R/doctor-mps-on.txt 2>&1; echo "doctor (MPS on) exit $?"
cat $R/doctor-mps-on.txt; save
timeout 100 python3 examples/python/video_inference.py --consumers 2 --seconds 10 > $R/video-mps-on.log 2>&1
echo "video (MPS on) exit $?"; grep -E "^(consumer|producer|video)" $R/video-mps-on.log
mps_stop
save
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
save
