#!/usr/bin/env bash
# GPU call 1 for issue 22 (items 5, 6, 9 and the review fixes): the whole suite (MPS off), the
# Python GPU tests, and the host round trip before and after item 5 (the Consumer made Sync),
# criterion, alternating the two binaries twice in one run on this quiet 16-core machine.
# bin/host-before is benches/host.rs built at 5c0c6fb (before item 5; its open retries also
# take Truncated, the half-built segment later reported as NotInitialized); bin/host is the
# bench at the tested commit.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
for round in 1 2; do
  for which in host-before host; do
    echo "=== round $round: $which ===" >> $R/bench-roundtrip.txt
    CRITERION_HOME=/tmp/crit-$which-$round timeout 60 $B/bin/$which --bench \
      'roundtrip_1to1/(floor|gpuring)/(64B|4KiB)$|same_thread/gpuring/64B$' \
      --warm-up-time 1 --measurement-time 3 2>&1 | grep -E "^(roundtrip|same)|time:" >> $R/bench-roundtrip.txt
  done
done
echo "bench done"; grep -c "time:" $R/bench-roundtrip.txt; save
timeout 320 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
save
PYTHONPATH=$PWD/$B/py/site GPURING_PIPELINE=$B/bin/pipeline timeout 110 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
