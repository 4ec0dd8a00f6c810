#!/usr/bin/env bash
# Fuzzes segment parsing and the receive loop (fuzz_targets/segment.rs) with libFuzzer.
#   fuzz/run.sh [RUNS] [JOBS]      default: 10 million runs, 2 jobs
# Needs the nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz`). The corpus lives in
# fuzz/corpus/segment (seeded by src/seeds.rs); crashes land in fuzz/artifacts/segment.
set -euo pipefail
cd "$(dirname "$0")"
runs=${1:-10000000}
jobs=${2:-2}
corpus=corpus/segment
if [ ! -d "$corpus" ] || [ -z "$(ls -A "$corpus")" ]; then
  cargo +nightly run --release --bin seeds -- "$corpus"
fi
# Each job runs runs/jobs executions; -max_len covers the seeds (a few pages).
cargo +nightly fuzz run segment "$corpus" -- \
  -runs=$((runs / jobs)) -jobs="$jobs" -workers="$jobs" -max_len=20000 -print_final_stats=1
