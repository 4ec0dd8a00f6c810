#!/usr/bin/env bash
# Experiment: serial gpu_ring unfenced controls at several spins; peers/host benches for v0 v1 v3.
E=$(cd "$(dirname "$0")" && pwd)
nvidia-smi -L > $OUT/gpu.txt; nproc >> $OUT/gpu.txt
{
for spin in 200000 2000000 20000000; do
  for t in without_release_fence_frames_tear without_release_fence_vmm_frames_tear; do
    echo "== spin $spin $t $(date +%T)"
    FENCE_SPIN_NS=$spin timeout 100 $E/gpu_ring --include-ignored --test-threads=1 --exact $t 2>&1 | grep -E "unfenced|test result|panicked" | head -8
  done
done
echo "== fenced at 20ms"
FENCE_SPIN_NS=20000000 timeout 60 $E/gpu_ring --include-ignored --test-threads=1 --exact release_fence_prevents_torn_frames 2>&1 | grep -E "unfenced|test result|panicked" | head -5
} > $OUT/gpu_ring.log 2>&1
for i in 1 2; do for v in v0 v3 v1; do
  w=$(mktemp -d); (cd $w && timeout 90 $E/$v/handoff --bench --quick 'roundtrip.*(64B|4KiB)' > $OUT/peers-$v-$i.log 2>&1; echo "exit $? $(date +%T)" >> $OUT/peers-$v-$i.log); rm -rf $w
done; done
for i in 1 2; do for v in v0 v3 v1; do
  w=$(mktemp -d); (cd $w && timeout 60 $E/$v/host --bench --quick same_thread > $OUT/host-$v-$i.log 2>&1); rm -rf $w
done; done
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
