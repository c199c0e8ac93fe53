"""The zoo's memory-saving gradients equal plain autodiff of the same forward computation."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import ReversibleSequence
from memgrad_zoo import densenet, revnet
from memgrad_zoo.glow import Glow


def loss_and_gradients(model, loss_fn, graph):
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(model)
        return loss, tape.gradient(loss, model.trainable_variables)

    return (tf.function(step) if graph else step)()


def assert_close(grads, reference, tolerance):
    assert len(grads) == len(reference)
    for grad, expected in zip(grads, reference):
        assert grad is not None
        scale = float(tf.reduce_max(tf.abs(expected))) + 1e-6
        assert float(tf.reduce_max(tf.abs(grad - expected))) <= tolerance * scale


def classification_loss(x, y):
    def loss(model):
        logits = model(x, training=True)
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))

    return loss


@pytest.fixture
def plain_reversible_sequences(monkeypatch):
    """Runs every ReversibleSequence's blocks under plain autodiff (the reference)."""

    def plain_run(self, x, training):
        logdet = tf.zeros(tf.shape(x)[:1], x.dtype)
        for block in self.blocks:
            x, block_logdet = block.forward(x, training=training)
            logdet = logdet + block_logdet
        return x, logdet

    return lambda: monkeypatch.setattr(ReversibleSequence, "_run", plain_run)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True])
def test_revnet_gradients_equal_plain_autodiff(plain_reversible_sequences, graph):
    keras.utils.set_random_seed(1)
    model = revnet.revnet(26, input_shape=(8, 8, 1))
    loss = classification_loss(tf.random.normal([6, 8, 8, 1]), tf.constant([0, 1, 2, 3, 4, 5]))
    value, grads = loss_and_gradients(model, loss, graph)
    plain_reversible_sequences()
    expected_value, expected = loss_and_gradients(model, loss, graph)
    assert abs(float(value) - float(expected_value)) <= 1e-5
    assert_close(grads, expected, 1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True])
def test_efficient_densenet_gradients_equal_the_plain_model(graph):
    efficient = densenet.densenet_bc(16, 6, efficient=True, input_shape=(8, 8, 1))
    plain = densenet.densenet_bc(16, 6, efficient=False, input_shape=(8, 8, 1))
    plain.set_weights(efficient.get_weights())
    loss = classification_loss(tf.random.normal([4, 8, 8, 1]), tf.constant([1, 2, 3, 4]))
    value, grads = loss_and_gradients(efficient, loss, graph)
    expected_value, expected = loss_and_gradients(plain, loss, graph)
    assert abs(float(value) - float(expected_value)) <= 1e-5
    assert_close(grads, expected, 1e-4)


@pytest.mark.slow
def test_efficient_densenet_updates_batchnorm_statistics_once_per_step():
    efficient = densenet.densenet_bc(16, 6, efficient=True, input_shape=(8, 8, 1))
    plain = densenet.densenet_bc(16, 6, efficient=False, input_shape=(8, 8, 1))
    plain.set_weights(efficient.get_weights())
    x, y = np.random.default_rng(0).normal(size=(8, 8, 8, 1)).astype("float32"), np.arange(8) % 3
    for model in (efficient, plain):
        model.compile(keras.optimizers.SGD(0.0), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    bottleneck = efficient.get_layer("block1_layer1_bottleneck").norm
    # One update from zero: moving_mean = (1 - momentum) * batch mean of the stem's output.
    stem = keras.Model(efficient.inputs, efficient.get_layer("stem").output)
    batch_mean = np.mean(stem(x).numpy(), axis=(0, 1, 2))
    np.testing.assert_allclose(bottleneck.moving_mean.numpy(), 0.01 * batch_mean, rtol=1e-4, atol=1e-7)
    for a, b in zip(efficient.non_trainable_variables, plain.non_trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("graph", [False, True])
def test_glow_gradients_equal_plain_backprop_of_the_same_weights(graph):
    images = tf.random.stateless_uniform([8, 8, 8, 1], seed=[3, 4])
    reversible = Glow((8, 8, 1), levels=2, steps=3, hidden=16, reversible=True, seed=5)
    plain = Glow((8, 8, 1), levels=2, steps=3, hidden=16, reversible=False, seed=5)
    reversible.build()
    plain.build()
    reversible(images)  # ActNorm's data-dependent initialisation
    plain.set_weights(reversible.get_weights())
    u = reversible.dequantize(images)

    def loss_of(model):
        return lambda m: -tf.reduce_mean(m.encode(u, training=True)[1])

    value, grads = loss_and_gradients(reversible, loss_of(reversible), graph)
    expected_value, expected = loss_and_gradients(plain, loss_of(plain), graph)
    assert abs(float(value) - float(expected_value)) <= 1e-4 * abs(float(expected_value))
    assert_close(grads, expected, 1e-3)
