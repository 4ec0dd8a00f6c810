#!/usr/bin/env bash
# Issue 19, second GPU call: the whole suite (MPS off) on the final code, the CLI tests now
# finding the gpuring binary in the bundle.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
timeout 330 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked" $R/gpu-tests.log | head -10
grep -E "^test (exporter|doctor|cli_)|^test .*doctor|^test .*exporter" $R/gpu-tests.log | head
save
