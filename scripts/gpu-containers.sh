#!/usr/bin/env bash
# The GPU machine's checks of CUDA rings across namespaces, in one command, from the
# repository root with the bundle carried as target/gpu-bundle.tar.xz (../shared/gpu-bundle,
# scripts/python-bundle.sh, then `tar cJf target/gpu-bundle.tar.xz -C target gpu-bundle`):
#   tests - the whole bundled suite (--skip two_gpus_ on one GPU; the Docker test, which needs
#           an engine, is left out), then the CUDA namespace matrix (tests/gpu_namespaces.rs,
#           MPS off, one line per cell), then the Python tests (GPU ones included);
#   mps   - the files a legacy ring's interprocess events make in /dev/shm (their names); then
#           with MPS on: what the MPS server keeps in /dev/shm, `gpuring doctor`, and the CUDA
#           namespace matrix again (which layouts MPS clients can use).
# Usage: scripts/gpu-containers.sh [tests] [mps]   (both by default). Results: $OUT/results.tgz.
set -uo pipefail
tar xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf "$OUT/results.tgz" -C $R . ; }
what=${*:-tests mps}
export PYTHONPATH=$PWD/$B/py/site
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
n=$(nvidia-smi -L | wc -l); if [ "$n" -ge 2 ]; then skip=(); else skip=(--skip two_gpus_); fi
# Run on their own below (the matrix) or not at all (Docker: no engine here).
mkdir -p $B/aside; mv $B/tests/gpu_namespaces $B/tests/docker $B/aside/ 2>/dev/null
matrix() { # $1: log name
  timeout 280 $B/aside/gpu_namespaces --ignored --nocapture --test-threads=1 > "$R/$1" 2>&1
  echo "gpu_namespaces exit $?"; grep -E "^gpu namespaces: \[|test result" "$R/$1"
}
if [[ $what == *tests* ]]; then
  timeout 330 $B/run-tests "${skip[@]}" > $R/gpu-tests.log 2>&1; echo "run-tests exit $?"
  tail -1 $R/gpu-tests.log; grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
  save
  matrix namespaces-mps-off.log; save
  GPURING_PIPELINE=$B/bin/pipeline timeout 100 \
    python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
  echo "pytest: $(tail -1 $R/pytest-gpu.log)"; save
fi
if [[ $what == *mps* ]]; then
  ls -la /dev/shm > $R/dev-shm-before.txt 2>&1
  $B/bin/pipeline --memory cuda --consumers 2 --seconds 4 > $R/pipeline-events.log 2>&1 &
  sleep 3; ls -la /dev/shm > $R/dev-shm-legacy-events.txt 2>&1; wait
  . scripts/mps.sh
  mps_start
  $B/bin/gpuring doctor --json > $R/doctor-mps.json 2> $R/doctor-mps.err; echo "doctor exit $?"
  ls -la /dev/shm > $R/dev-shm-mps.txt 2>&1
  matrix namespaces-mps-on.log
  mps_stop; save
fi
save
