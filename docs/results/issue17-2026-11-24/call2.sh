#!/usr/bin/env bash
# Issue 17, final code, one device command: with MPS on, the slow-consumer figures (Queue and
# Latest, host and CUDA, each twice) and the GPU bench matrix before/after; then with MPS off
# (as every earlier suite run: its fault tests poison a shared MPS server on purpose) the GPU
# suite and the Python GPU tests.
set -uo pipefail
B=target/gpu-bundle
R=/tmp/r; mkdir -p $R
save() { tar czf $OUT/results.tgz -C $R . ; }
source scripts/mps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mps_start
for run in 1 2; do
for mem in cuda host; do
  for mode in queue latest; do
    f=$R/slow-$mem-$mode-$run.json
    timeout 40 $B/bin/gpuring bench --memory $mem --policy overwrite --mode $mode --capacity 8 \
      --consumers 2 --size 64K --seconds 3 --slow-hold-ms 40 --json > $f 2> $R/slow-$mem-$mode-$run.err
    echo "slow $mem $mode run $run exit $?: $(python3 -c "import json,sys; d=json.load(open('$f')); w,s=d['without_slow'],d['with_slow']; print('producer %.0f -> %.0f fps (%.3fx), fast consumers %.0f -> %.0f fps (%.3fx), slow consumer %.0f fps lost %d, bad %d acct %d' % (w['producer_fps'], s['producer_fps'], d['producer_ratio'], sum(w['consumer_fps'][:2])/2, sum(s['consumer_fps'][:2])/2, d['fast_consumer_ratio'], s['consumer_fps'][-1], s['lost'][-1], w['bad_bytes']+s['bad_bytes'], w['accounting_errors']+s['accounting_errors']))" 2>&1)"
  done
done
done
save
bench() {  # $1: before|after, $2: tag
  local bin=$B/bin/gpu_bench; [ $1 = before ] && bin=$B/bin/gpu_bench_before
  timeout 80 $bin --consumers 1,4 --sizes 64K,8M --policies block --seconds 1 > $R/bench-$1-$2.md 2>&1
  echo "bench $1 $2 exit $?: $(grep -E '^\| [14] \| (64 KiB|8 MiB) \| block \|' $R/bench-$1-$2.md | awk -F'|' '{printf "%s/%s %s; ", $2, $3, $5}')"
}
bench before a; bench after a; save
mps_stop
timeout 300 $B/run-tests > $R/gpu-tests.log 2>&1; echo "run-tests (MPS off) exit $?"
tail -1 $R/gpu-tests.log
grep -E "FAILED|panicked|slow_holder|mixed_modes|spares_exhausted" $R/gpu-tests.log | head -20; save
export PYTHONPATH=$PWD/$B/py/site
GPURING_PIPELINE=$B/bin/pipeline timeout 100 python3 -m pytest -ra -p no:cacheprovider python/tests > $R/pytest-gpu.log 2>&1
echo "pytest (MPS off): $(tail -1 $R/pytest-gpu.log)"; save
