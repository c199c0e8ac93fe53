"""Checkpointing under XLA (jit_compile=True) against plain XLA."""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import residual_chain, transformer_classifier

from benchmarks.common import sgd_step, time_side_by_side


def _xla_workloads():
    weights, loss_fn = residual_chain(64, 128)
    yield "residual chain of 64 layers, batch 1024x128", weights, loss_fn, tf.random.stateless_normal(
        [1024, 128], seed=[0, 1])
    for case, model, shape in (
            ("12-layer transformer, 16 x 64 tokens x 64 features", transformer_classifier(), [16, 64, 64]),
            ("MobileNetV2 (keras.applications, weights=None), 16 x 64x64x3",
             keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), classes=10),
             [16, 64, 64, 3])):
        def loss_of(x, model=model):
            return tf.reduce_mean(tf.square(model(x, training=True)))

        yield case, model.trainable_variables, loss_of, tf.random.stateless_normal(shape, seed=[0, 2])


def xla_suite(rounds):
    """checkpoints='memory' under XLA (jit_compile=True, Keras's default for fit on a GPU) vs
    plain XLA, and vs the same checkpointing with XLA off, side by side; on the first GPU if
    there is one, else on the CPU."""
    device = memgrad.profiler.default_device()
    # XLA asks for one large buffer per step, which a fresh BFC allocator rounds up to a whole
    # power-of-two region: grow the allocator first so each peak is what the step asks for.
    with tf.device(device):
        tf.reduce_sum(tf.zeros([2**28], tf.float32)).numpy()  # 1 GiB, freed at once
    variants = (("plain XLA", tf.GradientTape, True),
                ("memgrad XLA", functools.partial(memgrad.GradientTape, checkpoints="memory"), True),
                ("memgrad, XLA off", functools.partial(memgrad.GradientTape, checkpoints="memory"), False),
                ("plain, XLA off", tf.GradientTape, False))
    rows = []
    for case, variables, loss_of, x in _xla_workloads():
        steps = {name: sgd_step(variables, loss_of, tape, jit) for name, tape, jit in variants}
        with tf.device(device):
            seconds = time_side_by_side(steps, x, rounds)
        peaks = {name: memgrad.profiler.measure(step, args=(x,), device=device).peak_bytes
                 for name, step in steps.items()}
        for name in steps:
            rows.append({"suite": "xla", "case": case, "variant": name, "device": device,
                         "time_ratio": seconds[name] / seconds["plain XLA"], "ms": seconds[name] * 1e3,
                         "vs_memgrad_no_xla": seconds[name] / seconds["memgrad, XLA off"],
                         "memory_ratio": peaks[name] / peaks["plain XLA"], "peak_mib": peaks[name] / 2**20})
    return rows
