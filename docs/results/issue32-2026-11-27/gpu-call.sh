#!/usr/bin/env bash
# The GPU machine's checks for the ring directory and lock-based liveness, in one command:
#   tests  - the whole bundled suite (GPU tests, and as root the namespace matrix in host
#            memory and the fd server across pid namespaces), --skip two_gpus_ on one GPU;
#            then the Python tests (GPU ones included);
#   bench  - no loss of speed: the host round trip (criterion --quick, raw floor in the same
#            run) and `gpu_bench --consumers 1,4 --sizes 64K,8M --policies block`, the binaries
#            of main before the change (old/) and after (bin/) alternated, twice each.
# Usage: gpu-call.sh [tests] [bench]   (both by default). Results go to $OUT/results.tgz.
set -uo pipefail
tar xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
what=${*:-tests bench}
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
n=$(nvidia-smi -L | wc -l); if [ "$n" -ge 2 ]; then skip=(); else skip=(--skip two_gpus_); fi
if [[ $what == *tests* ]]; then
  timeout 330 $B/run-tests "${skip[@]}" > $R/gpu-tests.log 2>&1; echo "run-tests exit $?"
  tail -1 $R/gpu-tests.log; grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
  save
  # The namespace matrix once more with its per-cell lines (the suite captures them).
  timeout 120 $B/tests/namespaces --ignored --nocapture > $R/namespaces.log 2>&1
  echo "namespaces exit $?"; grep -E "namespaces: \[|test result" $R/namespaces.log
  save
  PYTHONPATH=$PWD/$B/py/site GPURING_PIPELINE=$B/bin/pipeline timeout 100 \
    python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
  echo "pytest: $(tail -1 $R/pytest-gpu.log)"; save
fi
if [[ $what == *bench* ]]; then
  for round in 1 2; do
    for v in old new; do
      [ $v = old ] && d=$B/old || d=$B/bin
      [ "$SECONDS" -lt 540 ] || { echo "bench round $round $v skipped: ${SECONDS}s used"; continue; }
      CARGO_TARGET_DIR=/tmp/crit-$v-$round timeout 120 $d/host --bench --quick roundtrip \
        > $R/host-$v-$round.log 2>&1; echo "host $v $round exit $?"
      grep -A8 "host round trip, gpuring vs" $R/host-$v-$round.log
      timeout 120 $d/gpu_bench --consumers 1,4 --sizes 64K,8M --policies block \
        --md $R/gpu-$v-$round.md > $R/gpu-$v-$round.log 2>&1; echo "gpu_bench $v $round exit $?"
      save
    done
  done
fi
save
