#!/usr/bin/env bash
# The GPU checks of the batcher, from the repository root with the bundle carried as
# target/gpu-bundle.tar.xz (`../shared/gpu-bundle`, `scripts/python-bundle.sh`, `tar cJf`) and
# two variants of the gpuring binary in target/dev-variants.tar.xz (`strip --strip-debug`ped,
# unpacked to target/dev/), each built with one edit of `BatchMemory::join` for `Cuda` in
# src/batch/memory.rs: `gpuring-nojoin` (returns at once: the batch's stream does not join the
# cameras' copies, so the late-frame test must fail with it) and `gpuring-streamjoin`
# (`out.stream().wait_for(&lane.stream)`: joins each camera's whole stream, as before the copy
# event; the roofline's before, and the not-held test must fail with it). Writes its logs and
# JSON into $OUT/results.tar.gz (few files come back from a call), and a summary.
cd "$(dirname "$0")/../../.."
FINAL=$OUT; OUT=/tmp/results; rm -rf $OUT; mkdir -p $OUT
tar xJf target/gpu-bundle.tar.xz -C target
tar xJf target/dev-variants.tar.xz -C target
B=target/gpu-bundle
export PYTHONPATH=$PWD/$B/py/site
mkdir -p $B/aside; mv $B/tests/gpu_namespaces $B/tests/docker $B/aside/ 2>/dev/null
# The suite, one GPU, MPS off.
timeout 330 $B/run-tests --skip two_gpus_ > $OUT/gpu-tests.log 2>&1; echo "run-tests exit $?" >> $OUT/gpu-tests.log
grep -E "gpu_batch|gpu_pitched|gpu_batches|gpu_a_batch" $OUT/gpu-tests.log > $OUT/gpu_batch.log
# The late-frame test against a batcher that does not join: it must fail.
rm -rf /tmp/nojoin; cp -r $B /tmp/nojoin; cp target/dev/gpuring-nojoin /tmp/nojoin/bin/gpuring
timeout 100 /tmp/nojoin/tests/gpu_batch --include-ignored --exact --nocapture \
  gpu_pitched_frames_written_late_are_packed_in_order > $OUT/nojoin.log 2>&1
echo "exit $? (must not be 0)" >> $OUT/nojoin.log
# The not-held test against a batcher that joins each camera's whole stream: it must fail.
rm -rf /tmp/streamjoin; cp -r $B /tmp/streamjoin; cp target/dev/gpuring-streamjoin /tmp/streamjoin/bin/gpuring
timeout 100 /tmp/streamjoin/tests/gpu_batch --include-ignored --exact --nocapture \
  gpu_a_batch_does_not_wait_for_a_frame_it_does_not_hold > $OUT/streamjoin.log 2>&1
echo "exit $? (must not be 0)" >> $OUT/streamjoin.log
GPURING_PIPELINE=$B/bin/pipeline timeout 150 python3 -m pytest -ra -p no:cacheprovider python/tests > $OUT/pytest-gpu.log 2>&1
echo "pytest exit $?" >> $OUT/pytest-gpu.log
. scripts/mps.sh; mps_start
demo() { timeout 100 python3 benches/batch/resnet.py --seconds 20 --json $OUT/$1.json "${@:2}" > $OUT/$1.log 2>&1; echo "exit $?" >> $OUT/$1.log; }
demo resnet --gpuring $B/bin/gpuring
roof() { timeout 60 python3 benches/batch/resnet.py --width 1920 --height 1080 --roofline --warm 8 --seconds 8 --json $OUT/$1.json --gpuring $2 > $OUT/$1.log 2>&1; echo "exit $?" >> $OUT/$1.log; }
roof roofline-1 $B/bin/gpuring
roof roofline-streamjoin-1 target/dev/gpuring-streamjoin
roof roofline-2 $B/bin/gpuring
roof roofline-streamjoin-2 target/dev/gpuring-streamjoin
mps_stop
for f in gpu-tests pytest-gpu nojoin streamjoin; do echo "$f: $(tail -n 1 $OUT/$f.log)"; done > $FINAL/summary.txt
grep -E "gpu tests:|passed|failed" $OUT/gpu-tests.log | tail -n 2 >> $FINAL/summary.txt
for j in $OUT/*.json; do echo "$(basename $j): $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print([{k: round(v, 4) if isinstance(v, float) else v for k, v in c.items() if k in ('batches_per_s', 'age_ms_p50', 'age_ms_p99', 'to_close_ms_p50', 'share_of_floor', 'bad_bytes', 'present', 'stale', 'absent')} for c in d['consumers']])" $j)"; done >> $FINAL/summary.txt
tar czf $FINAL/results.tar.gz -C /tmp results
cat $FINAL/summary.txt
