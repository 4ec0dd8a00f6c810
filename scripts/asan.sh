#!/usr/bin/env bash
# Runs the ring's unit tests and the multi-process tests (host memory) under AddressSanitizer,
# with the nightly toolchain (the one cargo fuzz uses). Miri cannot be installed here; ASan
# catches out-of-bounds and use-after-free accesses in the shared-memory code instead.
#   scripts/asan.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
export RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export CARGO_TARGET_DIR=target/asan
target=$(rustc +nightly -vV | sed -n 's/^host: //p')
# conformance writes and checks the test pattern: feature test-support (not a default one).
cargo +nightly test --target "$target" --features test-support \
  --lib --test conformance --test api --test open_errors "$@"
