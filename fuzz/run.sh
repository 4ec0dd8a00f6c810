#!/usr/bin/env bash
# Runs the fuzz targets (fuzz_targets/*.rs) with libFuzzer, under AddressSanitizer:
#   fuzz/run.sh [TARGET|all] [RUNS] [JOBS]    default: every target in turn, 10 million runs
#                                             each, 1 job
# Targets: segment (a ring segment), bridge_message (a received bridge message), vmm_offer (a
# VMM producer's offer of its fds), frame_header (gst's frame header in a user header).
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). Each corpus lives in
# fuzz/corpus/TARGET (seeded by src/seeds.rs when empty); crashes land in fuzz/artifacts/TARGET,
# and a fixed one's input goes to fuzz/regressions/TARGET, which tests/fuzz_replay.rs (and
# gst/tests/frame_header_replay.rs) replay with the corpus on the stable toolchain.
# After a long run, minimize the corpus: cargo +nightly fuzz cmin TARGET corpus/TARGET -- -max_len=N
set -euo pipefail
cd "$(dirname "$0")"
targets=(segment bridge_message vmm_offer frame_header)
target=${1:-all}
runs=${2:-10000000}
jobs=${3:-1}
if [ "$target" != all ]; then
  if [[ ! " ${targets[*]} " =~ " $target " ]]; then
    echo "run.sh: no fuzz target '$target' (targets: ${targets[*]})" >&2
    exit 2
  fi
  targets=("$target")
fi
# Builds every target and the seed writer with the fuzzer's instrumentation (one build of
# gpuring and Zenoh instead of two).
cargo +nightly fuzz build
seeds=target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release/seeds
for t in "${targets[@]}"; do
  # The longest input worth trying: the seeds' size and then some (a segment is a few pages;
  # a bridge attachment is 56 bytes and its user header; an offer at most 16 bytes per pool).
  case $t in
    segment) max_len=20000 ;;
    bridge_message) max_len=4096 ;;
    vmm_offer) max_len=1024 ;;
    frame_header) max_len=512 ;;
  esac
  corpus=corpus/$t
  if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then
    "$seeds" "$t" "$corpus"
  fi
  # Each job runs runs/jobs executions.
  cargo +nightly fuzz run "$t" "$corpus" -- \
    -runs=$((runs / jobs)) -jobs="$jobs" -workers="$jobs" -max_len="$max_len" -print_final_stats=1
done
