#!/usr/bin/env bash
# Where a ring's frames lose their time: runs cells of the GPU bench with per-frame tracing
# (benches/gpu/trace.rs: every fill and read kernel's start and end on the GPU's clock, and
# the CPU moments around the ring's calls, moved onto it), then reads the traces back
# (scripts/gpu-profile.py) into where each frame's time goes. Needs a CUDA GPU.
#
#   scripts/gpu-profile.sh OUTDIR [BUNDLE] -- [gpu_bench flags]
#   scripts/gpu-profile.sh prof target/gpu-bundle -- --consumers 1 --sizes 8M --policies block
#
# One cell per run (one consumer count, one size, one policy). MPS is started here unless
# NO_MPS=1 (scripts/mps.sh). The traces stay in OUTDIR/trace-TAG/, the report in
# OUTDIR/profile-TAG.md.
set -euo pipefail
out=${1:?usage: gpu-profile.sh OUTDIR [BUNDLE] -- [gpu_bench flags]}; shift
bundle=target/gpu-bundle
if [ $# -gt 0 ] && [ "$1" != "--" ]; then bundle=$1; shift; fi
[ "${1:-}" = "--" ] && shift
here=$(dirname "$0")
. "$here/mps.sh"
if [ -z "${NO_MPS:-}" ]; then mps_start; trap mps_stop EXIT; fi
tag=$(echo "$*" | tr -c 'A-Za-z0-9' '_' | tr -s '_' | sed 's/^_//; s/_$//' | cut -c1-100)
dir="$out/trace-$tag"
rm -rf "$dir"; mkdir -p "$dir"
GPURING_GPU_BENCH_TRACE="$dir" "$bundle/bin/gpu_bench" --no-floors --seconds 0.5 --warmup 0.2 \
  "$@" > "$dir/bench.log" 2>&1 || { tail -30 "$dir/bench.log"; exit 1; }
python3 "$here/gpu-profile.py" "$dir" --title "gpu_bench $*" | tee "$out/profile-$tag.md"
