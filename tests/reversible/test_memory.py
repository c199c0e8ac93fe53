"""Activation memory of a reversible stack does not grow with depth; plain backprop's does."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def peaks():
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "tests.reversible.memory_probe", "additive,affine", "8,64"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=True,
    ).stdout
    return json.loads(out.split("PEAKS ", 1)[1])


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_reversible_peak_does_not_grow_with_depth(peaks, kind, mode):
    shallow, deep = peaks[f"{kind}/{mode}/reversible/8"], peaks[f"{kind}/{mode}/reversible/64"]
    assert shallow > 0
    assert deep <= 1.15 * shallow, f"64 blocks: {deep / 2**20:.1f} MiB vs 8 blocks: {shallow / 2**20:.1f} MiB"


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_plain_backprop_of_the_same_blocks_grows(peaks, kind, mode):
    shallow, deep = peaks[f"{kind}/{mode}/plain/8"], peaks[f"{kind}/{mode}/plain/64"]
    assert deep >= 4 * shallow
    assert peaks[f"{kind}/{mode}/reversible/64"] * 5 <= deep  # the saving at 64 blocks
