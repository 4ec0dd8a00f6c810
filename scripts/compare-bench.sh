#!/usr/bin/env bash
# Old and new binaries of the host bench and the GPU bench, alternated in one command on the GPU
# machine, so that a change's cost is a ratio measured under the same conditions:
#   host - benches/host.rs (criterion --quick; the one-thread cost and the round trips), A B A B
#   gpu  - gpu_bench --consumers 1,4 --sizes 64K,8M --policies block, MPS on, A B A B
# OLD and NEW are folders holding `host` (the host bench binary) and `gpu_bench`, both built
# with `cargo build --release --features cuda,test-support --example gpu_bench --bench host`.
#   hop  - gpu_bench --no-matrix (the floors and the paced hop), MPS off, old then new
#   peers - NEW/handoff, the iceoryx2 peer bench (benches/peers/iceoryx2, built with
#          `cargo bench --no-run` there): the floor, gpuring and iceoryx2 in one criterion run;
#          with OLD/handoff too, old and new alternated ROUNDS times (round trips only). Set
#          GPURING_BENCH_CPUS to place the processes (benches/peers/iceoryx2/README.md)
#   gst  - scripts/gst-bench.sh with OLD/gst then NEW/gst (each holding libgstgpuring.so), the
#          GStreamer of the bundle at $GST_BUNDLE (scripts/gst-bundle.sh): rendered frames, then
#          a repeated frame with the CUDA rows
# Usage: scripts/compare-bench.sh OLD NEW [host] [gpu] [hop] [peers] [gst] [ROUNDS]
# Results: $OUT/compare/.
# Then: python3 scripts/compare-bench.py $OUT/compare   (the ratios new/old).
# GPU_SIDES (default "old new") lists the gpu runs of a round; a side may add one bench flag
# after a "+", as in "old+fence=memory" (old binaries, --fence memory), to isolate one change.
set -uo pipefail
old=$(cd "$1" && pwd) new=$(cd "$2" && pwd); shift 2
rounds=2; what=""
for a in "$@"; do case $a in [0-9]*) rounds=$a ;; *) what="$what $a" ;; esac; done
what=${what:- host gpu}
R=${OUT:-.}/compare; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$R/gpu.txt" 2>&1
nproc > "$R/cpus.txt"
if [[ $what == *host* ]]; then
  for i in $(seq "$rounds"); do
    for side in old new; do
      dir=$old; [ $side = new ] && dir=$new
      timeout 200 "$dir/host" --bench --quick 'same_thread|roundtrip' \
        > "$R/host-$side-$i.log" 2>&1
      echo "host $side $i exit $?"
    done
  done
fi
if [[ $what == *hop* ]]; then
  for side in old new; do
    dir=$old; [ $side = new ] && dir=$new
    timeout 120 "$dir/gpu_bench" --no-matrix --consumers 1 --sizes 64K,8M --label "hop-mps-off-$side" \
      --json "$R/hop-mps-off-$side.json" --md "$R/hop-mps-off-$side.md" > "$R/hop-mps-off-$side.log" 2>&1
    echo "hop (MPS off) $side exit $? ($(date +%T))"
  done
fi
if [[ $what == *peers* ]]; then
  # Criterion keeps its data under the working directory's target/; the tables go to the log.
  if [ -x "$old/handoff" ]; then
    for i in $(seq "$rounds"); do
      for side in old new; do
        dir=$old; [ $side = new ] && dir=$new
        w=$(mktemp -d)
        (cd "$w" && timeout 200 "$dir/handoff" --bench --quick roundtrip > "$R/peers-$side-$i.log" 2>&1)
        echo "peers $side $i exit $? ($(date +%T))"; rm -rf "$w"
      done
    done
  else
    w=$(mktemp -d); (cd "$w" && timeout 400 "$new/handoff" --bench --quick > "$R/peers.log" 2>&1)
    echo "peers exit $? ($(date +%T))"; rm -rf "$w"
  fi
fi
if [[ $what == *gst* ]]; then
  # shellcheck source=/dev/null
  . "$GST_BUNDLE/env.sh"
  for side in old new; do
    dir=$old; [ $side = new ] && dir=$new
    export GST_PLUGIN_PATH_1_0=$dir/gst GST_REGISTRY_1_0=/tmp/gst-registry-$side.bin
    GST_BENCH_SOURCE=render timeout 250 "$(dirname "$0")/gst-bench.sh" 1000 "640x480 1920x1080" \
      > "$R/gst-render-$side.log" 2>&1
    echo "gst render $side exit $? ($(date +%T))"
    GST_BENCH_SOURCE=freeze timeout 200 "$(dirname "$0")/gst-bench.sh" 2000 "640x480 1920x1080" cuda \
      > "$R/gst-freeze-$side.log" 2>&1
    echo "gst freeze $side exit $? ($(date +%T))"
  done
fi
if [[ $what == *gpu* ]]; then
  # shellcheck source=scripts/mps.sh
  . "$(dirname "$0")/mps.sh"
  mps_start
  for i in $(seq "$rounds"); do
    for side in ${GPU_SIDES:-old new}; do
      dir=$old; [ "${side%%+*}" = new ] && dir=$new
      flag=(); [[ $side == *+* ]] && { f=${side#*+}; flag=("--${f%%=*}" "${f#*=}"); }
      timeout 150 "$dir/gpu_bench" --consumers 1,4 --sizes 64K,8M --policies block "${flag[@]}" \
        --label "$side-$i" --json "$R/gpu-$side-$i.json" --md "$R/gpu-$side-$i.md" \
        > "$R/gpu-$side-$i.log" 2>&1
      echo "gpu $side $i exit $? ($(date +%T))"
    done
  done
  mps_stop
fi
