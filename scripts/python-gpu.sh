#!/usr/bin/env bash
# On the GPU machine, from the repository root, with a bundle made by ../shared/gpu-bundle and
# scripts/python-bundle.sh: the Python GPU tests, the torch example on the Rust pipeline, and
# the torch bench against torch.multiprocessing with MPS off, then on. Logs go to OUT.
#
#   scripts/python-gpu.sh OUT [BUNDLE]
set -uo pipefail
out=${1:?usage: scripts/python-gpu.sh OUT [BUNDLE]}
bundle=${2:-target/gpu-bundle}
mkdir -p "$out"
export PYTHONPATH=$PWD/$bundle/py/site
if ! python3 -c "import numpy" 2>/dev/null; then
  mkdir -p /tmp/gpuring-numpy && python3 -m zipfile -e "$bundle"/py/numpy-*.whl /tmp/gpuring-numpy
  export PYTHONPATH=$PYTHONPATH:/tmp/gpuring-numpy
fi
python3 -c "import torch, gpuring; print('torch', torch.__version__, 'gpuring', gpuring.__version__, torch.cuda.get_device_name(0))" | tee "$out/versions.txt"

GPURING_PIPELINE=$bundle/bin/pipeline timeout 300 python3 -m pytest -ra -v -s -p no:cacheprovider \
  python/tests > "$out/pytest-gpu.log" 2>&1
echo "pytest: $(tail -1 "$out/pytest-gpu.log")"

"$bundle/bin/pipeline" --consumers 0 --external 1 --name cam0 --fps 0 --seconds 5 \
  > "$out/pipeline-torch.log" 2>&1 &
timeout 90 python3 examples/python/consumer_torch.py cam0 > "$out/consumer_torch.log" 2>&1
wait
echo "example: $(tail -1 "$out/consumer_torch.log")"

timeout 240 python3 benches/peers/torch_gpuring.py --json "$out/torch-bench-mps-off.json" \
  > "$out/torch-bench-mps-off.log" 2>&1
cat "$out/torch-bench-mps-off.log"
# shellcheck source=scripts/mps.sh
. "$(dirname "$0")/mps.sh"
mps_start
timeout 240 python3 benches/peers/torch_gpuring.py --json "$out/torch-bench-mps-on.json" \
  > "$out/torch-bench-mps-on.log" 2>&1
mps_stop
cat "$out/torch-bench-mps-on.log"
