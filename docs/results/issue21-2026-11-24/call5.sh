#!/usr/bin/env bash
# GPU call 5 for issue 21: call 2's script on the H100 (one GPU; the two-GPU kind was no longer
# lent), after the last CUDA edit (one `lacks` check shared by producer and consumer): the suite
# with --skip two_gpus_, the two-GPU tests as a DRY RUN, the Python tests.
exec bash "$(dirname "$0")/call2.sh"
