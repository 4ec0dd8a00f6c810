#!/usr/bin/env bash
# The GPU bench with MPS off and on, then the torch.multiprocessing baseline, in one command, on
# a machine with a CUDA GPU. Writes JSON and markdown into OUTDIR (default: gpu-bench-out).
#
#   scripts/gpu-bench.sh [OUTDIR] [-- extra flags for the gpu bench]
#
# The bench binary is target/gpu-bundle/bin/gpu_bench (../shared/gpu-bundle builds it as an
# example) if present, else it is built here with cargo. MPS is started and stopped here with the
# commands in docs/performance.md; set NO_MPS=1 to skip the MPS-on run, MPS_ONLY=1 to skip the
# MPS-off run, NO_TORCH=1 to skip torch.
set -euo pipefail
out=${1:-gpu-bench-out}; shift || true
[ "${1:-}" = "--" ] && shift
mkdir -p "$out"
bin=target/gpu-bundle/bin/gpu_bench
if [ ! -x "$bin" ]; then
  cargo build --release --features test-support --example gpu_bench
  bin=target/release/examples/gpu_bench
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"

# shellcheck source=scripts/mps.sh
. "$(dirname "$0")/mps.sh"
torch() {
  [ -n "${NO_TORCH:-}" ] && return 0
  python3 benches/peers/torch_mp.py --seconds "${TORCH_SECONDS:-2}" --consumers 1 4 \
    --json "$out/torch-$1.json" 2>&1 | tee "$out/torch-$1.log"
}

if [ -z "${MPS_ONLY:-}" ]; then
  "$bin" --label mps-off --json "$out/gpu-mps-off.json" --md "$out/gpu-mps-off.md" "$@" \
    2>&1 | tee "$out/gpu-mps-off.log"
  torch mps-off
fi
if [ -z "${NO_MPS:-}" ]; then
  mps_start
  trap mps_stop EXIT
  "$bin" --label mps-on --json "$out/gpu-mps-on.json" --md "$out/gpu-mps-on.md" "$@" \
    2>&1 | tee "$out/gpu-mps-on.log"
  torch mps-on
fi
if [ -z "${NO_TORCH:-}" ]; then
  for mode in mps-off mps-on; do
    [ -f "$out/gpu-$mode.json" ] && [ -f "$out/torch-$mode.json" ] || continue
    python3 benches/peers/compare.py --torch "$out/torch-$mode.json" "$out/gpu-$mode.json" \
      | tee "$out/compare-$mode.md"
  done
fi
