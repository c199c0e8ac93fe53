"""Bad input gets a clear ValueError naming the layer and what was received; drift warns."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import (
    AdditiveCoupling,
    AffineCoupling,
    ChannelPermutation,
    ReversibleSequence,
    Squeeze,
)
from tests.reversible.stacks import dense, make_blocks


def test_odd_channel_count():
    stack = ReversibleSequence([AdditiveCoupling(dense(3, 1), dense(3, 2), name="odd_block")])
    with pytest.raises(ValueError, match=r"AdditiveCoupling 'odd_block'.*even.*Received: input shape \(None, 7\)"):
        stack.build((None, 7))


def test_block_without_inverse():
    with pytest.raises(ValueError, match=r"Block 1 has no inverse. Received: Dense 'plain_dense'"):
        ReversibleSequence([AdditiveCoupling(dense(4, 1), dense(4, 2)), keras.layers.Dense(8, name="plain_dense")])
    with pytest.raises(ValueError, match="Block 0 has no inverse"):
        ReversibleSequence([lambda x: x])


def test_stride_inside_a_coupling():
    strided = keras.layers.Conv2D(2, 3, strides=2, padding="same", name="strided_conv")
    block = AdditiveCoupling(strided, keras.layers.Conv2D(2, 3, padding="same"), name="strided_block")
    with pytest.raises(ValueError, match=r"AdditiveCoupling 'strided_block'.*no stride.*Conv2D 'strided_conv' "
                                         r"maps \(None, 8, 8, 2\) to \(None, 4, 4, 2\)"):
        ReversibleSequence([block]).build((None, 8, 8, 4))


def test_channel_change_inside_a_coupling():
    block = AffineCoupling(dense(5, 1), dense(4, 2), name="wide_f")
    with pytest.raises(ValueError, match=r"AffineCoupling 'wide_f'.*Received: Dense.*maps \(None, 4\) to \(None, 5\)"):
        ReversibleSequence([block]).build((None, 8))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="AffineCoupling needs either both f"):
        AffineCoupling(f=dense(4, 1))
    with pytest.raises(ValueError, match="scale must be one of"):
        AffineCoupling(dense(4, 1), dense(4, 2), scale="softplus")
    with pytest.raises(ValueError, match="f must be a Keras layer"):
        AdditiveCoupling(lambda x: x, dense(4, 2))
    with pytest.raises(ValueError, match="needs at least one block"):
        ReversibleSequence([])
    with pytest.raises(ValueError, match="expects a list of blocks"):
        ReversibleSequence(AdditiveCoupling(dense(4, 1), dense(4, 2)))


def test_flow_layer_shape_errors():
    with pytest.raises(ValueError, match=r"Squeeze.*divisible by 2.*Received: input shape \(None, 5, 4, 3\)"):
        ReversibleSequence([Squeeze()]).build((None, 5, 4, 3))
    with pytest.raises(ValueError, match=r"Squeeze.*squeezes images"):
        ReversibleSequence([Squeeze()]).build((None, 12))
    with pytest.raises(ValueError, match=r"permutation of range\(4\)"):
        ReversibleSequence([ChannelPermutation([0, 1, 1, 3])]).build((None, 4))


def _drift_step(stack, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(stack(x)[0] ** 2)
    return tape.gradient(loss, x)


@pytest.mark.slow
def test_reconstruction_check_measures_drift_and_warns():
    x = tf.random.stateless_normal([8, 32], seed=[5, 6])
    # Carried in float32, 4 flow steps rebuild their input to ~2e-6 (the float64 default: ~1e-15).
    strict = ReversibleSequence(make_blocks("flow", 4, 32), return_logdet=True, check_reconstruction=True,
                                reconstruction_tolerance=1e-7, invertible_dtype="float32")
    with pytest.warns(UserWarning, match="rebuilt its input with a relative error above 1e-07"):
        _drift_step(strict, x)
    assert strict.last_reconstruction_error > 1e-7

    loose = ReversibleSequence(make_blocks("additive", 4, 32), return_logdet=True, check_reconstruction=True,
                               reconstruction_tolerance=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _drift_step(loose, x)
    assert 0.0 <= loose.last_reconstruction_error < 1e-5


@pytest.mark.slow
def test_reconstruction_check_in_a_graph_prints(capfd):
    x = tf.random.stateless_normal([8, 32], seed=[5, 6])
    strict = ReversibleSequence(make_blocks("flow", 4, 32), return_logdet=True, check_reconstruction=True,
                                reconstruction_tolerance=1e-7, invertible_dtype="float32")
    strict(x)
    gradient = tf.function(_drift_step)(strict, x)
    assert np.all(np.isfinite(gradient))
    assert "rebuilt its input with a relative error above" in capfd.readouterr().err


def _overflowing_stack():
    """An affine coupling whose scale exp(1000) overflows (even float64, the stack's invertible
    dtype): the rebuilt input is inf * 0 = NaN."""
    log_scale = keras.layers.Dense(4, kernel_initializer="zeros", bias_initializer=keras.initializers.Constant(1000.0))
    return ReversibleSequence([AffineCoupling(log_scale, dense(4, 2, None))], return_logdet=True,
                              check_reconstruction=True)


def test_reconstruction_check_warns_on_nan_drift():
    # A NaN error compares False with any tolerance, so it used to pass silently.
    stack = _overflowing_stack()
    with pytest.warns(UserWarning, match=r"rebuilt its input with a NaN or infinite error.*Measured: nan"):
        _drift_step(stack, tf.random.stateless_normal([4, 8], seed=[5, 6]))
    assert np.isnan(stack.last_reconstruction_error)


@pytest.mark.slow
def test_reconstruction_check_in_a_graph_prints_nan_drift(capfd):
    stack = _overflowing_stack()
    tf.function(_drift_step)(stack, tf.random.stateless_normal([4, 8], seed=[5, 6]))
    assert "rebuilt its input with a NaN or infinite error" in capfd.readouterr().err
