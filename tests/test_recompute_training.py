"""Training with recomputation: `memgrad.layers.Recompute` in `model.fit` and
`memgrad.recompute` in a custom step, where the optimizer's update runs in the same
`tf.function` as the recomputed forward. After a few steps of SGD or Adam, XLA on or off,
the weights equal those of the same model trained with plain autodiff."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad

STEPS, BATCH, FEATURES = 3, 16, 8
OPTIMIZERS = {"sgd": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
              "adam": lambda: keras.optimizers.Adam(0.01)}
JIT = [False, pytest.param(True, marks=pytest.mark.slow)]


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * BATCH, FEATURES)).astype("float32")
    return x, np.sin(x).sum(axis=1, keepdims=True).astype("float32")


def _layers(seed):
    keras.utils.set_random_seed(seed)
    inner = keras.Sequential([keras.layers.Dense(32, activation="tanh"),
                              keras.layers.Dense(32, activation="gelu")])
    return inner, keras.layers.Dense(1)


def _relative_difference(a, b):
    scale = max(max(float(np.abs(v).max()) for v in a), 1e-12)
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b)) / scale


def _train(model, weights, initial, optimizer, jit, x, y):
    for variable, value in zip(weights, initial):
        variable.assign(value)
    model.compile(OPTIMIZERS[optimizer](), "mse", jit_compile=jit)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    return [v.numpy() for v in weights]


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_fit_with_a_recompute_layer_trains_like_plain_autodiff(optimizer, jit):
    inner, head = _layers(1)
    recomputed = keras.Sequential([keras.Input((FEATURES,)), memgrad.layers.Recompute(inner), head])
    plain = keras.Sequential([keras.Input((FEATURES,)), inner, head])  # the same layers
    weights = recomputed.trainable_variables
    initial = [v.numpy() for v in weights]
    x, y = _data()
    expected = _train(plain, weights, initial, optimizer, jit, x, y)
    received = _train(recomputed, weights, initial, optimizer, jit, x, y)
    assert _relative_difference(initial, expected) > 1e-3  # it trained
    assert _relative_difference(expected, received) <= 1e-5


@pytest.mark.parametrize("jit", JIT)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_a_custom_step_with_recompute_and_the_update_in_one_function(optimizer, jit):
    inner, head = _layers(2)
    model = keras.Sequential([keras.Input((FEATURES,)), inner, head])
    weights = model.trainable_variables
    initial = [v.numpy() for v in weights]
    recomputed_inner = memgrad.recompute(lambda h: inner(h, training=True))
    x, y = _data()

    def train(forward):
        for variable, value in zip(weights, initial):
            variable.assign(value)
        opt = OPTIMIZERS[optimizer]()
        opt.build(weights)

        @tf.function(jit_compile=jit)
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((head(forward(x)) - y) ** 2)
            opt.apply_gradients(zip(tape.gradient(loss, weights), weights))
            return loss

        for i in range(STEPS):
            step(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH])
        return [v.numpy() for v in weights]

    expected = train(lambda h: inner(h, training=True))
    received = train(recomputed_inner)
    assert _relative_difference(initial, expected) > 1e-3
    assert _relative_difference(expected, received) <= 1e-5
