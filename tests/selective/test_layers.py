"""Selective layers: outputs and gradients identical to the Keras layers they replace."""

import itertools
import math

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
    # The layers fine-tuned models are made of.
    "relu_max_value": (lambda cls, dt: cls(max_value=0.5, dtype=dt), keras.layers.ReLU, selective.ReLU, (4, 10)),
    "activation_relu": (lambda cls, dt: cls("relu", dtype=dt), keras.layers.Activation, selective.Activation,
                        (4, 10)),
    "activation_gelu": (lambda cls, dt: cls("gelu", dtype=dt), keras.layers.Activation, selective.Activation,
                        (4, 3, 10)),
    "dense_gelu": (lambda cls, dt: cls(6, activation="gelu", dtype=dt), keras.layers.Dense, selective.Dense,
                   (4, 5, 8)),
    "depthwise": (lambda cls, dt: cls(3, depth_multiplier=2, padding="same", activation="relu", dtype=dt),
                  keras.layers.DepthwiseConv2D, selective.DepthwiseConv2D, (2, 7, 7, 3)),
    "depthwise_strided": (lambda cls, dt: cls((3, 2), strides=2, padding="valid", use_bias=False, dtype=dt),
                          keras.layers.DepthwiseConv2D, selective.DepthwiseConv2D, (2, 8, 7, 3)),
    "separable": (lambda cls, dt: cls(4, 3, padding="same", depth_multiplier=2, activation="relu", dtype=dt),
                  keras.layers.SeparableConv2D, selective.SeparableConv2D, (2, 7, 7, 3)),
    "separable_strided": (lambda cls, dt: cls(5, 3, strides=2, padding="valid", use_bias=False, dtype=dt),
                          keras.layers.SeparableConv2D, selective.SeparableConv2D, (2, 8, 8, 2)),
    "einsum_heads": (lambda cls, dt: cls("abc,cde->abde", output_shape=(None, 2, 3), bias_axes="de", dtype=dt),
                     keras.layers.EinsumDense, selective.EinsumDense, (2, 5, 4)),
    "einsum_merge_heads": (lambda cls, dt: cls("abcd,cde->abe", output_shape=(None, 6), bias_axes="e", dtype=dt),
                           keras.layers.EinsumDense, selective.EinsumDense, (2, 5, 2, 3)),
    "einsum_ellipsis_relu": (lambda cls, dt: cls("...b,bc->...c", output_shape=4, bias_axes="c", activation="relu",
                                                 dtype=dt), keras.layers.EinsumDense, selective.EinsumDense, (2, 3, 5)),
    "layernorm": (lambda cls, dt: cls(dtype=dt), keras.layers.LayerNormalization, selective.LayerNormalization,
                  (4, 5, 6)),
    "layernorm_two_axes": (lambda cls, dt: cls(axis=[1, 2], center=False, dtype=dt), keras.layers.LayerNormalization,
                           selective.LayerNormalization, (3, 4, 5)),
    "global_avgpool": (lambda cls, dt: cls(dtype=dt), keras.layers.GlobalAveragePooling2D,
                       selective.GlobalAveragePooling2D, (2, 5, 5, 3)),
    "global_avgpool_keepdims": (lambda cls, dt: cls(keepdims=True, dtype=dt), keras.layers.GlobalAveragePooling2D,
                                selective.GlobalAveragePooling2D, (2, 4, 6, 3)),
    "avgpool": (lambda cls, dt: cls(2, dtype=dt), keras.layers.AveragePooling2D, selective.AveragePooling2D,
                (2, 6, 6, 3)),
    "avgpool_same_strided": (lambda cls, dt: cls(3, strides=2, padding="same", dtype=dt), keras.layers.AveragePooling2D,
                             selective.AveragePooling2D, (2, 7, 7, 2)),
    "zero_padding": (lambda cls, dt: cls(((1, 2), (0, 3)), dtype=dt), keras.layers.ZeroPadding2D,
                     selective.ZeroPadding2D, (2, 4, 4, 3)),
}

# Registered layers whose inputs or settings need tests of their own (below), and those tests.
OWN_TESTS = {selective.Add: "test_merges_match_keras", selective.Concatenate: "test_merges_match_keras",
             selective.Dropout: "test_dropout_same_mask_and_gradient_as_keras",
             selective.Embedding: "test_embedding_matches_keras_and_frozen_records_nothing"}


def test_every_registered_layer_is_compared_with_its_keras_layer():
    from memgrad._src.selective import registry

    covered = {memgrad_cls for _, keras_cls, memgrad_cls, _ in LAYERS.values()} | set(OWN_TESTS)
    assert [layer.__name__ for layer in registry.LAYERS if layer not in covered] == []
    assert all(name in globals() for name in OWN_TESTS.values())
    assert all(registry.keras_counterpart(m) is k for _, k, m, _ in LAYERS.values())


# TensorFlow's float64 GELU gradient (through erfc) is off by up to ~5e-6 relative; memgrad's
# matches the analytic derivative to 1e-15 (test_gelu_gradient_is_the_analytic_derivative).
FLOAT64_TOLERANCE = {"activation_gelu": 1e-5, "dense_gelu": 1e-5}


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
    tolerance = FLOAT64_TOLERANCE.get(name, 1e-10) if dtype == "float64" else 1e-4
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


@pytest.mark.parametrize("name", ["add", "concatenate"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("watched", ["first", "both"])
def test_merges_match_keras(name, dtype, watched):
    make = {"add": lambda m: m.Add(dtype=dtype), "concatenate": lambda m: m.Concatenate(axis=1, dtype=dtype)}[name]
    rng = np.random.default_rng(9)
    a = tf.constant(rng.normal(size=(3, 4, 2)).astype(dtype))
    b = tf.constant(rng.normal(size=(3, 4 if name == "add" else 5, 2)).astype(dtype))
    sources = [a] if watched == "first" else [a, b]

    def run(layer):
        with tf.GradientTape() as tape:
            tape.watch(sources)
            y = layer([a * 1.0, b * 1.0])
            weights = tf.reshape(tf.cast(tf.range(tf.size(y[0])) % 3 + 1, y.dtype), y.shape[1:])
            loss = tf.reduce_sum(tf.sin(y) * weights)
        return y, tape.gradient(loss, sources)

    (y_ref, g_ref), (y, g) = run(make(keras.layers)), run(make(selective))
    np.testing.assert_array_equal(y, y_ref)
    for got, want in zip(g, g_ref, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12 if dtype == "float64" else 1e-6)


@pytest.mark.parametrize("trainable, watch_table", [(True, False), (False, True), (False, False)])
def test_embedding_matches_keras_and_frozen_records_nothing(trainable, watch_table):
    ids = tf.constant(np.random.default_rng(10).integers(0, 12, size=(4, 7)))
    layers = []
    for cls in (keras.layers.Embedding, selective.Embedding):
        layer = cls(12, 5)
        layer.build((None, 7))
        layer.set_weights([np.random.default_rng(11).normal(size=(12, 5)).astype("float32")])
        layer.trainable = trainable
        layers.append(layer)

    def run(layer):
        with tf.GradientTape() as tape:
            if watch_table:
                tape.watch(layer.embeddings.value)
            y = layer(ids)
            loss = tf.reduce_sum(tf.sin(y))
        return y, tape.gradient(loss, layer.embeddings)

    (y_ref, g_ref), (y, g) = run(layers[0]), run(layers[1])
    np.testing.assert_array_equal(y, y_ref)
    if trainable or watch_table:
        np.testing.assert_allclose(tf.convert_to_tensor(g), tf.convert_to_tensor(g_ref), rtol=1e-6)
        assert isinstance(g, tf.IndexedSlices) and isinstance(g_ref, tf.IndexedSlices)  # as sparse as Keras's
    else:  # Keras's tape records the lookup of a frozen table; memgrad's does not
        assert g is None and g_ref is not None


def test_unsupported_new_layer_settings_are_rejected():
    with pytest.raises(ValueError, match=r"Activation keeps less.*Received: activation='tanh'"):
        selective.Activation("tanh")
    with pytest.raises(ValueError, match=r"Received: negative_slope=0.1"):
        selective.ReLU(negative_slope=0.1)._check_supported()
    with pytest.raises(ValueError, match=r"DepthwiseConv2D supports.*Received: dilation_rate=\(2, 2\)"):
        selective.DepthwiseConv2D(3, dilation_rate=2).build((None, 8, 8, 4))
    with pytest.raises(ValueError, match=r"SeparableConv2D supports.*Received: data_format='channels_first'"):
        selective.SeparableConv2D(4, 3, data_format="channels_first").build((None, 4, 8, 8))
    with pytest.raises(ValueError, match=r"EinsumDense needs every input.*Received: equation='abc,cd->ad'"):
        selective.EinsumDense("abc,cd->ad", output_shape=4).build((None, 3, 5))


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_gradient_is_the_analytic_derivative(approximate):
    x = np.linspace(-4.0, 4.0, 41)
    with tf.GradientTape() as tape:
        t = tf.constant(x)
        tape.watch(t)
        y = selective.lean_gelu(t, approximate=approximate)
    got = tape.gradient(y, t).numpy()
    np.testing.assert_array_equal(y, keras.activations.gelu(tf.constant(x), approximate=approximate))
    if approximate:
        c = math.sqrt(2 / math.pi)
        th = np.tanh(c * (x + 0.044715 * x**3))
        want = 0.5 * (1 + th) + 0.5 * x * (1 - th**2) * c * (1 + 3 * 0.044715 * x**2)
    else:
        want = [0.5 * (1 + math.erf(v / math.sqrt(2))) + v * math.exp(-v * v / 2) / math.sqrt(2 * math.pi) for v in x]
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
