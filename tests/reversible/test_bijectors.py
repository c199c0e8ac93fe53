"""tfp bijectors in a stack: training-mode BatchNormalization, float64 flows, Keras networks."""

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from memgrad.layers import AdditiveCoupling, ReversibleSequence
from tests.reversible.stacks import dense, gradients, max_relative_error

tfb = tfp.bijectors


def _tfp_forward(parts):
    """Plain autodiff reference: each part run by its own forward (tfp's for bijectors), not by a block."""
    def forward(x):
        # A fresh tensor: tfp caches results by input tensor, and a result cached by an earlier
        # call outside the tape (stack(x) on the same x) would carry no gradient.
        h, logdet = tf.identity(x), tf.zeros(tf.shape(x)[:1], x.dtype)
        for part in parts:
            if isinstance(part, tfb.Bijector):
                logdet += part.forward_log_det_jacobian(h, event_ndims=h.shape.rank - 1)
                h = part.forward(h)
            else:
                h, part_logdet = part.forward(h)
                logdet += part_logdet
        return h, logdet
    return forward


@pytest.mark.slow
@pytest.mark.parametrize("direction", ["normalising", "denormalising"])
def test_training_batchnorm_bijector_matches_autodiff_and_updates_once(direction):
    # Before: 416% (Invert: the inverse de-normalised with moving statistics, the moving
    # statistics were updated twice) and 143% (the inverse normalised with batch statistics).
    batchnorm = tfb.BatchNormalization(training=True)
    bijector = tfb.Invert(batchnorm) if direction == "normalising" else batchnorm
    # Keeps the bijector off the stack's last block, whose output is tfp's cache key.
    parts = [AdditiveCoupling(dense(4, 1), dense(4, 2)), bijector, AdditiveCoupling(dense(4, 3), dense(4, 4))]
    stack = ReversibleSequence(parts, return_logdet=True)
    x = tf.random.stateless_normal([16, 8], seed=[1, 2]) * 2.0 + 1.0
    stack(x)  # builds every layer (and moves the statistics once)
    layer = batchnorm.batchnorm
    statistics = [layer.moving_mean, layer.moving_variance]
    before = [v.numpy() for v in statistics]
    variables = stack.trainable_variables + list(bijector.trainable_variables)
    assert len(bijector.trainable_variables) == 2  # gamma and beta
    assert [id(v) for v in stack.blocks[1].all_trainable_variables] == [id(v) for v in bijector.trainable_variables]

    got = gradients(stack, x, variables)
    after_reversible = [v.numpy() for v in statistics]
    for v, value in zip(statistics, before):
        v.assign(value)
    want = gradients(_tfp_forward(parts), x, variables)
    after_plain = [v.numpy() for v in statistics]

    assert all(g is not None for g in got)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) <= 1e-5
    for a, b in zip(after_reversible, after_plain):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # one update, as plain autodiff
    moved = not np.allclose(after_plain[0], before[0])
    assert moved == (direction == "normalising")  # tfp's forward uses the moving statistics


def test_training_batchnorm_nested_in_another_bijector_is_refused():
    inner = tfb.Chain([tfb.Shift(1.0), tfb.Invert(tfb.BatchNormalization(name="hidden_bn"))])
    joint = tfb.Blockwise([inner, tfb.Identity()], block_sizes=[4, 4], name="blocks")
    with pytest.raises(ValueError, match=r"training mode.*training=False.*Received: BatchNormalization "
                                         r"'hidden_bn' inside .*Blockwise 'blocks'"):
        ReversibleSequence([joint])
    ReversibleSequence([tfb.Blockwise([tfb.Invert(tfb.BatchNormalization(training=False)), tfb.Identity()],
                                      block_sizes=[4, 4])])  # inference mode: consistent, accepted


def test_float64_bijectors_need_no_dtype():
    # Before: Keras cast the float64 input to the stack's default float32 and tfp raised.
    shift = tf.Variable(tf.linspace(tf.constant(-1.0, tf.float64), 1.0, 6))
    log_scale = tf.Variable(tf.fill([6], tf.constant(0.3, tf.float64)))
    parts = [tfb.Shift(shift), tfb.Scale(log_scale=log_scale), tfb.Invert(tfb.Softplus()), tfb.Shift(shift)]
    stack = ReversibleSequence(parts, return_logdet=True)
    assert stack.compute_dtype == "float64"
    x = tf.random.stateless_normal([5, 6], seed=[3, 4], dtype=tf.float64) + 3.0
    y, logdet = stack(x)
    assert y.dtype == tf.float64 and logdet.dtype == tf.float64
    got = gradients(stack, x, [shift, log_scale])
    want = gradients(_tfp_forward(parts), x, [shift, log_scale])
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) <= 1e-12


def test_bijector_dtype_mismatch_is_refused():
    float64_shift = tfb.Shift(tf.constant(1.0, tf.float64), name="shift64")
    with pytest.raises(ValueError, match=r"given dtype='float32'.*compute in float64.*Received: block 0 "
                                         r"\(BijectorBlock '.*'\) float64"):
        ReversibleSequence([float64_shift], dtype="float32")
    with pytest.raises(ValueError, match=r"different dtypes.*Received: block 0 .* float64, "
                                         r"block 1 .* float32"):
        ReversibleSequence([float64_shift, tfb.Shift(tf.constant(1.0, tf.float32))])


def _shift_and_log_scale_network(seed):
    return keras.Sequential([keras.Input((2,)), dense(8, seed), dense(8, seed + 1),
                             dense(4, seed + 2, None, stddev=0.1)])


@pytest.mark.slow
def test_realnvp_keras_network_is_tracked_and_gets_plain_gradients():
    # Before: 0 of the 12 variables in stack.trainable_variables (nor bijector.trainable_variables).
    first = _shift_and_log_scale_network(1)

    def first_fn(x, output_units):  # a function closing over the network
        h = first(x)
        return h[..., :output_units], h[..., output_units:]

    class SecondNetwork(keras.Model):  # tfp passes output_units positionally, which Keras's __call__ refuses
        def __init__(self):
            super().__init__()
            self.net = _shift_and_log_scale_network(5)

        def shift_and_log_scale(self, x, output_units):
            h = self.net(x)
            return h[..., :output_units], h[..., output_units:]

    parts = [tfb.RealNVP(num_masked=2, shift_and_log_scale_fn=first_fn), tfb.Permute([3, 2, 1, 0]),
             tfb.RealNVP(num_masked=2, shift_and_log_scale_fn=SecondNetwork().shift_and_log_scale)]
    stack = ReversibleSequence(parts, return_logdet=True)
    assert len(stack.trainable_variables) == 12
    assert len(stack.blocks[0].all_trainable_variables) == 6

    x = tf.random.stateless_normal([6, 4], seed=[5, 6])
    got = gradients(stack, x, stack.trainable_variables)
    want = gradients(_tfp_forward(parts), x, stack.trainable_variables)
    assert all(g is not None for g in got)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) <= 1e-5

    inputs = keras.Input((4,))
    model = keras.Model(inputs, stack(inputs)[0])
    model.compile(keras.optimizers.SGD(0.1), loss=lambda _, outputs: tf.reduce_mean(outputs**2))
    before = [v.numpy() for v in model.trainable_variables]
    assert len(before) == 12
    model.fit(x, tf.zeros([6, 4]), epochs=1, batch_size=6, verbose=0)
    assert all(not np.allclose(v.numpy(), b) for v, b in zip(model.trainable_variables, before))


@pytest.mark.parametrize("plain_backprop", [True, False], ids=["plain_backprop", "reversible"])
def test_bijector_called_twice_on_one_tensor_keeps_its_gradient(plain_backprop):
    # Before, with plain_backprop: tfp returned the log-det cached by the first call (no
    # gradient), 11.67 instead of 14.67 for this kernel.
    network = _shift_and_log_scale_network(7)

    def fn(x, output_units):
        h = network(x)
        return h[..., :output_units], h[..., output_units:]

    stack = ReversibleSequence([tfb.RealNVP(num_masked=2, shift_and_log_scale_fn=fn)], return_logdet=True,
                               plain_backprop=plain_backprop)
    x = tf.random.stateless_normal([6, 4], seed=[7, 8])
    stack(x)
    got = gradients(stack, x, stack.trainable_variables)
    want = gradients(stack, tf.identity(x), stack.trainable_variables)
    assert max_relative_error([g.numpy() for g in got], [w.numpy() for w in want]) <= 1e-6
