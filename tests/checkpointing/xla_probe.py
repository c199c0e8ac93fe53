"""Peaks of XLA-compiled steps, plain vs checkpointed (a fresh-process probe for test_xla.py).

XLA's CPU backend asks for one temporary buffer per step. A fresh BFC allocator grows by
regions of doubling size and hands a request the whole region when the request is more than
half of it, and counts the whole region as in use: peaks then come in powers of two (a
64-layer chain's plain XLA step read 132.8 MiB in a fresh process and 33-46 MiB in one whose
allocator had grown). The probe first grows the allocator with one 2 GiB tensor, so each
request is split off exactly and a peak is what the step asks for. One inter-op thread, so
the schedule does not move between processes.
"""

import warnings

import keras
import numpy as np
import tensorflow as tf

import memgrad
from memgrad.profiler.workloads import residual_chain, transformer_classifier

DEVICE = "CPU:0"


def _grow_allocator():
    with tf.device(DEVICE):
        big = tf.zeros([2**29], tf.float32)
        big.numpy()
    del big


def _tape_step(loss_of, variables, tape_class, **tape_kwargs):
    @tf.function(jit_compile=True)
    def step(x):
        with tape_class(**tape_kwargs) as tape:
            loss = loss_of(x)
        grads = tape.gradient(loss, variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads])

    return step


def _peak(step, *args):
    return memgrad.profiler.measure(step, args, device=DEVICE).peak_bytes


def _tape_peaks(loss_of, variables, x):
    return {"plain": _peak(_tape_step(loss_of, variables, tf.GradientTape), x),
            "memgrad": _peak(_tape_step(loss_of, variables, memgrad.GradientTape, checkpoints="memory"), x)}


def chain():
    """64 layers h <- h + relu(h W), batch 1024 x 128 (0.5 MiB per activation)."""
    weights, loss_fn = residual_chain(64, 128, seed=1)
    return _tape_peaks(loss_fn, weights, tf.random.stateless_normal([1024, 128], [0, 5]))


def transformer():
    """12 blocks of attention + MLP, 16 x 64 tokens x 64 features."""
    model = transformer_classifier()
    return _tape_peaks(lambda x: tf.reduce_sum(model(x, training=True) ** 2), model.trainable_variables,
                       tf.random.stateless_normal([16, 64, 64], [0, 6]))


def recompute():
    """16 residual blocks of four 128-wide layers, each block through memgrad.recompute."""
    rng = np.random.default_rng(0)
    blocks = [[tf.Variable(rng.standard_normal((128, 128)).astype("float32") * 0.05)
               for _ in range(4)] for _ in range(16)]
    weights = [w for block in blocks for w in block]

    def block(h, ws):
        for w in ws:
            h = tf.nn.relu(h @ w)
        return h

    def loss_of(block_fn):
        def loss(x):
            h = x
            for ws in blocks:
                h = h + block_fn(h, ws)
            return tf.reduce_mean(h * h)
        return loss

    x = tf.random.stateless_normal([1024, 128], [0, 7])
    return {"plain": _peak(_tape_step(loss_of(block), weights, tf.GradientTape), x),
            "memgrad": _peak(_tape_step(loss_of(memgrad.recompute(block)), weights, tf.GradientTape), x)}


def _keras_chain(depth=32, width=128):
    inputs = keras.Input((width,))
    h = inputs
    for _ in range(depth):
        # A small initial branch keeps 32 residual layers (and SGD's steps) finite.
        branch = keras.layers.Dense(width, activation="relu",
                                    kernel_initializer=keras.initializers.RandomNormal(stddev=0.02))
        h = keras.layers.Add()([h, branch(h)])
    return keras.Model(inputs, keras.layers.Dense(1)(h))


def fit(order):
    """`fit` with compile(jit_compile=True) and enable_checkpointing in ``order``; returns the
    peaks, both models' jit_compile, the warnings the hooked model raised and the largest
    relative difference between the two models' steps (two steps: warm-up and measured)."""
    keras.utils.set_random_seed(0)
    plain, hooked = _keras_chain(), _keras_chain()
    hooked.set_weights(plain.get_weights())
    start = plain.get_weights()
    x = np.random.default_rng(0).standard_normal((1024, 128)).astype("float32")
    y = np.random.default_rng(1).standard_normal((1024, 1)).astype("float32")

    def compile_(model):
        model.compile(optimizer=keras.optimizers.SGD(1e-3), loss="mse", jit_compile=True)

    def run(model):
        model.fit(x, y, batch_size=1024, epochs=1, verbose=0, shuffle=False)

    compile_(plain)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if order == "enable then compile":
            memgrad.enable_checkpointing(hooked)
            compile_(hooked)
        else:
            compile_(hooked)
            memgrad.enable_checkpointing(hooked)
        with memgrad.record_rewrites() as log:
            hooked_peak = _peak(run, hooked)
    plain_peak = _peak(run, plain)
    plain_steps = [s - w for s, w in zip(start, plain.get_weights())]
    hooked_steps = [s - w for s, w in zip(start, hooked.get_weights())]
    scale = max(float(np.abs(s).max()) for s in plain_steps)  # NaN if training diverged
    error = max(float(np.abs(a - b).max()) for a, b in zip(plain_steps, hooked_steps)) / scale
    return {"plain": plain_peak, "memgrad": hooked_peak, "jit_compile": [plain.jit_compile, hooked.jit_compile],
            "warnings": [str(w.message) for w in caught if "memgrad" in str(w.message) or "jit_compile" in str(w.message)],
            "rewrites": [entry.segments for entry in log if not entry.fallback],
            "step_scale": scale, "step_error": error}


CASES = {"chain": chain, "transformer": transformer, "recompute": recompute,
         "fit: enable then compile": lambda: fit("enable then compile"),
         "fit: compile then enable": lambda: fit("compile then enable")}


def measure(cases):
    """{case: its peaks (and, for `fit`, the checks)}, measured one after the other in this
    (fresh) process: once grown, the allocator splits every case's requests exactly."""
    tf.config.threading.set_inter_op_parallelism_threads(1)
    _grow_allocator()
    return {case: CASES[case]() for case in cases}
