#!/usr/bin/env bash
# The batcher's copy rate at 1080p for 8, 4 and 2 cameras (and 8 with one consumer), MPS on,
# from the repository root with the bundle carried as target/gpu-bundle.tar.xz. JSON under $OUT.
cd "$(dirname "$0")/../../.."
tar xJf target/gpu-bundle.tar.xz -C target
B=target/gpu-bundle
export PYTHONPATH=$PWD/$B/py/site
. scripts/mps.sh; mps_start
for cfg in "8 1" "8 2" "4 2" "2 2"; do
  set -- $cfg
  timeout 60 python3 benches/batch/resnet.py --gpuring $B/bin/gpuring --width 1920 --height 1080 \
    --roofline --warm 8 --seconds 8 --cameras $1 --consumers $2 --json $OUT/roof-c$1-k$2.json > /dev/null 2>&1
  echo "cameras $1 consumers $2 exit $?"
done
mps_stop
