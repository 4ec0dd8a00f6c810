#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a bundle made by ../shared/gpu-bundle: the
# fault tests of tests/gpu_faults.rs with MPS off and on, then the GPU soak with MPS on (victims
# killed holding slots or right after a release whose GPU work is still queued). Logs go to OUT.
#
#   scripts/gpu-faults.sh OUT [BUNDLE] [SOAK_MINUTES]
#
# PARTS (default "off on soak") picks what runs: "off" the kill tests with MPS off, "on" with MPS
# on, "soak" the soak with MPS on.
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
