#!/usr/bin/env bash
# The stamp CASes' guess (cd7a974) against the code before it (351b0a2), on the GPU machine:
# the floor, gpuring and iceoryx2 round trips in one criterion run per binary (old and new
# alternated, each process placed on its own physical core), then the one-thread cost.
# Usage: run.sh DIR, where DIR holds old/ and new/, each with `handoff` (benches/peers/iceoryx2,
# `cargo bench --no-run`) and `host` (`cargo bench --bench host --no-default-features --no-run`).
# Results: $OUT/compare/ (then `python3 scripts/compare-bench.py $OUT/compare` is not needed:
# each peers log ends with its own table).
set -uo pipefail
D=$(cd "$1" && pwd); S=$(cd "$(dirname "$0")/../../../../scripts" && pwd)
mkdir -p "$OUT/compare"
lscpu > "$OUT/compare/lscpu.txt"
# One CPU per physical core (the first of its siblings), skipping CPU 0 (interrupts).
cpus=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do
  n=${c##*cpu}; first=$(cut -d, -f1 < "$c/topology/thread_siblings_list" | cut -d- -f1)
  [ "$n" = "$first" ] && [ "$n" != 0 ] && echo "$n"
done | sort -n | head -5 | paste -sd,)
export GPURING_BENCH_CPUS=$cpus
echo "GPURING_BENCH_CPUS=$cpus" | tee "$OUT/compare/cpus-used.txt"
"$S/compare-bench.sh" "$D/old" "$D/new" peers "${ROUNDS:-3}"
for i in 1 2; do
  for side in old new; do
    w=$(mktemp -d)
    (cd "$w" && timeout 60 "$D/$side/host" --bench --quick same_thread > "$OUT/compare/same-thread-$side-$i.log" 2>&1)
    echo "same_thread $side $i exit $? ($(date +%T))"; rm -rf "$w"
  done
done
