#!/usr/bin/env bash
# Call 4 ran this same script (as call2.sh) on the H100, one GPU, with call 3's bundle: the final code.
# GPU call 2 for issue 21, on the final code: the whole suite, the two-GPU tests included where
# the machine has two GPUs (else skipped by name, --skip two_gpus_, and said so), the peers
# bench and `gpuring doctor` where there are two, and the Python GPU tests.
set -uo pipefail
tar xJf target/gpu-bundle.tar.xz -C target 2>/dev/null ||
  python3 -c "import tarfile; tarfile.open('target/gpu-bundle.tar.xz').extractall('target')"
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv,noheader > $R/gpu.txt 2>&1
nvidia-smi topo -m > $R/topo.txt 2>&1
n=$(nvidia-smi -L | wc -l); echo "GPUs: $n"
if [ "$n" -ge 2 ]; then skip=(); else skip=(--skip two_gpus_); fi
echo "run-tests ${skip[*]:-(no skip)}"
timeout 380 $B/run-tests "${skip[@]}" > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
grep -E "consumer on device|one process|reader on GPU|victim killed|producer killed|reader ended|policy SameUid" $R/gpu-tests.log | head -40
save
if [ "$n" -lt 2 ]; then
  # Not a test of peer access: one GPU stands for both, to check the two-GPU tests' own logic.
  GPURING_PEERS_DRY_RUN=1 timeout 300 $B/tests/gpu_peers --include-ignored --test-threads=1 --nocapture two_gpus_ > $R/gpu-peers-dry-run.log 2>&1
  echo "two-GPU tests, DRY RUN on one GPU: exit $?"; grep -E "test result|FAILED|panicked" $R/gpu-peers-dry-run.log | head -12
fi
$B/bin/gpuring doctor --quick > $R/doctor.txt 2>&1; grep peer-access $R/doctor.txt
if [ "$n" -ge 2 ]; then
  timeout 150 $B/bin/gpu_bench --peers --sizes 64K,1M,8M,32M --md $R/peers.md > $R/gpu-bench-peers.txt 2>&1
  echo "gpu_bench --peers exit $?"; cat $R/peers.md
fi
save
# Within the call's 600 s: the Python tests only if time is left.
[ "$SECONDS" -lt 470 ] || { echo "pytest skipped: ${SECONDS}s used"; exit 0; }
PYTHONPATH=$PWD/$B/py/site GPURING_PIPELINE=$B/bin/pipeline timeout 100 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
