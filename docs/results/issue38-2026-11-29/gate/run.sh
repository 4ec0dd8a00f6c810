#!/usr/bin/env bash
# The Lossless gate's refresh reading only the entries that gate (new) against the whole table
# (old), on the GPU machine: old and new peer benches alternated (floor, gpuring, iceoryx2 in
# one criterion run each), every process on its own physical core, at depth 4 and then 1.
# Usage: run.sh DIR, where DIR holds old/ and new/, each with `handoff` (benches/peers/iceoryx2,
# `cargo bench --no-run`). Results: $OUT/d4/compare/ and $OUT/d1/compare/.
set -uo pipefail
D=$(cd "$1" && pwd); S=$(cd "$(dirname "$0")/../../../../scripts" && pwd); O=$OUT
cpus=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do
  n=${c##*cpu}; first=$(cut -d, -f1 < "$c/topology/thread_siblings_list" | cut -d- -f1)
  [ "$n" = "$first" ] && [ "$n" != 0 ] && echo "$n"
done | sort -n | head -5 | paste -sd,)
export GPURING_BENCH_CPUS=$cpus
for d in 4 1; do
  OUT=$O/d$d GPURING_BENCH_DEPTH=$d "$S/compare-bench.sh" "$D/old" "$D/new" peers "${ROUNDS:-4}"
done
