#!/usr/bin/env bash
# The peer bench (floor, gpuring, iceoryx2 in one criterion run) with each process on its own
# physical core and without placement, alternated; then round trips at depth 1 and 4, placed
# (how much of each gap is the ring's footprint); then the one-thread cost, placed.
# Usage: run.sh DIR, where DIR holds `handoff` (benches/peers/iceoryx2, `cargo bench --no-run`)
# and `host` (`cargo bench --bench host --no-default-features --no-run`). Results: $OUT/placed/.
# `FULL=1 run.sh DIR` instead runs ROUNDS placed round-trip runs at criterion's full length
# (2 s a case, not --quick), to see whether longer runs spread less (full-*.log).
set -uo pipefail
D=$(cd "$1" && pwd); R=$OUT/placed; mkdir -p "$R"; N=${ROUNDS:-6}
lscpu > "$R/lscpu.txt"
# One CPU per physical core (the first of its siblings), skipping CPU 0 (interrupts).
cpus=$(for c in /sys/devices/system/cpu/cpu[0-9]*; do
  n=${c##*cpu}; first=$(cut -d, -f1 < "$c/topology/thread_siblings_list" | cut -d- -f1)
  [ "$n" = "$first" ] && [ "$n" != 0 ] && echo "$n"
done | sort -n | head -5 | paste -sd,)
echo "GPURING_BENCH_CPUS=$cpus" | tee "$R/cpus-used.txt"
bench() { # LOG FILTER [ENV...]
  local log=$1 filter=$2; shift 2
  local w; w=$(mktemp -d)
  (cd "$w" && env "$@" timeout 200 "$D/handoff" --bench ${QUICK---quick} "$filter" > "$R/$log" 2>&1)
  echo "$log exit $? ($(date +%T))"; rm -rf "$w"
}
if [ "${FULL:-0}" = 1 ]; then
  for i in $(seq "$N"); do QUICK='' bench "full-$i.log" roundtrip GPURING_BENCH_CPUS="$cpus"; done
  exit 0
fi
for i in $(seq "$N"); do
  bench "placed-$i.log" roundtrip GPURING_BENCH_CPUS="$cpus"
  bench "free-$i.log" roundtrip GPURING_BENCH_CPUS=
done
for i in 1 2 3 4; do
  for d in 1 4; do
    bench "depth$d-$i.log" roundtrip GPURING_BENCH_CPUS="$cpus" GPURING_BENCH_DEPTH=$d
  done
done
for i in 1 2 3; do
  w=$(mktemp -d)
  (cd "$w" && GPURING_BENCH_CPUS=$cpus timeout 60 "$D/host" --bench --quick same_thread > "$R/same-thread-$i.log" 2>&1)
  echo "same_thread $i exit $? ($(date +%T))"; rm -rf "$w"
done
