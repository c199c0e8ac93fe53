"""Peaks of plain backprop and memgrad through long loops (a fresh-process probe).

`lstm_peaks()` measures a 2-layer Keras LSTM (128 units, 512 steps, batch 16) and
`gru_scan_peaks()` a GRU written with `tf.scan` over 1,024 steps: the gradient step under
`tf.gradients`, `memgrad.gradients` (and, for the LSTM, `memgrad.GradientTape`), each the
median of three calls' peaks, in bytes.

Why a fresh process with one inter-op thread: the peak of a loop's backward depends on the
order in which the executor's threads happen to run ready ops (two threads moved the LSTM's
'memory' peak between 21 and 25 MiB from call to call, eight threads between 24 and 28 MiB).
With one inter-op thread the order is fixed, but the peaks still move from process to
process (the intra-op threads' timing): ten fresh processes measured the LSTM's plain peak
at 76.3-86.3 MiB and 'memory' at 20.3-23.8 MiB, and a loop of the memory tests once 27.6 MiB;
test_loops.py asserts bounds over that spread.
"""

import os

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import memgrad  # noqa: E402

ENV = {"TF_CPU_ALLOCATOR_USE_BFC": "true", "TF_NUM_INTEROP_THREADS": "1"}


def _median_peak(step, *args):
    peaks = sorted(memgrad.profiler.measure(step, args, device="CPU:0").peak_bytes
                   for _ in range(3))
    return peaks[1]


def _step_with(gradients, loss_fn, weights):
    @tf.function
    def step(x):
        grads = gradients(loss_fn(x), weights)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return step


def lstm_peaks():
    """{'plain', 'memory', 'tape'}: peaks of the LSTM's gradient step, in bytes."""
    from memgrad.profiler.workloads import lstm_regressor

    model = lstm_regressor(layers=2, units=128, steps=512, features=32, seed=0)
    x = tf.random.stateless_normal([16, 512, 32], [0, 1])
    weights = model.trainable_variables

    def loss_fn(x):
        return tf.reduce_mean(model(x, training=True) ** 2)

    @tf.function
    def tape_step(x):
        with memgrad.GradientTape() as tape:
            loss = loss_fn(x)
        return tf.add_n([tf.reduce_sum(g) for g in tape.gradient(loss, weights)])

    return {"plain": _median_peak(_step_with(tf.gradients, loss_fn, weights), x),
            "memory": _median_peak(_step_with(memgrad.gradients, loss_fn, weights), x),
            "tape": _median_peak(tape_step, x)}


def gru_scan_peaks():
    """{'plain', 'memory'}: peaks of the tf.scan GRU's gradient step, in bytes."""
    from memgrad.profiler.workloads import gru_scan

    weights, loss_fn = gru_scan(steps=1024, units=256, features=64, seed=0)
    x = tf.random.stateless_normal([1024, 32, 64], [2, 3])
    return {"plain": _median_peak(_step_with(tf.gradients, loss_fn, weights), x),
            "memory": _median_peak(_step_with(memgrad.gradients, loss_fn, weights), x)}
