"""Invertibility and log-determinants against brute force."""

import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import ActNorm, AffineCoupling, Invertible1x1Conv, Squeeze
from tests.reversible.stacks import built_stack, dense


@pytest.mark.parametrize("kind", ["additive", "affine", "affine_sigmoid_network", "flow"])
def test_inverse_of_forward_is_identity(kind):
    x = tf.random.stateless_normal([8, 16], seed=[1, 3])
    stack = built_stack(kind, 6, (16,))
    y, _ = stack(x)
    assert not np.allclose(y, x)
    np.testing.assert_allclose(stack.inverse(y), x, atol=1e-4)


def test_image_stack_with_squeeze_round_trip_and_shape():
    x = tf.random.stateless_normal([2, 8, 8, 4], seed=[2, 3])
    stack = built_stack("image", 4, (8, 8, 4))
    y, _ = stack(x)
    assert y.shape == (2, 4, 4, 16)
    np.testing.assert_allclose(stack.inverse(y), x, atol=1e-4)


def _brute_force_logdet(stack, x):
    """log|det J| per example from the full Jacobian of one example at a time."""
    logdets = []
    for i in range(x.shape[0]):
        xi = x[i:i + 1]
        with tf.GradientTape() as tape:
            tape.watch(xi)
            yi, _ = stack(xi)
            flat = tf.reshape(yi, [-1])
        jacobian = tf.reshape(tape.jacobian(flat, xi), [flat.shape[0], -1])
        logdets.append(tf.linalg.slogdet(jacobian)[1])
    return tf.stack(logdets)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["affine", "affine_sigmoid_network", "flow"])
def test_logdet_matches_brute_force_jacobian(kind):
    x = tf.random.stateless_normal([3, 6], seed=[4, 5], dtype=tf.float64)
    stack = built_stack(kind, 3, (6,), dtype="float64")
    _, logdet = stack(x)
    assert np.all(np.abs(logdet) > 1e-3)
    np.testing.assert_allclose(logdet, _brute_force_logdet(stack, x), rtol=1e-8, atol=1e-10)


@pytest.mark.slow
def test_image_flow_logdet_matches_brute_force_jacobian():
    from memgrad.layers import ReversibleSequence

    x = tf.random.stateless_normal([2, 4, 4, 2], seed=[6, 7], dtype=tf.float64)
    stack = ReversibleSequence([ActNorm(dtype="float64"), Invertible1x1Conv(seed=1, dtype="float64"),
                                AffineCoupling(dense(1, 1, dtype="float64"), dense(1, 2, None, dtype="float64"),
                                               scale="sigmoid", dtype="float64"),
                                Squeeze(dtype="float64")], return_logdet=True, dtype="float64")
    _, logdet = stack(x)
    np.testing.assert_allclose(logdet, _brute_force_logdet(stack, x), rtol=1e-8)


def test_actnorm_data_init_normalises_the_first_batch():
    x = tf.random.stateless_normal([64, 4, 4, 3], seed=[8, 9]) * 5.0 + 2.0
    norm = ActNorm()
    y = norm(x)
    np.testing.assert_allclose(tf.reduce_mean(y, axis=[0, 1, 2]), 0.0, atol=1e-4)
    np.testing.assert_allclose(tf.math.reduce_std(y, axis=[0, 1, 2]), 1.0, atol=1e-3)
    loc = norm.loc.numpy().copy()
    norm(x * 3.0)  # initialised once only
    np.testing.assert_array_equal(norm.loc.numpy(), loc)
