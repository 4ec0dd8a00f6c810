#!/usr/bin/env bash
# gst-bench: frames/s of one frame stream through gpuring's elements, against the same stream
# through GStreamer's shmsink/shmsrc, and against no transport at all (the floor: the source
# into fakesink in one process), in one run.
#
#   scripts/gst-bench.sh [N] [SIZES] [cuda]
#   N frames (default 2000) per case; SIZES like "640x480 1920x1080"; "cuda" adds the CUDA
#   cases (videotestsrc ! cudaupload ! gpuringsink, and gpuringsrc ! fakesink in CUDA memory).
# Each case's time runs from the producer's start to the consumer's exit after its N-th frame
# (the producer waits for its consumer to join first; shmsrc never sees an EOS, so its
# consumer stops itself after N frames with identity eos-after).
set -euo pipefail
n=${1:-2000}; sizes=${2:-"640x480 1920x1080"}; cuda=${3:-}
now() { date +%s%N; }
fps() { awk -v n="$n" -v a="$1" -v b="$2" 'BEGIN { printf "%.0f", n / ((b - a) / 1e9) }'; }
# GST_BENCH_SOURCE=freeze (default): one rendered frame pushed N times (imagefreeze), so the
# source costs next to nothing. Note that shmsink then sends that one frame without a copy:
# upstream allocated it from shmsink's shared-memory pool. =render: videotestsrc renders every
# frame (into shmsink's pool for shmsink; gpuringsink copies each frame into a slot).
case ${GST_BENCH_SOURCE:-freeze} in
  freeze) src() { echo "videotestsrc num-buffers=1 pattern=ball ! video/x-raw,format=RGBA,width=$1,height=$2,framerate=1000/1 ! imagefreeze num-buffers=$n"; } ;;
  render) src() { echo "videotestsrc num-buffers=$n pattern=ball ! video/x-raw,format=RGBA,width=$1,height=$2,framerate=1000/1"; } ;;
  *) echo "GST_BENCH_SOURCE must be freeze or render" >&2; exit 2 ;;
esac
# Build the plugin registry first, so that no timed case pays for the scan.
gst-inspect-1.0 gpuring > /dev/null 2>&1 || true
printf "%-10s %-28s %9s %9s\n" size case frames/s vs-floor
for s in $sizes; do
  w=${s%x*}; h=${s#*x}; bytes=$((w * h * 4))
  t0=$(now); gst-launch-1.0 -q $(src $w $h) ! fakesink sync=false; t1=$(now)
  floor=$(fps $t0 $t1)
  printf "%-10s %-28s %9s %9s\n" $s "floor (no transport)" $floor 1.00
  row() { printf "%-10s %-28s %9s %9.2f\n" $s "$1" $2 $(awk -v a=$2 -v f=$floor 'BEGIN{print a/f}'); }
  ring=bench-$$-$w
  gst-launch-1.0 -q gpuringsrc ring=$ring ! fakesink sync=false & c=$!
  t0=$(now); gst-launch-1.0 -q $(src $w $h) ! gpuringsink ring=$ring sync=false wait-for-consumers=1
  wait $c; t1=$(now); row "gpuringsink -> gpuringsrc" $(fps $t0 $t1)
  sock=/tmp/gst-bench-$$.sock; rm -f $sock
  t0=$(now)
  gst-launch-1.0 -q $(src $w $h) ! shmsink socket-path=$sock wait-for-connection=true shm-size=$((bytes * 12)) sync=false 2>/dev/null & p=$!
  until [ -S $sock ]; do sleep 0.01; done
  gst-launch-1.0 -q shmsrc socket-path=$sock is-live=true ! "video/x-raw,format=RGBA,width=$w,height=$h,framerate=1000/1" ! identity eos-after=$n ! fakesink sync=false
  t1=$(now); kill $p 2>/dev/null || true; wait $p 2>/dev/null || true; rm -f $sock
  row "shmsink -> shmsrc" $(fps $t0 $t1)
  if [ "$cuda" = cuda ]; then
    t0=$(now); gst-launch-1.0 -q $(src $w $h) ! cudaupload ! "video/x-raw(memory:CUDAMemory)" ! fakesink sync=false; t1=$(now)
    cfloor=$(fps $t0 $t1)
    printf "%-10s %-28s %9s %9s\n" $s "floor, cudaupload" $cfloor "-"
    ring=benchc-$$-$w
    gst-launch-1.0 -q gpuringsrc ring=$ring ! "video/x-raw(memory:CUDAMemory)" ! fakesink sync=false & c=$!
    t0=$(now); gst-launch-1.0 -q $(src $w $h) ! cudaupload ! "video/x-raw(memory:CUDAMemory)" ! gpuringsink ring=$ring sync=false wait-for-consumers=1
    wait $c; t1=$(now); a=$(fps $t0 $t1)
    printf "%-10s %-28s %9s %9.2f (vs the cudaupload floor)\n" $s "CUDA: gpuringsink -> src" $a $(awk -v a=$a -v f=$cfloor 'BEGIN{print a/f}')
  fi
done
