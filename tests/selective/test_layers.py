"""Selective layers: outputs and gradients identical to the Keras layers they replace."""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad import selective

LAYERS = {
    "dense": (lambda cls, dt: cls(6, activation="relu", dtype=dt), keras.layers.Dense, selective.Dense, (4, 5, 8)),
    "dense_tanh": (lambda cls, dt: cls(6, activation="tanh", use_bias=False, dtype=dt), keras.layers.Dense,
                   selective.Dense, (4, 8)),
    "conv1d": (lambda cls, dt: cls(5, 3, strides=2, padding="same", dtype=dt), keras.layers.Conv1D,
               selective.Conv1D, (2, 9, 3)),
    "conv2d": (lambda cls, dt: cls(5, 3, padding="valid", activation="relu", dtype=dt), keras.layers.Conv2D,
               selective.Conv2D, (2, 7, 7, 3)),
    "conv2d_strided": (lambda cls, dt: cls(4, (3, 2), strides=(2, 1), padding="same", dtype=dt),
                       keras.layers.Conv2D, selective.Conv2D, (2, 8, 7, 3)),
    "conv3d": (lambda cls, dt: cls(3, 2, padding="same", dtype=dt), keras.layers.Conv3D, selective.Conv3D,
               (2, 4, 4, 4, 2)),
    "conv2d_transpose": (lambda cls, dt: cls(4, 3, strides=2, padding="same", activation="relu", dtype=dt),
                         keras.layers.Conv2DTranspose, selective.Conv2DTranspose, (2, 5, 5, 3)),
    "conv2d_transpose_valid": (lambda cls, dt: cls(3, (2, 3), strides=(2, 1), padding="valid", dtype=dt),
                               keras.layers.Conv2DTranspose, selective.Conv2DTranspose, (2, 4, 5, 2)),
    "maxpool": (lambda cls, dt: cls(2, dtype=dt), keras.layers.MaxPooling2D, selective.MaxPooling2D, (2, 6, 6, 3)),
    "maxpool_same_strided": (lambda cls, dt: cls(3, strides=2, padding="same", dtype=dt), keras.layers.MaxPooling2D,
                             selective.MaxPooling2D, (2, 7, 7, 2)),
    "batchnorm": (lambda cls, dt: cls(dtype=dt), keras.layers.BatchNormalization, selective.BatchNormalization,
                  (6, 4, 4, 3)),
    "relu": (lambda cls, dt: cls(dtype=dt), keras.layers.ReLU, selective.ReLU, (4, 10)),
}


def _pair(name, dtype, trainable):
    make, keras_cls, memgrad_cls, shape = LAYERS[name]
    reference, lean = make(keras_cls, dtype), make(memgrad_cls, dtype)
    reference.build((None,) + shape[1:])
    lean.build((None,) + shape[1:])
    rng = np.random.default_rng(0)
    weights = [rng.normal(size=w.shape).astype(dtype) for w in reference.get_weights()]
    if name == "batchnorm":  # positive moving variance
        weights[3] = np.abs(weights[3]) + 0.5
    reference.set_weights(weights)
    lean.set_weights(weights)
    reference.trainable = lean.trainable = trainable
    x = tf.constant(rng.normal(size=shape).astype(dtype))
    return reference, lean, x


def _run(layer, x, watch_input):
    with tf.GradientTape() as tape:
        if watch_input:
            tape.watch(x)
        y = layer(x, training=False)
        weights = tf.reshape(tf.cast(tf.range(tf.size(y[0])) % 5 + 1, y.dtype), y.shape[1:])
        loss = tf.reduce_sum(tf.sin(y) * weights)
    sources = ([x] if watch_input else []) + list(layer.trainable_variables)
    return y, tape.gradient(loss, sources) if sources else []


@pytest.mark.parametrize(
    "name, dtype, trainable, watch_input",
    [(n, d, t, w) for n, d, (t, w) in itertools.product(
        LAYERS, ["float32", "float64"], itertools.product([True, False], [True, False]))],
)
def test_outputs_and_gradients_match_keras(name, dtype, trainable, watch_input):
    reference, lean, x = _pair(name, dtype, trainable)
    y_ref, g_ref = _run(reference, x, watch_input)
    y, g = _run(lean, x, watch_input)
    np.testing.assert_array_equal(y.numpy(), y_ref.numpy())
    assert len(g) == len(g_ref)
    tolerance = 1e-10 if dtype == "float64" else 1e-4
    for got, want in zip(g, g_ref):
        assert got is not None
        np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("name", ["dense", "conv2d", "batchnorm", "relu"])
def test_graph_mode_matches_keras(name):
    reference, lean, x = _pair(name, "float64", True)
    (y_ref, g_ref), (y, g) = tf.function(lambda: _run(reference, x, True))(), tf.function(lambda: _run(lean, x, True))()
    np.testing.assert_allclose(y, y_ref, rtol=1e-12)
    for got, want in zip(g, g_ref):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_batchnorm_training_mode_is_keras():
    reference, lean, x = _pair("batchnorm", "float32", True)
    np.testing.assert_allclose(lean(x, training=True), reference(x, training=True), rtol=1e-6)
    np.testing.assert_allclose(lean.moving_mean.numpy(), reference.moving_mean.numpy(), rtol=1e-6)


def test_unsupported_convolution_settings_are_rejected():
    with pytest.raises(ValueError, match=r"Conv1D supports channels_last.*Received: padding='causal'"):
        selective.Conv1D(4, 3, padding="causal").build((None, 8, 2))
    with pytest.raises(ValueError, match=r"Received: groups=2"):
        selective.Conv2D(4, 3, groups=2).build((None, 8, 8, 4))
    with pytest.raises(ValueError, match=r"Received: dilation_rate=\(2, 2\)"):
        selective.Conv2D(4, 3, dilation_rate=2).build((None, 8, 8, 4))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dropout_same_mask_and_gradient_as_keras(dtype):
    reference, lean = keras.layers.Dropout(0.4, seed=7, dtype=dtype), selective.Dropout(0.4, seed=7, dtype=dtype)
    x = tf.constant(np.random.default_rng(5).normal(size=(6, 20)).astype(dtype))

    def run(layer):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
            loss = tf.reduce_sum(tf.sin(y))
        return y, tape.gradient(loss, x)

    y_ref, g_ref = run(reference)
    y, g = run(lean)
    assert 0 < np.mean(y.numpy() == 0) < 1
    np.testing.assert_array_equal(y, y_ref)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12 if dtype == "float64" else 1e-6)
    np.testing.assert_array_equal(lean(x, training=False), x)
