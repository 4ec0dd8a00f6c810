#!/usr/bin/env bash
# Adds the Python package to a GPU bundle, for a GPU machine that has Python and torch but no
# Rust and no network: run after ../shared/gpu-bundle, then carry target/gpu-bundle and run
# scripts/python-gpu.sh there.
#
#   scripts/python-bundle.sh [BUNDLE]     (default target/gpu-bundle)
#
# BUNDLE/py/site: the release abi3 wheel and pytest, unpacked (PYTHONPATH, no pip needed);
# BUNDLE/py/numpy-*.whl: numpy for cp312, unpacked there only if the machine lacks numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=${1:-target/gpu-bundle}
venv=target/py-venv-bundle
[ -x "$venv/bin/maturin" ] || { python3 -m venv "$venv"; "$venv/bin/pip" install -q "maturin>=1.9,<2"; }
rm -rf "$bundle/py" target/wheels-release && mkdir -p "$bundle/py/site"
"$venv/bin/maturin" build -q --release -m python/Cargo.toml -o target/wheels-release
wheels=$(mktemp -d)
"$venv/bin/pip" download -q --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" "pytest>=7" "numpy>=1.22"
for w in target/wheels-release/gpuring-*.whl "$wheels"/*.whl; do
  case "$w" in *numpy-*) cp "$w" "$bundle/py/" ;; *) python3 -m zipfile -e "$w" "$bundle/py/site" ;; esac
done
strip "$bundle"/py/site/gpuring/*.so
du -sh "$bundle"
