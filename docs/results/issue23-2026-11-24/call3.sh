#!/usr/bin/env bash
# GPU call 3 for issue 23: the CUDA bridge tests (the lossless chain, and the exporter and the
# importer of CUDA rings killed and restarted mid-stream), from tests/bridge.rs built in release.
set -uo pipefail
R=/tmp/r; mkdir -p $R
xz -dc target/bridge-gpu.xz > /tmp/bridge 2>/dev/null ||
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('target/bridge-gpu.xz'), open('/tmp/bridge','wb'))"
chmod +x /tmp/bridge
timeout 300 /tmp/bridge --include-ignored --test-threads=1 --nocapture > $R/bridge-tests.log 2>&1
echo "bridge tests exit $?"
grep -E "^test |test result|far .*consumer" $R/bridge-tests.log
tar czf $OUT/results.tgz -C $R .
