"""The dtype a reversible stack computes in: its networks' own layers', and non-float inputs."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad._src.reversible.base import network_dtype
from memgrad.layers import AdditiveCoupling, AffineCoupling, ReversibleSequence

HALF = 4
DEPTH = 3


def _wrapped_dense(seed, activation, dtype="float64"):
    """A Dense layer of ``dtype`` inside a dtype-less Sequential (which reports float32)."""
    return keras.Sequential([keras.layers.Dense(
        HALF, activation=activation, dtype=dtype,
        kernel_initializer=keras.initializers.RandomNormal(stddev=0.4, seed=seed),
        bias_initializer=keras.initializers.RandomNormal(stddev=0.2, seed=seed + 1000))])


def _blocks(kind):
    if kind == "additive":
        return [AdditiveCoupling(_wrapped_dense(10 * i, "tanh"), _wrapped_dense(10 * i + 1, "tanh"))
                for i in range(DEPTH)]
    return [AffineCoupling(_wrapped_dense(10 * i, "tanh"), _wrapped_dense(10 * i + 1, None))
            for i in range(DEPTH)]


def _dense_params(network):
    dense = network.layers[0]
    return dense.kernel, dense.bias


def _equations(kind, blocks, x):
    """The RevNet / RealNVP equations written out in float64, without memgrad."""
    h = x
    for block in blocks:
        x1, x2 = h[:, :HALF], h[:, HALF:]
        wf, bf = _dense_params(block.f)
        wg, bg = _dense_params(block.g)
        if kind == "additive":
            y1 = x1 + tf.tanh(x2 @ wf + bf)
            y2 = x2 + tf.tanh(y1 @ wg + bg)
        else:
            y1 = x1
            y2 = x2 * tf.exp(tf.tanh(x1 @ wf + bf)) + (x1 @ wg + bg)
        h = tf.concat([y1, y2], axis=-1)
    return h


def _container(kind, name):
    stack = ReversibleSequence(_blocks(kind))
    if name == "sequential":
        model = keras.Sequential([keras.Input((2 * HALF,), dtype="float64"), stack])
    else:
        inputs = keras.Input((2 * HALF,), dtype="float64")
        model = keras.Model(inputs, keras.layers.Activation("linear", dtype="float64")(stack(inputs)))
    return model, stack


def _relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


@pytest.mark.parametrize("kind", ["additive", "affine"])
@pytest.mark.parametrize("container", ["sequential", "functional"])
def test_float64_networks_in_dtype_less_containers_are_exact(kind, container):
    model, stack = _container(kind, container)
    assert model.compute_dtype == "float32"  # the containers have no dtype
    assert stack.compute_dtype == "float64"  # the stack follows its networks
    x = tf.constant(np.random.RandomState(1).randn(6, 2 * HALF), tf.float64)
    with tf.GradientTape() as tape:
        y = model(x, training=True)
        loss = tf.reduce_sum(tf.sin(y) * y)
    grads = tape.gradient(loss, model.trainable_variables)
    with tf.GradientTape() as tape:
        y_exact = _equations(kind, stack.blocks, x)
        loss_exact = tf.reduce_sum(tf.sin(y_exact) * y_exact)
    exact_grads = tape.gradient(loss_exact, model.trainable_variables)
    assert y.dtype == tf.float64
    assert _relative(y, y_exact) <= 1e-12
    assert len(grads) == 4 * DEPTH
    for grad, exact in zip(grads, exact_grads):
        assert grad is not None and grad.dtype == tf.float64
        assert _relative(grad, exact) <= 1e-12


def test_float64_networks_inside_an_explicit_float64_stack_are_exact():
    blocks = _blocks("additive")
    stack = ReversibleSequence(blocks, dtype="float64")
    x = tf.constant(np.random.RandomState(2).randn(5, 2 * HALF), tf.float64)
    with tf.GradientTape() as tape:
        y = stack(x)
    grads = tape.gradient(y, stack.trainable_variables, output_gradients=tf.cos(y))
    with tf.GradientTape() as tape:
        y_exact = _equations("additive", blocks, x)
    exact_grads = tape.gradient(y_exact, stack.trainable_variables, output_gradients=tf.cos(y_exact))
    assert _relative(y, y_exact) <= 1e-12
    for grad, exact in zip(grads, exact_grads):
        assert _relative(grad, exact) <= 1e-12


def test_network_dtype_reads_the_layers_inside():
    assert network_dtype(_wrapped_dense(0, "tanh")) == "float64"  # unbuilt: its explicit policy
    built = _wrapped_dense(0, "tanh")
    built.build((None, HALF))
    assert built.compute_dtype == "float32" and network_dtype(built) == "float64"
    mixed = keras.Sequential([keras.layers.Dense(2, dtype="float16"), keras.layers.Dense(2, dtype="bfloat16")])
    mixed.build((None, 2))
    assert network_dtype(mixed) == "float32"
    plain = keras.Sequential([keras.layers.Dense(2), keras.layers.Dense(2, dtype="float64")])
    plain.build((None, 2))
    assert network_dtype(plain) == "float64"  # the widest: a narrower first layer casts down itself
    assert network_dtype(keras.layers.Activation("tanh")) == "float32"  # no weights: its own


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_keeps_float32_invertible_arithmetic(policy):
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(policy)
    try:
        block = AdditiveCoupling(keras.Sequential([keras.layers.Dense(HALF, activation="tanh")]),
                                 keras.Sequential([keras.layers.Dense(HALF, activation="tanh")]))
        stack = ReversibleSequence([block])
        x = tf.random.stateless_normal([3, 2 * HALF], seed=[1, 2])
        y = stack(x)
    finally:
        keras.config.set_dtype_policy(previous)
    compute = keras.dtype_policies.get(policy).compute_dtype
    assert stack.compute_dtype == compute
    assert stack.invertible_dtype == "float32"
    assert network_dtype(block.f) == compute
    assert y.dtype == tf.as_dtype(compute)


def _int_stack():
    return ReversibleSequence([AdditiveCoupling(
        keras.layers.Dense(HALF, kernel_initializer=keras.initializers.RandomNormal(seed=1)),
        keras.layers.Dense(HALF, kernel_initializer=keras.initializers.RandomNormal(seed=2)))])


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64, tf.uint8, tf.bool])
def test_integer_and_bool_inputs_are_cast_like_keras_layers(dtype):
    stack = _int_stack()
    values = np.arange(16).reshape(2, 8) % (2 if dtype == tf.bool else 7)
    x = tf.cast(tf.constant(values), dtype)
    as_float = tf.cast(x, tf.float32)
    with tf.GradientTape() as tape:
        y = stack(x)
        loss = tf.reduce_sum(y * y)
    grads = tape.gradient(loss, stack.trainable_variables)
    with tf.GradientTape() as tape:
        y_float = stack(as_float)
        loss_float = tf.reduce_sum(y_float * y_float)
    float_grads = tape.gradient(loss_float, stack.trainable_variables)
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), y_float.numpy())  # not truncated to integers
    assert not np.array_equal(y.numpy(), np.round(y.numpy()))
    assert len(grads) == 4
    for grad, expected in zip(grads, float_grads):
        assert grad is not None
        np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(stack.inverse(tf.cast(tf.round(y), tf.int32)).numpy(),
                               stack.inverse(tf.round(y)).numpy())


def test_integer_inputs_in_a_functional_model():
    stack = _int_stack()
    inputs = keras.Input((8,), dtype="int32")
    model = keras.Model(inputs, stack(inputs))
    y = model(tf.ones([2, 8], tf.int32))
    assert y.dtype == tf.float32
    np.testing.assert_array_equal(y.numpy(), stack(tf.ones([2, 8])).numpy())


@pytest.mark.parametrize("value, name", [
    (tf.fill([2, 8], "a"), "string"),
    (tf.complex(tf.ones([2, 8]), tf.ones([2, 8])), "complex64"),
])
def test_string_and_complex_inputs_are_refused(value, name):
    stack = _int_stack()
    with pytest.raises(TypeError, match=f"floating dtype.*Received: inputs of dtype {name}"):
        stack(value)
    with pytest.raises(TypeError, match=f"Received: outputs of dtype {name}"):
        stack.inverse(value)


def test_symbolic_string_input_is_refused():
    with pytest.raises(TypeError, match="Received: inputs of dtype string"):
        _int_stack()(keras.Input((8,), dtype="string"))
