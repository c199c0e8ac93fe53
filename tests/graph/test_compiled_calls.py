"""XLA-compiled calls in a step (Keras's grouped convolutions on CPU): the memory model counts
their gradients' temporary buffers, and the gradients stay exact."""

import keras
import numpy as np
import tensorflow as tf

import memgrad
from memgrad._src.graph import ForwardGraph
from memgrad._src.graph.kernels import is_compiled_call
from memgrad._src.graph.memory_model import MemoryModel


def _grouped_net():
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((8, 8, 64)),
        keras.layers.Conv2D(64, 7, padding="same", groups=64),  # a compiled call on CPU
        keras.layers.Activation("relu"),
        keras.layers.Conv2D(64, 1),
        keras.layers.Activation("tanh"),
        keras.layers.Conv2D(64, 7, padding="same", groups=64),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(1),
    ])


def test_the_model_counts_a_compiled_grouped_convolutions_gradient_buffer():
    model = _grouped_net()
    x = tf.random.stateless_normal([4, 8, 8, 64], seed=[0, 1])
    found = {}

    @tf.function
    def trace(x):
        loss = tf.reduce_mean(tf.square(model(x, training=True)))
        view = ForwardGraph([loss], model.trainable_variables)
        found["calls"] = sum(is_compiled_call(op) for op in view.ops)
        found["without"] = MemoryModel(view).work.max()
        found["with"] = MemoryModel(view, kernels="CPU:0").work.max()
        return loss

    trace.get_concrete_function(x)
    assert found["calls"] == 2
    # XLA's backward of a 7x7 grouped convolution over 64 channels makes a dense filter of
    # 7x7x64x64 floats (784 KiB) at least; the gradient steps without it hold far less.
    assert found["with"] >= found["without"] + 7 * 7 * 64 * 64 * 4


def test_gradients_through_compiled_calls_are_exact_under_a_budget():
    keras.utils.set_random_seed(0)
    # Six convolutions' activations outweigh the compiled gradient's buffer, so plans differ.
    model = keras.Sequential(
        [keras.Input((16, 16, 64))]
        + [keras.layers.Conv2D(64, 3, padding="same", activation="tanh") for _ in range(6)]
        + [keras.layers.MaxPooling2D(4), keras.layers.Conv2D(64, 3, padding="same", groups=64),
           keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)])
    x = tf.random.stateless_normal([32, 16, 16, 64], seed=[0, 2])

    def step(checkpoints):
        @tf.function
        def run(x):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x, training=True)))
            if checkpoints is None:
                return tape.gradient(loss, model.trainable_variables)
            return memgrad.gradients(loss, model.trainable_variables, checkpoints=checkpoints)
        return [g.numpy() for g in run(x)]

    expected = step(None)
    budget = memgrad.strategies.Budget(0.8, margin=0.0)  # plans on the model: a side gradient
    for checkpoints in ("memory", budget):
        with memgrad.record_rewrites() as log:
            got_all = step(checkpoints)
        assert log and log[-1].plan is not None and log[-1].plan.tensors  # a real rewrite
        for got, want in zip(got_all, expected):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
