"""What every suite shares: training steps, timing side by side in interleaved rounds, a step's median peak."""

from __future__ import annotations

import statistics
import time

import keras
import tensorflow as tf

import memgrad


def sgd_step(variables, loss_of, tape=tf.GradientTape, jit_compile=None):
    """A compiled SGD step minimising ``loss_of(x)`` over ``variables`` (gradients from ``tape()``;
    ``jit_compile=True``: compiled with XLA)."""
    @tf.function(jit_compile=jit_compile)
    def step(x):
        with tape() as recorder:
            loss = loss_of(x)
        for variable, grad in zip(variables, recorder.gradient(loss, variables)):
            if isinstance(grad, tf.IndexedSlices):  # an embedding's: applied densely
                grad = tf.convert_to_tensor(grad)
            variable.assign_sub(1e-4 * grad)
        return loss

    return step


def training_step(forward, variables):
    return sgd_step(variables, lambda x: tf.reduce_mean(tf.square(forward(x))))


def time_rounds(steps, x, rounds):
    """Seconds of each call of each step (a list per step), timed in interleaved rounds after
    two warm-up calls each."""
    for step in steps.values():
        for _ in range(2):
            step(x).numpy()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step(x).numpy()
            times[name].append(time.perf_counter() - start)
    return times


def time_side_by_side(steps, x, rounds):
    """Median seconds per call of each step, timed in interleaved rounds."""
    return {name: statistics.median(values) for name, values in time_rounds(steps, x, rounds).items()}


def conv_net(channels, seed):
    init = keras.initializers.HeNormal
    return keras.Sequential([
        keras.layers.Conv2D(channels, 3, padding="same", activation="relu", kernel_initializer=init(seed)),
        keras.layers.Conv2D(channels, 3, padding="same", kernel_initializer=init(seed + 1)),
    ])


def median_peak(step, x):
    """Median of three measured peaks: the executor's schedule moves each by a few MiB."""
    peaks = sorted(memgrad.profiler.measure(step, args=(x,)).peak_above_baseline_bytes for _ in range(3))
    return peaks[1]


def ratio_row(suite, case, target, seconds, peaks):
    """A table row of memgrad's variant against plain backprop: ``seconds`` and ``peaks`` hold a
    ``'memgrad'`` and a ``'plain'`` entry each; ``target`` bounds the time ratio."""
    return {"suite": suite, "case": case, "time_ratio": seconds["memgrad"] / seconds["plain"],
            "target": target, "ms_memgrad": seconds["memgrad"] * 1e3, "ms_plain": seconds["plain"] * 1e3,
            "memory_ratio": peaks["memgrad"] / peaks["plain"]}
