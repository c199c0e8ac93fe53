"""Peak memory of one training step, reversible vs plain, at several depths (a fresh-process probe).

`peaks(kinds, depths)` is called in a fresh process by test_memory.py with oneDNN's CPU allocator (TF_ENABLE_ONEDNN_OPTS=1,
TF_CPU_ALLOCATOR_USE_BFC=false): every
tensor here is at least 1 MiB, which that allocator counts exactly, whereas the BFC
allocator also counts the slack of chunks it hands out unsplit (up to 2x a request).
"""

import json
import sys

import keras
import tensorflow as tf

import memgrad
from memgrad.layers import AdditiveCoupling, AffineCoupling, ReversibleSequence

BATCH, WIDTH = 4096, 128  # a half-activation is [4096, 64] float32 = 1 MiB


def make_stack(kind, depth, invertible_dtype="auto"):
    def dense(activation="tanh"):
        # A residual function with a hidden layer 4x the half width, as in bottleneck and
        # MLP blocks. With a single Dense layer the whole step needs only ~10 half-activations,
        # and which one the executor's schedule holds at the peak (it differs with depth,
        # not with depth's size: 8, 64 and 256 blocks peak at 9, 11, 9 MiB) reads as +-20%.
        return keras.Sequential([keras.layers.Dense(2 * WIDTH, activation="relu"),
                                 keras.layers.Dense(WIDTH // 2, activation=activation)])

    if kind == "additive":
        blocks = [AdditiveCoupling(dense(), dense()) for _ in range(depth)]
    else:
        blocks = [AffineCoupling(dense(), dense(None), scale="sigmoid") for _ in range(depth)]
    stack = ReversibleSequence(blocks, invertible_dtype=invertible_dtype)
    stack.build((None, WIDTH))
    return stack


def training_step(stack, reversible, graph):
    """One SGD step of the stack (or plain backprop of its blocks), in a ``tf.function`` if ``graph``."""
    def plain(x):
        h = x
        for block in stack.blocks:
            h, _ = block.forward(h)
        return h

    forward = stack if reversible else plain
    variables = stack.trainable_variables

    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(forward(x)))
        for variable, grad in zip(variables, tape.gradient(loss, variables)):
            variable.assign_sub(0.01 * grad)
        return loss

    return tf.function(step) if graph else step


def input_gradient_step(stack, graph):
    """The gradient of the stack, frozen, with respect to its input: the peak of the activations
    and their gradients without the weights' gradients (which must grow with depth: a training
    step holds them from their block's backward to the update). Frozen, because a tape that
    watches only the input still has a custom gradient compute the weights' gradients eagerly."""
    stack.trainable = False

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_mean(tf.square(stack(x)))
        return tape.gradient(loss, x)

    return tf.function(step) if graph else step


def _median_peak(step, x, calls):
    """The median peak above baseline of ``calls`` calls of ``step(x)``, the first warmed up."""
    measured = sorted(memgrad.profiler.measure(step, args=(x,), device="CPU:0", warmup=int(call == 0))
                      .peak_above_baseline_bytes for call in range(calls))
    return measured[calls // 2]


def _one_thread_input(policy):
    """One inter-op thread and ``policy`` (a Keras dtype policy, or None for Keras's) for
    this process; returns the probe's input in the policy's compute dtype."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    if policy is not None:
        keras.config.set_dtype_policy(policy)
    return tf.cast(tf.random.stateless_normal([BATCH, WIDTH], seed=[0, 1]),
                   keras.config.dtype_policy().compute_dtype)


def frozen_peaks(kind, depth, graph, calls=5, policy=None):
    """The frozen stack of one depth (`input_gradient_step`), alone in this process: the median
    allocator peak above baseline of ``calls`` calls and the bytes requested at the peak, in
    bytes (scripts/reversible_depth.py runs it in a fresh process per depth). ``policy``: a
    Keras dtype policy for the networks, as in `peaks`."""
    x = _one_thread_input(policy)
    step = input_gradient_step(make_stack(kind, depth), graph)
    return {"peak": _median_peak(step, x, calls),
            "requested": memgrad.profiler.largest_live_tensors(step, args=(x,), k=1, device="CPU:0")
            .requested_peak_bytes}


def peaks(kinds, depths, invertible_dtype="auto", policy=None):
    """Peaks above baseline, keyed ``kind/eager|graph/reversible|plain|reversible-input/depth``
    (``reversible-input``: the reversible stack differentiated with respect to its input only;
    eagerly also ``reversible-input-requested``: the bytes requested at its peak, the
    allocator's fitting left out).

    ``invertible_dtype``: the stacks' (default "auto": float64 around these float32 networks).
    ``policy``: a Keras dtype policy for the networks ("float64", "mixed_float16", ...; the
    input is cast to its compute dtype), or None for Keras's default.

    One inter-op thread: a graph's ready ops then run in one order, so its peak does not move
    with the interleaving two threads happen to pick (8 blocks measured 21-26 MiB across
    processes with two threads, while 64 blocks stayed at 27-31 MiB).
    """
    x = _one_thread_input(policy)
    peaks = {}
    for kind in kinds:
        for graph in (False, True):
            for reversible in (False, True):
                for depth in depths:
                    stack = make_stack(kind, depth, invertible_dtype)
                    step = training_step(stack, reversible, graph)
                    # A graph's peak moves with the executor's schedule (by one hidden
                    # activation, more when other processes compete for the cores): the
                    # median of three. Eager runs ops in program order: one call.
                    calls = 3 if graph else 1
                    key = f"{kind}/{'graph' if graph else 'eager'}/{'reversible' if reversible else 'plain'}/{depth}"
                    peaks[key] = _median_peak(step, x, calls)
                    if reversible:  # the same stack, its inverses checked, without the weights' gradients
                        input_key = key.replace("/reversible/", "/reversible-input/")
                        input_step = input_gradient_step(stack, graph)
                        peaks[input_key] = _median_peak(input_step, x, calls)
                        if not graph:  # program order: the bytes requested are the same in every process
                            peaks[input_key.replace("/reversible-input/", "/reversible-input-requested/")] = (
                                memgrad.profiler.largest_live_tensors(
                                    input_step, args=(x,), k=1, device="CPU:0").requested_peak_bytes)
    return peaks


if __name__ == "__main__":
    # python -m tests.reversible.memory_probe KINDS DEPTHS [INVERTIBLE_DTYPE [POLICY]]
    print("PEAKS " + json.dumps(peaks(sys.argv[1].split(","), [int(d) for d in sys.argv[2].split(",")],
                                      *sys.argv[3:5])))
