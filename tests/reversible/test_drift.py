"""Reversible gradients that match plain autodiff at depth, in float32 and float16,
and a drift monitor that reports per-block reconstruction error and warns.

Every gradient here is compared with plain autodiff (tf.GradientTape) of the same blocks'
forward computation, carried in the same dtype (`plain_forward(..., dtype=...)`), as the
global relative error ``||g_rev - g_plain|| / ||g_plain||`` over the input's and every
weight's gradient. Eager, batch 2, 8x8x8 features, 3x3 convolutions: a few seconds each.
"""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from memgrad.layers import (
    AdditiveCoupling,
    DriftMonitor,
    DriftWarning,
    ReversibleSequence,
)
from tests.reversible.stacks import dense, gradients, make_blocks, plain_forward

IMAGE = (8, 8, 8)


def global_relative_error(got, want):
    g = np.concatenate([np.ravel(t) for t in got]).astype(np.float64)
    w = np.concatenate([np.ravel(t) for t in want]).astype(np.float64)
    return float(np.linalg.norm(g - w) / np.linalg.norm(w))


def _errors_against_plain_autodiff(stack, x):
    stack(x)  # builds; ActNorm initialises from this batch
    # These blocks draw no random numbers. The replay check (tests/reversible/test_randomness.py)
    # would trace all of them once more: 2-3 s of the suite's time at 64 blocks.
    stack._replay_checked.add(None)
    variables = stack.trainable_variables
    got = gradients(stack, x, variables)
    want = gradients(lambda t: plain_forward(stack.blocks, t, dtype=stack.invertible_dtype), x, variables)
    assert all(g is not None for g in got) and len(got) == 1 + len(variables)
    assert all(np.any(w.numpy() != 0) for w in want), "every gradient is non-trivial"
    return global_relative_error([g.numpy() for g in got], [w.numpy() for w in want])


def _worst_tensor_error(got, want):
    return max(float(np.linalg.norm(g.numpy().astype(np.float64) - w.numpy())
                     / np.linalg.norm(w.numpy().astype(np.float64))) for g, w in zip(got, want))


def test_64_additive_conv_blocks_match_plain_autodiff_in_float32():
    """Carried in float32 these measured 7.7e-5 (worst tensor 1.7e-4; scripts/drift_table.py).
    With the default float64 activations and float32 gradients between blocks: 4.1e-7, worst
    tensor 1.0e-6 (bit-identical when the gradients were carried in float64 too). Asserted:
    the goals, 1e-5 and 1e-4 per tensor."""
    x = tf.random.stateless_normal((2,) + IMAGE, seed=[5, 6])
    stack = ReversibleSequence(make_blocks("conv_additive", 64, IMAGE[-1]), return_logdet=True)
    assert stack.compute_dtype == "float32" and stack.invertible_dtype == "float64"
    assert _errors_against_plain_autodiff(stack, x) <= 1e-5
    variables = stack.trainable_variables
    got = gradients(stack, x, variables)
    want = gradients(lambda t: plain_forward(stack.blocks, t, dtype=stack.invertible_dtype), x, variables)
    assert _worst_tensor_error(got, want) <= 1e-4


@pytest.mark.parametrize("invertible_dtype, bound", [("auto", 1e-4), ("float32", None)])
def test_16_affine_flow_steps_match_plain_autodiff_in_float32(invertible_dtype, bound):
    """Glow steps (ActNorm, 1x1 convolution, exp-scale affine coupling). Carried in float32 the
    same stack is >1e-4 off (measured 2.1e-3): the bound is not met by accident."""
    x = tf.random.stateless_normal((2,) + IMAGE, seed=[5, 6])
    stack = ReversibleSequence(make_blocks("image_flow", 16, IMAGE[-1]), return_logdet=True,
                               invertible_dtype=invertible_dtype)
    error = _errors_against_plain_autodiff(stack, x)
    if bound is None:
        assert error > 1e-4
    else:
        assert error <= bound


def _loss_gradients(forward, x, variables):
    """Gradients of a float32 loss of a (possibly float16) output, cast to float32."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y, logdet = forward(x)
        y, logdet = tf.cast(y, tf.float32), tf.cast(logdet, tf.float32)
        weights = tf.cast(tf.reshape(tf.range(tf.size(y[0])) % 7, y.shape[1:]), tf.float32) / 7.0
        loss = tf.reduce_sum(tf.sin(y) * weights) + 0.3 * tf.reduce_sum(logdet)
    return [tf.cast(g, tf.float32).numpy() for g in tape.gradient(loss, [x] + list(variables))]


def test_mixed_float16_reversible_gradients_no_worse_than_plain_float16():
    """Measured against the float32 network with the same weights: reversible 7.3e-3, plain
    autodiff of the float16 network 9.2e-3 (float16 reversible arithmetic: 1.35e-2)."""
    x = tf.random.stateless_normal((2,) + IMAGE, seed=[5, 6])
    reference = ReversibleSequence(make_blocks("conv_additive", 16, IMAGE[-1]), return_logdet=True)
    half = ReversibleSequence(make_blocks("conv_additive", 16, IMAGE[-1], dtype="mixed_float16"),
                              return_logdet=True, dtype="mixed_float16")
    reference(x), half(x)
    reference._replay_checked.add(None), half._replay_checked.add(None)  # no randomness: skip the trace
    assert half.compute_dtype == "float16" and half.invertible_dtype == "float32"
    for a, b in zip(reference.trainable_variables, half.trainable_variables):  # same seeded weights
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    want = _loss_gradients(reference, x, reference.trainable_variables)
    variables = half.trainable_variables
    reversible = global_relative_error(_loss_gradients(half, x, variables), want)
    plain_half = global_relative_error(
        _loss_gradients(lambda t: plain_forward(half.blocks, t, dtype="float16"), x, variables), want)
    plain_same = global_relative_error(
        _loss_gradients(lambda t: plain_forward(half.blocks, t, dtype="float32"), x, variables), want)
    assert 1e-4 < reversible <= plain_half  # float16 networks are ~1e-2 off, and no worse reversed
    assert reversible <= 1.05 * plain_same  # reversing adds nothing to the same network's error


class _RecordingCoupling(AdditiveCoupling):
    """Records the dtype its invertible arithmetic sees."""

    seen = []

    def forward(self, x, training=None):
        self.seen.append(x.dtype.name)
        return super().forward(x, training)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_low_precision_policies_keep_float32_invertible_arithmetic(policy):
    _RecordingCoupling.seen = []
    f, g = keras.layers.Dense(4, dtype=policy), keras.layers.Dense(4, dtype=policy)
    stack = ReversibleSequence([_RecordingCoupling(f, g, dtype=policy)], dtype=policy)
    x = tf.random.stateless_normal([2, 8], seed=[1, 2])
    y = stack(x)
    assert stack.invertible_dtype == "float32"
    assert _RecordingCoupling.seen == ["float32"]
    assert y.dtype == stack.compute_dtype  # the stack's ends follow the policy
    assert f.compute_dtype == policy.split("_")[1]  # the networks keep computing in low precision


def _monitored_step(stack, x):
    with tf.GradientTape() as tape:
        tape.watch(x)
        loss = tf.reduce_sum(tf.sin(stack(x)[0]))
    return tape.gradient(loss, x)


def test_monitor_reports_per_block_drift_close_to_the_exact_drift():
    """Float32 carry, 4 Glow steps: the projection estimate against the drift of each block's
    input rebuilt by inverting the blocks one by one from the output (as the backward does)."""
    x = tf.random.stateless_normal((2,) + IMAGE, seed=[5, 6])
    monitor = DriftMonitor(every=1, projections=16, tolerance=1.0)
    stack = ReversibleSequence(make_blocks("image_flow", 4, IMAGE[-1]), return_logdet=True,
                               invertible_dtype="float32", drift_monitor=monitor)
    stack(x)
    stack._replay_checked.add(None)  # no randomness: skip the replay check's trace
    _monitored_step(stack, x)
    inputs, h = [], x
    for block in stack.blocks:
        inputs.append(h)
        h, _ = block.forward(h)
    exact = []
    for block, original in zip(reversed(stack.blocks), reversed(inputs)):
        h = block.inverse(h)
        exact.insert(0, float(tf.norm(h - original) / tf.norm(original)))
    exact = np.array(exact)
    assert monitor.errors.shape == (len(stack.blocks),) and monitor.checks == 1
    assert np.all(exact > 0)
    # Per example the estimate is a chi statistic of 16 projections (within 2x here); the
    # monitor takes the largest over the batch of 2.
    np.testing.assert_array_less(monitor.errors, 2.5 * exact)
    np.testing.assert_array_less(exact / 2.5, monitor.errors)
    assert not monitor.nonfinite.any()


def test_monitor_warns_on_drift_above_tolerance_and_not_below():
    x = tf.random.stateless_normal([4, 16], seed=[3, 4])
    strict = DriftMonitor(every=1, tolerance=1e-12)
    stack = ReversibleSequence(make_blocks("affine", 4, 16), invertible_dtype="float32", return_logdet=True,
                               drift_monitor=strict)
    with pytest.warns(DriftWarning, match=r"rebuilt block \d's input with a relative drift of .* above "
                                          r"the tolerance 1e-12"):
        _monitored_step(stack, x)
    assert np.all(strict.errors > 1e-12) and strict.errors[-1] < strict.errors[0] * 10

    default = DriftMonitor(every=1)  # float64 carry: tolerance 1e-5, drift ~1e-15
    stack = ReversibleSequence(make_blocks("affine", 4, 16), return_logdet=True, drift_monitor=default)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _monitored_step(stack, x)
    assert default.tolerance_for(stack.invertible_dtype) == 1e-5
    assert np.all(default.errors < 1e-10)


def test_monitor_flags_nan_and_checks_every_nth_step():
    monitor = DriftMonitor(every=3)
    stack = ReversibleSequence(make_blocks("additive", 3, 8), return_logdet=True, drift_monitor=monitor)
    x = tf.random.stateless_normal([2, 8], seed=[1, 1])
    x_nan = tf.tensor_scatter_nd_update(x, [[0, 0]], [float("nan")])
    with pytest.warns(DriftWarning, match=r"NaN or inf activations or gradients at blocks \[0, 1, 2\]"):
        _monitored_step(stack, x_nan)  # step 0: checked
    assert monitor.nonfinite.all()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _monitored_step(stack, x_nan)  # steps 1 and 2: not checked
        _monitored_step(stack, x_nan)
    assert monitor.checks == 1
    _monitored_step(stack, x)  # step 3: checked, finite
    assert monitor.checks == 2 and not monitor.nonfinite.any()
    stack(x_nan)  # no tape: not a training step, not counted
    assert monitor._calls == 4


def test_monitor_inside_tf_function_records_and_prints(capfd):
    monitor = DriftMonitor(every=1, tolerance=1e-12)
    stack = ReversibleSequence(make_blocks("affine", 2, 8), invertible_dtype="float32", return_logdet=True,
                               drift_monitor=monitor)
    x = tf.random.stateless_normal([2, 8], seed=[2, 2])
    step = tf.function(_monitored_step)
    step(stack, x)
    assert monitor.checks == 1 and monitor.errors.shape == (2,) and np.all(monitor.errors > 0)
    assert "relative drift above 1e-12" in capfd.readouterr().err
    step(stack, tf.tensor_scatter_nd_update(x, [[0, 0]], [float("nan")]))
    assert monitor.checks == 2 and monitor.nonfinite.all()
    assert "NaN or inf" in capfd.readouterr().err


def test_a_built_monitored_stack_is_traced_once_by_a_tf_function():
    """The monitor's variables exist once the stack is built: a first call that created them
    would make TensorFlow trace the step twice."""
    monitor = DriftMonitor(every=1)
    stack = ReversibleSequence(make_blocks("affine", 2, 8), return_logdet=True, drift_monitor=monitor)
    stack.build((None, 8))
    traces = []

    @tf.function
    def step(x):
        traces.append(x.shape)
        return _monitored_step(stack, x)

    x = tf.random.stateless_normal([2, 8], seed=[3, 3])
    step(x)
    step(x)
    assert len(traces) == 1
    assert monitor.checks == 2 and monitor.errors.shape == (2,)


def test_monitor_counts_steps_and_checks_under_a_mirrored_strategy(mirrored_strategy):
    """Built in a strategy's scope, the stack leaves the monitor's variables to its first
    traced step (mirrored): two replicas still count each step once."""
    monitor = DriftMonitor(every=2)
    with mirrored_strategy.scope():
        stack = ReversibleSequence(make_blocks("affine", 2, 8), return_logdet=True, drift_monitor=monitor)
        stack.build((None, 8))

    @tf.function
    def step(x):
        return mirrored_strategy.run(lambda xb: _monitored_step(stack, xb), args=(x,))

    batches = tf.data.Dataset.from_tensors(tf.random.stateless_normal([4, 8], seed=[4, 4])).repeat(4)
    for x in mirrored_strategy.experimental_distribute_dataset(batches):
        step(x)
    assert monitor.checks == 2  # steps 0 and 2 of 4
    assert monitor.errors.shape == (2,) and np.all(np.isfinite(monitor.errors))


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="every must be a positive int. Received: 0"):
        DriftMonitor(every=0)
    with pytest.raises(ValueError, match="tolerance must be a positive number"):
        DriftMonitor(tolerance=-1.0)
    with pytest.raises(ValueError, match="invertible_dtype must be 'auto' or a floating dtype.*int32"):
        ReversibleSequence(make_blocks("additive", 1, 8), invertible_dtype="int32")
    with pytest.raises(ValueError, match="drift_monitor must be"):
        ReversibleSequence(make_blocks("additive", 1, 8), drift_monitor=5)
    monitor = DriftMonitor()
    ReversibleSequence(make_blocks("additive", 1, 8), drift_monitor=monitor)
    with pytest.raises(ValueError, match="A DriftMonitor watches one ReversibleSequence"):
        ReversibleSequence(make_blocks("additive", 1, 8), drift_monitor=monitor)

    class Doubling(AdditiveCoupling):  # a custom block that does not declare wider inputs
        accepts_invertible_dtype = False

    blocks = [Doubling(dense(4, 1), dense(4, 2))]
    assert ReversibleSequence(blocks).invertible_dtype == "float32"  # auto keeps the compute dtype
    with pytest.raises(ValueError, match="does not accept inputs of another dtype"):
        ReversibleSequence(blocks, invertible_dtype="float64")


def test_config_round_trip_keeps_invertible_dtype_and_monitor():
    stack = ReversibleSequence(make_blocks("additive", 2, 8), invertible_dtype="float32",
                               drift_monitor=DriftMonitor(every=7, tolerance=1e-4, projections=2, seed=3))
    loaded = ReversibleSequence.from_config(stack.get_config())
    assert loaded.invertible_dtype == "float32"
    assert loaded.drift_monitor.get_config() == {"every": 7, "tolerance": 1e-4, "projections": 2, "seed": 3}
    assert ReversibleSequence.from_config(
        ReversibleSequence(make_blocks("additive", 2, 8)).get_config()).invertible_dtype == "float64"


def test_monitored_stack_under_a_batch_jacobian():
    """A Jacobian traces the gradient (pfor) after an eager, checked forward pass: the monitor
    records nothing then rather than break the Jacobian (pfor cannot vectorise its updates)."""
    monitor = DriftMonitor(every=1)
    stack = ReversibleSequence(make_blocks("additive", 2, 4), drift_monitor=monitor)
    x = tf.random.stateless_normal([3, 4], seed=[1, 2])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = stack(x)
    jacobian = tape.batch_jacobian(y, x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y_plain = plain_forward(stack.blocks, x, dtype=stack.invertible_dtype)[0]
    np.testing.assert_allclose(jacobian, tape.batch_jacobian(y_plain, x), rtol=1e-6, atol=1e-7)
    assert monitor.checks == 0
