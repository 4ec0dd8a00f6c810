#!/usr/bin/env bash
# GPU call 4 for issue 21: call 2's script, run on the H100 (one GPU) with call 3's bundle, the
# final code: the suite with --skip two_gpus_, the two-GPU tests as a DRY RUN, the Python tests.
exec bash "$(dirname "$0")/call2.sh"
