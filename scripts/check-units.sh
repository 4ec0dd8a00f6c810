#!/usr/bin/env bash
# Checks the systemd units users copy (deploy/systemd/*@.service) against the pipeline example
# they run, without systemd running:
#
# 1. `systemd-analyze verify` of an instance of each, with ExecStart='s program pointed at the
#    example just built (verify refuses a program that does not exist): any message it prints,
#    an unknown key or a value it cannot parse included, fails the check;
# 2. the units' command lines themselves: the producer's and, twice, the consumer's (the
#    producer waits for two), run as written with %i set, in a ring directory of their own, with
#    small frames, and the producer made to lose its GPU context after a few hundred ring
#    operations (GPURING_TEST_LOSE_CONTEXT, feature `test-support`): the producer must exit with
#    75 and each consumer, having received frames, with 4, and each unit must name its program's status in
#    RestartForceExitStatus= and SuccessExitStatus=, so that the statuses the units restart on
#    are the ones the program gives.
#
#   scripts/check-units.sh        (builds target/debug/examples/pipeline if it is missing)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v systemd-analyze >/dev/null; then
  echo "check-units: needs systemd-analyze (Debian: apt-get install systemd)" >&2
  exit 1
fi
target=${CARGO_TARGET_DIR:-target}
pipeline=$(realpath -m "$target/debug/examples/pipeline")
if [ ! -x "$pipeline" ]; then
  cargo build --all-features --example pipeline
fi
# The program as the units name it, which the copies here replace.
installed=/usr/local/bin/pipeline

tmp=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir -p "$tmp/units" "$tmp/rings"

# 1. systemd-analyze verify, of the instance `ci-units` of each template.
instances=()
for unit in deploy/systemd/*@.service; do
  base=$(basename "$unit")
  if ! grep -q "^ExecStart=$installed " "$unit"; then
    echo "check-units: $unit: ExecStart= does not run $installed" >&2
    exit 1
  fi
  sed "s|^ExecStart=$installed |ExecStart=$pipeline |" "$unit" >"$tmp/units/$base"
  instances+=("./${base%@.service}@ci-units.service")
done
# --man=no: no man pages to look up. Run in the copies' directory, whose units (the templates)
# it loads for the instances.
if ! out=$(cd "$tmp/units" && systemd-analyze verify --man=no "${instances[@]}" 2>&1) ||
  [ -n "$out" ]; then
  echo "check-units: systemd-analyze verify of deploy/systemd/ failed:" >&2
  echo "$out" >&2
  exit 1
fi
echo "check-units: systemd-analyze verify: ${instances[*]#./} clean"

# 2. The command lines, run as the units write them.
command_of() { # UNIT: ExecStart='s words, %i replaced, the program the one built here
  local line
  line=$(sed -n "s|^ExecStart=$installed ||p" "$1")
  line=${line//%i/ci-units}
  echo "$pipeline $line"
}
statuses_of() { # UNIT KEY: the statuses the unit lists under KEY=
  sed -n "s/^$2=//p" "$1" | tr ' ' '\n'
}
# Small frames (the units do not set their size) keep the ring small and the run short.
small=(--width 64 --height 16)
read -ra producer <<<"$(command_of deploy/systemd/gpuring-producer@.service)"
read -ra consumer <<<"$(command_of deploy/systemd/gpuring-consumer@.service)"
export GPURING_DIR=$tmp/rings
for k in 1 2; do
  timeout 60 "${consumer[@]}" "${small[@]}" >"$tmp/consumer$k.log" 2>&1 &
  pids+=($!)
done
GPURING_TEST_LOSE_CONTEXT=400 timeout 60 "${producer[@]}" "${small[@]}" >"$tmp/producer.log" 2>&1 &
pids+=($!)

check() { # WHO STATUS EXPECTED UNIT
  local who=$1 status=$2 expected=$3 unit=$4 key
  if [ "$status" != "$expected" ]; then
    echo "check-units: the $who exited with $status, not $expected; its output:" >&2
    cat "$tmp/$who.log" >&2
    exit 1
  fi
  for key in RestartForceExitStatus SuccessExitStatus; do
    if ! statuses_of "$unit" "$key" | grep -qx "$status"; then
      echo "check-units: $unit: $key= does not list $status, the $who's status" >&2
      exit 1
    fi
  done
}
status=0
wait "${pids[2]}" || status=$?
check producer "$status" 75 deploy/systemd/gpuring-producer@.service
for k in 1 2; do
  status=0
  wait "${pids[$((k - 1))]}" || status=$?
  check "consumer$k" "$status" 4 deploy/systemd/gpuring-consumer@.service
  # 4 comes after every byte was right (a bad one exits with 1); and frames came.
  if ! grep -Eq '^consumer \(pid [0-9]+\): [1-9][0-9]* frames' "$tmp/consumer$k.log"; then
    echo "check-units: consumer$k received no frame; its output:" >&2
    cat "$tmp/consumer$k.log" >&2
    exit 1
  fi
done
pids=()
echo "check-units: the units' command lines: the producer exited with 75 and its consumers with 4" \
  "after a lost context, statuses the units restart on"
