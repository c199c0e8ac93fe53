"""Activation memory of a reversible stack does not grow with depth; plain backprop's does.

The stacks carry their activations in float64 around their float32 networks (the default
``invertible_dtype="auto"``), their gradients in float32, consecutive couplings' halves
unjoined, and their output as float32 plus a float32 residual. Measured from 8 to 64
additive blocks (oneDNN's allocator, one inter-op thread): 30 -> 31 MiB eager (27 MiB
requested at both depths) and 25 -> 24 MiB in a graph, against 26 -> 26 and 22 -> 17 MiB
with a float32 carry (50 -> 50 and 30 -> 34 MiB when every block boundary joined and split
the halves in float64); affine 37 -> 37 and 35 -> 33 MiB. The suite compares 8 with 32
blocks (the probes take half the time of 64's), while plain backprop grows 3.7-3.9x.
Without the weights' gradients (the stack frozen, differentiated with respect to its
input), additive 30-31 MiB eager and 15-17 MiB in a graph at 8 and 64 blocks, affine 37 and
29-32 MiB; a training step's graph peak adds the weights' gradients alive at that moment.
"""

import pytest

from tests.reversible.memory_probe import BATCH, WIDTH

pytestmark = pytest.mark.memory

DEEP = 32  # blocks, against 8
HIDDEN_ACTIVATION_BYTES = BATCH * 2 * WIDTH * 4  # one hidden layer output of f or g: 4 MiB
HALF_ACTIVATION_FLOAT64_BYTES = BATCH * WIDTH // 2 * 8  # one half of a block's input, carried: 2 MiB
# Two networks per block, Dense(WIDTH/2 -> 2 WIDTH) -> Dense(2 WIDTH -> WIDTH/2), float32: 258.5 KiB.
WEIGHT_GRADIENT_BYTES_PER_BLOCK = 2 * 4 * ((WIDTH // 2 + 1) * 2 * WIDTH + (2 * WIDTH + 1) * WIDTH // 2)
# oneDNN's allocator keeps the statistics (TensorFlow enables it by default only on CPUs with
# AVX-512); BFC is turned off explicitly, since importing memgrad asks for it when the variable
# is unset (the probe then read BFC's slack: 58-66 vs 70-84 MiB at 8 vs 64 blocks).
# One process per kind.
# expected_s: wall time in CI's memory pass (conftest.py starts the longest probes first).
FRESH_PROCESSES = {
    kind: dict(target="tests.reversible.memory_probe:peaks", args=[[kind], [8, DEEP]],
               env={"TF_CPU_ALLOCATOR_USE_BFC": "false", "TF_ENABLE_ONEDNN_OPTS": "1"}, expected_s=140)
    for kind in ("additive", "affine")
}
# The same additive stack carried in float32, to price the default float64 carry.
FRESH_PROCESSES["additive-float32"] = dict(
    target="tests.reversible.memory_probe:peaks", args=[["additive"], [8], "float32"],
    env=FRESH_PROCESSES["additive"]["env"], expected_s=40)
STACK_ACTIVATION_FLOAT64_BYTES = BATCH * WIDTH * 8  # the stack's input or output, carried: 4 MiB


@pytest.fixture(scope="module")
def peaks(fresh_results):
    results = {}
    for key, measured in fresh_results.items():
        if key != "additive-float32":
            results.update(measured)
    return results


@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_eager_reversible_peak_at_32_blocks_is_within_115_percent_of_8(peaks, kind):
    shallow, deep = peaks[f"{kind}/eager/reversible/8"], peaks[f"{kind}/eager/reversible/{DEEP}"]
    assert shallow > 0
    assert deep <= 1.15 * shallow, f"{DEEP} blocks: {deep / 2**20:.1f} MiB vs 8 blocks: {shallow / 2**20:.1f} MiB"


@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_graph_reversible_peak_does_not_grow_with_depth(peaks, kind):
    """A training step in a graph: its weights' gradients wait for the update, and how many of
    them are alive at the peak depends on the schedule the executor picks (up to 6.1 MiB more
    at 32 blocks than at 8); the activations' part must not grow. Additive, from 8 to 32
    blocks: 22.0 -> 24.0 MiB in five of six fresh processes (one inter-op thread, two
    processes at a time), 22.0 -> 28.0 in the sixth, where the bound of 1.15x this test had
    failed: a ratio of the shallow peak is no bound when a fixed 6.1 MiB may be added to a
    base of 22-25 MiB. Asserted: the growth stays within the weights' gradients plus one
    hidden activation, where plain backprop grows by at least 21 hidden activations
    (measured 72; the rate of 50 per 56 blocks asserted at 64 blocks).
    """
    shallow, deep = peaks[f"{kind}/graph/reversible/8"], peaks[f"{kind}/graph/reversible/{DEEP}"]
    plain_growth = peaks[f"{kind}/graph/plain/{DEEP}"] - peaks[f"{kind}/graph/plain/8"]
    weights_growth = (DEEP - 8) * WEIGHT_GRADIENT_BYTES_PER_BLOCK
    assert shallow > 0
    assert deep - shallow <= weights_growth + HIDDEN_ACTIVATION_BYTES, (
        f"{shallow / 2**20:.1f} -> {deep / 2**20:.1f} MiB; the weights' gradients add {weights_growth / 2**20:.1f}")
    assert plain_growth >= 21 * HIDDEN_ACTIVATION_BYTES


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_peak_without_the_weights_gradients_is_flat_in_depth(peaks, kind, mode):
    """The stack, frozen, differentiated with respect to its input: what a training step holds
    besides the weights' gradients.

    Eager, program order: the bytes requested at the peak are the same at every depth
    (additive 27 MiB, affine 35 MiB at 8 and 64 blocks); asserted: the goal, 1.05x. The
    allocator's reading adds its fitting, which depends on what the forward pass left free:
    additive 30 -> 31 MiB, affine 37 -> 37 (39 -> 41 in an earlier version, one float64
    half-activation apart); asserted within two of the shallow stack's.

    In a graph the peak moves with the schedule, by which float64 half-activations (2 MiB
    each) are in flight: additive 15 -> 15 MiB from 8 to 64 blocks in one process, 15 -> 17
    in another, affine 29 -> 32 in one process and 25 -> 24 (requested) in another. Earlier, with the halves joined at every
    block boundary, additive 24 MiB at 8 blocks and 29 at 32 in two processes. Asserted:
    1.05x or three half-activations, against plain backprop's growth of at least 84 MiB
    over these depths."""
    shallow, deep = peaks[f"{kind}/{mode}/reversible-input/8"], peaks[f"{kind}/{mode}/reversible-input/{DEEP}"]
    assert shallow > 0
    if mode == "eager":
        requested = [peaks[f"{kind}/eager/reversible-input-requested/{depth}"] for depth in (8, DEEP)]
        assert 0 < requested[1] <= 1.05 * requested[0], f"requested {requested[0] / 2**20:.2f} -> {requested[1] / 2**20:.2f} MiB"
        allowed = max(1.05 * shallow, shallow + 2 * HALF_ACTIVATION_FLOAT64_BYTES)
    else:
        allowed = max(1.05 * shallow, shallow + 3 * HALF_ACTIVATION_FLOAT64_BYTES)
    assert deep <= allowed, f"{shallow / 2**20:.1f} -> {deep / 2**20:.1f} MiB"


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("kind", ["additive", "affine"])
def test_plain_backprop_of_the_same_blocks_grows(peaks, kind, mode):
    # 8 -> 32 blocks: measured 3.66-3.87x (4x at most, what the blocks add to a fixed base).
    shallow, deep = peaks[f"{kind}/{mode}/plain/8"], peaks[f"{kind}/{mode}/plain/{DEEP}"]
    assert deep >= 3 * shallow
    assert peaks[f"{kind}/{mode}/reversible/{DEEP}"] * 5 <= deep  # the saving at 32 blocks: 9.3-12.8x


def test_the_float64_carry_costs_at_most_one_stack_sized_buffer(peaks, fresh_results):
    """Eagerly (program order: the same bytes requested in every process), the default float64
    carry against a float32 carry of the same stack, differentiated with respect to its input.
    The stack keeps its output as the float32 output it returned and a float32 residual (2 MiB
    more than a float32 carry keeps), and the block being rebuilt holds two float64 halves and
    a float32 copy of one for its network. Measured by requested bytes: 27.1 vs 24.0 MiB, 3.1
    MiB for a 4 MiB float64 stack activation (before the stack carried halves and float32
    gradients between blocks, and kept a float64 output: 47.1 vs 29.0 MiB). The allocator's
    readings depend on what earlier steps left free: 31-33 vs 27-29 MiB."""
    wide = peaks["additive/eager/reversible-input-requested/8"]
    narrow = fresh_results["additive-float32"]["additive/eager/reversible-input-requested/8"]
    assert narrow > 0
    assert wide - narrow <= STACK_ACTIVATION_FLOAT64_BYTES, (
        f"float64 carry {wide / 2**20:.2f} MiB, float32 carry {narrow / 2**20:.2f} MiB requested")
