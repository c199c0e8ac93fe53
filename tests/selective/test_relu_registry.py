"""The masked ReLU keeps its per-output state in a registry, not on the EagerTensor."""

import gc

import numpy as np
import tensorflow as tf

from memgrad._src.selective import relu


def _relu_under_tape(x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = relu.masked_relu(x * 1.0)
        loss = tf.reduce_sum(y * y)
    return tape, y, loss


def test_masked_relu_state_lives_while_its_output_does():
    x = tf.constant(np.linspace(-2, 2, 16, dtype="float32").reshape(4, 4))
    before = len(relu._saved_for_output)
    tape, y, loss = _relu_under_tape(x)
    assert len(relu._saved_for_output) == before + 1
    assert not hasattr(y, "_memgrad_relu_saved")
    grad = tape.gradient(loss, x)
    np.testing.assert_allclose(grad.numpy(), (2 * tf.nn.relu(x)).numpy())
    del tape, y, loss
    gc.collect()
    assert len(relu._saved_for_output) == before


def test_sharing_the_output_drops_the_mask_and_the_entry():
    x = tf.constant(np.linspace(-2, 2, 16, dtype="float32").reshape(4, 4))
    before = len(relu._saved_for_output)
    tape, y, loss = _relu_under_tape(x)
    saved = relu._saved_for_output[id(y)]
    relu.share_kept_input(y)
    assert saved.mask is None and saved.output is y
    assert len(relu._saved_for_output) == before  # the registry no longer holds y
    grad = tape.gradient(loss, x)  # ReluGrad on the shared output: the same gradient
    np.testing.assert_allclose(grad.numpy(), (2 * tf.nn.relu(x)).numpy())
    relu.share_kept_input(tf.constant(1.0))  # a tensor no ReLU made: nothing to do
