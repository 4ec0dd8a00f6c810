#!/usr/bin/env bash
# Builds the Python wheel (python/, maturin) into a fresh venv and runs its pytest suite.
# Host tests run anywhere; the GPU tests (python/tests/test_cuda.py) are skipped, with the
# reason shown, where torch or a GPU is missing.
#
#   scripts/python-tests.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/py-venv
rm -rf "$venv" target/wheels
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "maturin>=1.9,<2" "pytest>=7" "numpy>=1.22"
# A debug wheel: the tests need correctness, not speed, and it builds faster. With the
# `test-support` hook (`gpuring._lose_context_after`), for the tests of a lost GPU context; the
# wheels for use (scripts/python-bundle.sh) are built without it.
"$venv/bin/maturin" build -q -m python/Cargo.toml --features test-support -o target/wheels
"$venv/bin/pip" install -q --disable-pip-version-check target/wheels/gpuring-*.whl
# The Rust producer the tests start (tests/conftest.py finds it under target/).
cargo build -q --example pipeline
"$venv/bin/python" -m pytest -ra python/tests "$@"
