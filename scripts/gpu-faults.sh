#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a bundle made by ../shared/gpu-bundle: the
# fault tests of tests/gpu_faults.rs with MPS off and on, then the GPU soak with MPS on (victims
# killed holding slots or right after a release whose GPU work is still queued). Logs go to OUT.
#
#   scripts/gpu-faults.sh OUT [BUNDLE] [SOAK_MINUTES]
#
# PARTS (default "off on soak") picks what runs: "off" the kill tests with MPS off, "on" with MPS
# on, "soak" the soak with MPS on. And the MPS fault runs (docs/gpu.md, "MPS or not"), each
# SOAK_MINUTES long: "term" MPS on, victims stopped by SIGTERM (releasers mid-kernel), where no
# other process may lose its context; "supervised" MPS on, SIGKILLs with 20 ms kernels running
# and the soak restarting whatever exits (faults, recovery time); "unsupervised-off" the same
# kills with MPS off and no restarts (kills are harmless there).
#
# Whatever happens, the script ends by killing what it started and quitting MPS: a faulted
# client left behind would keep the MPS server from taking new clients.
#
# If BUNDLE/old/gpu_faults exists (the same test built against an older gpuring, to show what
# the fix changed), its kill tests run too, each bounded by a timeout: a producer stalled for
# good shows as a timeout or a test failure there.
set -uo pipefail
out=${1:?usage: scripts/gpu-faults.sh OUT [BUNDLE] [SOAK_MINUTES]}
bundle=${2:-target/gpu-bundle}
minutes=${3:-3}
mkdir -p "$out"
kills='consumers_killed_right_after_release'

# shellcheck source=scripts/mps.sh
. "$(dirname "$0")/mps.sh"
faults() { # label
  timeout 240 "$bundle/tests/gpu_faults" --include-ignored --test-threads 1 --nocapture "$kills" \
    > "$out/faults-$1.log" 2>&1
  echo "faults $1: exit $? | $(grep -h 'killed right after release' "$out/faults-$1.log" | tr '\n' ' ')"
  if [ -x "$bundle/old/gpu_faults" ]; then
    for t in "${kills}_do_not_stall_the_producer_events" "${kills}_do_not_stall_the_producer_memory"; do
      timeout 50 "$bundle/old/gpu_faults" --include-ignored --exact --nocapture "$t" \
        > "$out/old-$1-${t##*_}.log" 2>&1
      rc=$?
      echo "old code, $t, $1: exit $rc$( [ $rc = 124 ] && echo ' (timed out: stalled)') | $(grep -h -m1 -E 'stuck|panicked|killed right' "$out/old-$1-${t##*_}.log")"
    done
  fi
}

cleanup() {
  trap - EXIT INT TERM
  pkill -KILL -f "$bundle/bin/soak" 2>/dev/null
  [ -n "${CUDA_MPS_PIPE_DIRECTORY:-}" ] && mps_stop
}
trap cleanup EXIT INT TERM

# A soak of the MPS fault runs: label, MPS (on/off), then the soak's own arguments.
mps_soak() {
  local label=$1 mps=$2; shift 2
  [ "$mps" = on ] && mps_start
  # The library's lifecycle events (a lost context, waits for the MPS server) with the soak's.
  RUST_LOG=gpuring=info timeout "$(awk "BEGIN { print int($minutes * 60 + 150) }")" \
    "$bundle/bin/soak" --memory cuda \
    --minutes "$minutes" "$@" > "$out/soak-$label.log" 2>&1
  echo "soak $label (MPS $mps): exit $?"
  grep -h '^soak: ' "$out/soak-$label.log" | tail -6
  if [ "$mps" = on ]; then
    # What the MPS daemon says of faults, refused clients and recovery.
    cp "$CUDA_MPS_LOG_DIRECTORY/control.log" "$out/mps-control-$label.log" 2>/dev/null
    cp "$CUDA_MPS_LOG_DIRECTORY/server.log" "$out/mps-server-$label.log" 2>/dev/null
    mps_stop
  fi
}

parts=" ${PARTS:-off on soak} "
[[ $parts == *" off "* ]] && faults mps-off
if [[ $parts == *" on "* || $parts == *" soak "* ]]; then
  mps_start
  [[ $parts == *" on "* ]] && faults mps-on
  if [[ $parts == *" soak "* ]]; then
    timeout $((minutes * 60 + 120)) "$bundle/bin/soak" --memory cuda --minutes "$minutes" \
      --kill-every-ms 60 > "$out/soak-gpu-mps-on.log" 2>&1
    echo "soak (MPS on): exit $?"
    tail -5 "$out/soak-gpu-mps-on.log"
    grep -h -i -m5 "mps\|rpc" "$out/soak-gpu-mps-on.log" || true
  fi
  mps_stop
fi
[[ $parts == *" term "* ]] && mps_soak term on --stop-signal term --kill-every-ms 150
# Under MPS each releaser's SIGKILL mid-kernel is a fault: a victim every 2 s gives the
# pipeline time to come back and run between faults.
[[ $parts == *" supervised "* ]] && mps_soak supervised on --supervise --kill-every-ms 2000 --restart-every-s 30
[[ $parts == *" unsupervised-off "* ]] && mps_soak unsupervised-off off --kill-every-ms 400 --restart-every-s 30
exit 0
