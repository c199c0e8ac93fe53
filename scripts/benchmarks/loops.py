"""Memory through time: Keras LSTMs and a tf.scan GRU, segmented, against plain backprop."""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import gru_scan, lstm_regressor

from benchmarks.common import sgd_step, time_rounds
from benchmarks.peers import add_step, peer_row


class _RecomputedLSTMCell(keras.layers.LSTMCell):
    """A Keras LSTM cell whose step runs under tf.recompute_grad (the peer of memgrad's
    segments: the cell's gates are recomputed in the backward, the step's inputs kept)."""

    def call(self, inputs, states, training=False):
        def step(x, h, c):
            output, (h, c) = super(_RecomputedLSTMCell, self).call(x, [h, c], training=training)
            return output, h, c

        output, h, c = tf.recompute_grad(step)(inputs, *states)
        return output, [h, c]


def _recomputed_lstm(layers, units, steps, features, seed):
    keras.utils.set_random_seed(seed)
    stack = [keras.Input((steps, features))]
    stack += [keras.layers.RNN(_RecomputedLSTMCell(units), return_sequences=True)
              for _ in range(layers)]
    return keras.Sequential(stack + [keras.layers.Dense(1)])


def _loop_rows(case, steps, x, rounds, device, peer=None):
    """Rows of the loops suite: each step in ``steps`` timed side by side and measured; ``peer``
    is ``(name, make)`` of a variant that may fail (reported as such)."""
    steps, failures = dict(steps), []
    if peer is not None:
        name, make = peer
        add_step(steps, failures, name, make, x, tail=True)
    with tf.device(device):
        times = time_rounds(steps, x, rounds)
    peaks = {key: memgrad.profiler.measure(step, args=(x,), device=device).peak_bytes
             for key, step in steps.items()}
    rows = [peer_row(case, key, times, peaks, key) for key in steps]
    rows += [peer_row(case, key, None, None, key, failure) for key, failure in failures]
    return [dict(row, suite="loops") for row in rows]


def loops_suite(rounds, batch=16, units=128, steps=512, scan_steps=1024, xla=True, peers=True):
    """Memory through time: a 2-layer Keras LSTM and a GRU written with tf.scan, plain backprop
    vs memgrad (the loops' gradients in segments of steps) vs tf.recompute_grad around the
    cell (``peers``), one SGD step each, side by side, the LSTM also under XLA (``xla``)
    (target: <= 0.35x of plain's peak at <= 1.4x time)."""
    device = memgrad.profiler.default_device()
    memory = "memgrad.GradientTape('memory')"
    memory_tape = functools.partial(memgrad.GradientTape, checkpoints="memory")

    def squares_of(model):
        return lambda x: tf.reduce_mean(tf.square(model(x, training=True)))

    model = lstm_regressor(layers=2, units=units, steps=steps, features=32, seed=0)
    variables, loss_of = model.trainable_variables, squares_of(model)
    x = tf.random.stateless_normal([batch, steps, 32], seed=[0, 3])

    def recomputed_lstm():
        twin = _recomputed_lstm(2, units, steps, 32, seed=0)
        return sgd_step(twin.trainable_variables, squares_of(twin))

    case = f"2-layer Keras LSTM ({units} units), {steps} steps, batch {batch}x{steps}x32"
    rows = _loop_rows(case, {"plain": sgd_step(variables, loss_of),
                             memory: sgd_step(variables, loss_of, memory_tape)},
                      x, rounds, device, ("tf.recompute_grad around the LSTM cell", recomputed_lstm) if peers else None)
    if xla:
        rows += _loop_rows(case + ", XLA (jit_compile=True)",
                           {"plain": sgd_step(variables, loss_of, jit_compile=True),
                            memory: sgd_step(variables, loss_of, memory_tape, jit_compile=True)},
                           x, rounds, device)

    weights, loss_fn = gru_scan(steps=scan_steps, units=256, features=64, seed=0)
    x = tf.random.stateless_normal([scan_steps, 32, 64], seed=[0, 4])

    def recomputed_gru():
        return sgd_step(*gru_scan(steps=scan_steps, units=256, features=64, seed=0,
                                   recompute_cell=True))

    case = f"GRU as tf.scan over {scan_steps} steps (256 units), batch 32x64"
    rows += _loop_rows(case, {"plain": sgd_step(weights, loss_fn),
                              memory: sgd_step(weights, loss_fn, memory_tape)},
                       x, rounds, device, ("tf.recompute_grad around the cell", recomputed_gru) if peers else None)
    return rows


def long_suite(rounds, steps=4096):
    """Long sequences: the loops suite's 2-layer LSTM and tf.scan GRU over ``steps`` steps,
    plain backprop vs memgrad (target: <= 0.10x of plain's peak at <= 1.4x time)."""
    return [dict(row, suite="long") for row in loops_suite(
        rounds, steps=steps, scan_steps=steps, xla=False, peers=False)]
