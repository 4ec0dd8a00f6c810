"""Shared helpers for the gpuring Python tests.

Host tests run everywhere (CI runs them in host mode). GPU tests need torch and a CUDA GPU and
are skipped, with that reason, where either is missing.

The Rust producer is the `pipeline` example: set GPURING_PIPELINE to its path, or build it
(`cargo build --release --example pipeline`) so it is found under target/.
"""
import os
import pathlib
import subprocess

import pytest

MUL = 0x9E3779B97F4A7C15
ROOT = pathlib.Path(__file__).resolve().parents[2]


def pattern_words(seq, n_words):
    """The u64 words of the pattern of message `seq` (src/testing/pattern.rs): seq * MUL + j."""
    import numpy as np
    base = np.uint64((seq * MUL) % (1 << 64))
    with np.errstate(over="ignore"):
        return np.arange(n_words, dtype=np.uint64) + base


def pattern_bytes(seq, length):
    import numpy as np
    words = pattern_words(seq, (length + 7) // 8)
    return words.astype("<u8").view(np.uint8)[:length]


@pytest.fixture
def ring_name(request):
    """A ring name unique to this test and process."""
    return f"pytest-{os.getpid()}-{request.node.name[:40]}"


def pipeline_binary():
    env = os.environ.get("GPURING_PIPELINE")
    if env:
        return env
    for candidate in (ROOT / "target/release/examples/pipeline", ROOT / "target/debug/examples/pipeline",
                      ROOT / "target/gpu-bundle/bin/pipeline"):
        if candidate.exists():
            return str(candidate)
    pytest.fail("the pipeline example is not built: run `cargo build --release --example pipeline` "
                "or set GPURING_PIPELINE")


def start_pipeline(name, memory, external, seconds=2.0, width=256, height=128, fps=0, capacity=8):
    """Starts the Rust pipeline producer with no consumers of its own, waiting for `external`."""
    return subprocess.Popen(
        [pipeline_binary(), "--name", name, "--memory", memory, "--consumers", "0",
         "--external", str(external), "--seconds", str(seconds), "--fps", str(fps),
         "--width", str(width), "--height", str(height), "--capacity", str(capacity)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
