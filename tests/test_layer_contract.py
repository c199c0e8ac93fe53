"""One contract for every public Keras layer memgrad ships (reversible, selective, Recompute,
Checkpoint), in the spirit of Keras's own layer tests: it builds and calls, its config makes
an equal layer (same outputs with the same weights), a `.keras` file round-trips it inside a
model, its dtype policy survives both, and it masks as the Keras layer it stands for does."""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

import memgrad
from memgrad import layers as M
from memgrad import selective as S


def _dense(units, seed):
    return keras.layers.Dense(units, activation="tanh",
                              kernel_initializer=keras.initializers.RandomNormal(0.0, 0.3, seed=seed))


def _bijector():
    import tensorflow_probability as tfp

    return M.BijectorBlock(tfp.bijectors.Shift(0.5))


# name -> (a factory of the layer, the input shape(s) without the batch).
CASES = {
    "ActNorm": (lambda: M.ActNorm(), (6,)),
    "AdditiveCoupling": (lambda: M.AdditiveCoupling(_dense(3, 1), _dense(3, 2)), (6,)),
    "AffineCoupling": (lambda: M.AffineCoupling(_dense(3, 3), _dense(3, 4)), (6,)),
    "BijectorBlock": (_bijector, (6,)),
    "ChannelPermutation": (lambda: M.ChannelPermutation(), (6,)),
    "Checkpoint": (lambda: M.Checkpoint(), (6,)),
    "Invertible1x1Conv": (lambda: M.Invertible1x1Conv(seed=0), (4, 4, 6)),
    "Recompute": (lambda: M.Recompute(keras.Sequential([_dense(6, 5), _dense(6, 6)])), (6,)),
    "ReversibleSequence": (lambda: M.ReversibleSequence([M.AdditiveCoupling(_dense(3, 7), _dense(3, 8)),
                                                        M.AffineCoupling(_dense(3, 9), _dense(3, 10))]), (6,)),
    "Squeeze": (lambda: M.Squeeze(), (4, 4, 3)),
    "Activation": (lambda: S.Activation("gelu"), (6,)),
    "Add": (lambda: S.Add(), [(6,), (6,)]),
    "AveragePooling2D": (lambda: S.AveragePooling2D(2), (4, 4, 3)),
    "BatchNormalization": (lambda: S.BatchNormalization(), (6,)),
    "Concatenate": (lambda: S.Concatenate(), [(6,), (4,)]),
    "Conv1D": (lambda: S.Conv1D(4, 3, padding="same"), (8, 3)),
    "Conv2D": (lambda: S.Conv2D(4, 3, padding="same"), (5, 5, 3)),
    "Conv2DTranspose": (lambda: S.Conv2DTranspose(4, 3, strides=2, padding="same"), (4, 4, 3)),
    "Conv3D": (lambda: S.Conv3D(2, 3, padding="same"), (4, 4, 4, 2)),
    "Dense": (lambda: S.Dense(5, activation="relu"), (6,)),
    "DepthwiseConv2D": (lambda: S.DepthwiseConv2D(3, padding="same"), (5, 5, 3)),
    "Dropout": (lambda: S.Dropout(0.5, seed=1), (6,)),
    "EinsumDense": (lambda: S.EinsumDense("ab,bc->ac", output_shape=5, bias_axes="c"), (6,)),
    "Embedding": (lambda: S.Embedding(10, 4), (5,)),
    "GlobalAveragePooling2D": (lambda: S.GlobalAveragePooling2D(), (4, 4, 3)),
    "LayerNormalization": (lambda: S.LayerNormalization(), (6,)),
    "MaxPooling2D": (lambda: S.MaxPooling2D(2), (4, 4, 3)),
    "ReLU": (lambda: S.ReLU(), (6,)),
    "SeparableConv2D": (lambda: S.SeparableConv2D(4, 3, padding="same"), (5, 5, 3)),
    "ZeroPadding2D": (lambda: S.ZeroPadding2D(1), (4, 4, 3)),
}
# Layers without a config (so no .keras file), and the error that says why.
UNSAVABLE = {"BijectorBlock": "tensorflow-probability bijector, which Keras cannot serialise"}
# Keras models rather than layers: their own tests round-trip them (tests/selective).
MODELS = {"LeanFunctional", "LeanSequential"}
ABSTRACT = {"ReversibleBlock"}  # a base class to subclass, not a layer to use


def _public_layers():
    found = {}
    for namespace in (memgrad.layers, memgrad.selective):
        for name in namespace.__all__:
            value = getattr(namespace, name)
            if inspect.isclass(value) and issubclass(value, keras.layers.Layer):
                found[name] = value
    return found


def test_every_public_layer_is_under_the_contract():
    assert set(_public_layers()) - MODELS - ABSTRACT == set(CASES)


def _inputs(name, shapes):
    rng = np.random.default_rng(0)
    if name == "Embedding":
        return tf.constant(rng.integers(0, 10, size=(2,) + shapes)), keras.Input(shapes, dtype="int32")
    if isinstance(shapes, list):
        return ([tf.constant(rng.standard_normal((2,) + s), tf.float32) for s in shapes],
                [keras.Input(s) for s in shapes])
    return tf.constant(rng.standard_normal((2,) + shapes), tf.float32), keras.Input(shapes)


def _first(outputs):
    return outputs[0] if isinstance(outputs, (list, tuple)) else outputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_layer_contract(name, tmp_path):
    keras.utils.set_random_seed(0)
    make, shapes = CASES[name]
    x, symbolic = _inputs(name, shapes)
    model = keras.Model(symbolic, make()(symbolic))
    layer = model.layers[-1]
    expected = _first(model(x, training=False))
    assert np.all(np.isfinite(expected.numpy()))

    if name in UNSAVABLE:  # no config, so no file: said in one line
        with pytest.raises(NotImplementedError, match=UNSAVABLE[name]):
            layer.get_config()
        with pytest.raises(NotImplementedError, match=UNSAVABLE[name]):
            model.save(str(tmp_path / f"{name}.keras"))
        return

    # Its config makes an equal layer: the same outputs with the same weights.
    clone = keras.Model(symbolic, type(layer).from_config(layer.get_config())(symbolic))
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(_first(clone(x, training=False)), expected, rtol=1e-5, atol=1e-6)
    assert clone.layers[-1].dtype_policy.name == layer.dtype_policy.name

    # A .keras file round-trips it inside a model.
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert type(loaded.layers[-1]) is type(layer)
    np.testing.assert_allclose(_first(loaded(x, training=False)), expected, rtol=1e-5, atol=1e-6)

    # A dtype policy given to it is the one it computes in. A wrapper computes in its
    # layer's (as keras.layers.Wrapper does); an embedding's input is integers.
    policy_layer = type(layer).from_config({**layer.get_config(), "dtype": "float64"})
    assert policy_layer.compute_dtype == "float64"
    if name == "Recompute":
        x64 = tf.cast(x, tf.float64)
        assert _first(policy_layer(x64)).dtype == policy_layer.layer.compute_dtype == "float32"
    elif name != "Embedding":
        x64 = tf.nest.map_structure(lambda t: tf.cast(t, tf.float64), x)
        assert _first(policy_layer(x64)).dtype == tf.float64
    else:
        assert _first(policy_layer(x)).dtype == tf.float64

    # Masking: a selective layer supports it exactly when the Keras layer it stands for does.
    keras_base = next((c for c in type(layer).__mro__[1:] if c.__module__.startswith("keras.")), None)
    if type(layer).__module__.startswith("memgrad._src.selective") and keras_base is not None:
        assert layer.supports_masking == keras_base(**_base_arguments(layer)).supports_masking


def _base_arguments(layer):
    config = dict(layer.get_config())
    config.pop("name", None)
    config.pop("trainable", None)
    return config
